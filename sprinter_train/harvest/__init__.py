"""Harvest: per-token records (q, p, S, A, entropies, draft hidden state) for verifier training.

mixes.py assigns each prompt a SPRINTER prefix mix, continuations.py builds the sequences
(decoding/interleaved.py generates the interleaved mix, a few target rows sharing its call),
calibration.py measures the pair's acceptance the interleaved runs use (`auto`), records.py turns one teacher-forced forward per model into records, shards.py writes and
validates shards, manifest.py describes the record set, driver.py runs it under Lightning.
"""
