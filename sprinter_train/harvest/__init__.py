"""Harvest: per-token records (q, p, S, A, entropies, draft hidden state) for verifier training.

mixes.py assigns each prompt a SPRINTER prefix mix, continuations.py builds the sequences
(decoding/shared_call.py lets a few target and interleaved rows share one engine call),
records.py turns one teacher-forced forward per model into records, shards.py writes and
validates shards, manifest.py describes the record set, driver.py runs it under Lightning.
"""
