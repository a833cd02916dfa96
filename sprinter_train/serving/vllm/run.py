"""One vLLM method over the bench's prompts, in a process of its own (vLLM sets the process's
threads and memory binding for serving, which would change the bench's own timings).

    python -m sprinter_train.serving.vllm.run request.json result.json

`request.json` (written by bench/peers/vllm_peer.py): the target's folder, the draft's (null:
the target alone), the export folder of the predictor (null: a fixed number of drafts), the
drafts a round, dtype, the prompts as token ids, the budget, the sampling, the seed, the
batch sizes, how many runs of each group are timed after one untimed warm-up run. A batch of
B is B prompts handed to `generate` at once (vLLM decodes them together), each group timed on
its own, as the bench times its groups.

`result.json`: per batch size the tokens of each prompt (its first timed run) and its request
id there (a traced round names the engine's id, this id and a suffix), the seconds
and tokens of each timed run, and vLLM's speculative-decoding counters over the timed runs
(drafts, draft tokens, accepted tokens); the engine's start-up seconds; the versions.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

# the engine core in this process: the predictor's wrappers (proposer.py) then run where
# the draft does, and a test can read its trace
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
# GiB of KV cache where the caller's environment names none (VLLM_CPU_KVCACHE_SPACE; the
# bench sets it from bench.vllm.kv_cache_gib, "" for vLLM's own default): vLLM on a CPU
# takes most of the memory for its KV cache unless told, an out-of-memory kill beside a test
KV_CACHE_GIB = 2


def engine(request: dict[str, Any]):
    """vLLM's `LLM` for the request's method."""
    from vllm import LLM

    from sprinter_train.serving.vllm.plugin import PREDICTOR_ENV, register

    if request.get("predictor"):
        os.environ[PREDICTOR_ENV] = str(request["predictor"])
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(KV_CACHE_GIB))
    register()  # vLLM calls it too (the entry point); here it also works uninstalled
    speculative = None
    if request.get("draft"):
        speculative = {
            "method": "draft_model",
            "model": str(request["draft"]),
            "num_speculative_tokens": int(request["num_speculative_tokens"]),
            "draft_sample_method": "probabilistic",
        }
    return LLM(
        model=str(request["target"]),
        dtype=str(request.get("dtype", "float32")),
        enforce_eager=not bool(request.get("compile", False)),
        speculative_config=speculative,
        max_model_len=int(request["max_model_len"]),
        max_num_seqs=max(int(b) for b in request["batch_sizes"]),
        seed=int(request.get("seed", 0)),
        disable_log_stats=False,  # the speculative-decoding counters
    )


def sampling_params(request: dict[str, Any], index: int):
    """The bench's sampling (temperature 0: greedy), seeded per prompt."""
    from vllm import SamplingParams

    sampling = request["sampling"]
    temperature = float(sampling.get("temperature", 1.0))
    return SamplingParams(
        temperature=temperature,
        top_p=float(sampling.get("top_p", 1.0)) if temperature > 0 else 1.0,
        top_k=int(sampling.get("top_k", 0) or 0) if temperature > 0 else 0,
        max_tokens=int(request["max_new_tokens"]),
        seed=int(request.get("seed", 0)) + index if temperature > 0 else None,
        stop_token_ids=[int(t) for t in request.get("stop_token_ids", [])],
    )


def counters(llm) -> dict[str, float]:
    """vLLM's speculative-decoding counters so far (absent without a draft)."""
    found: dict[str, float] = {}
    for metric in llm.get_metrics():
        name = metric.name.removeprefix("vllm:spec_decode_")
        if metric.name.startswith("vllm:spec_decode_num_") and hasattr(metric, "value"):
            found[name] = float(metric.value)
    return found


def run(request: dict[str, Any]) -> dict[str, Any]:
    from vllm import TokensPrompt

    started = time.perf_counter()
    llm = engine(request)
    startup = time.perf_counter() - started
    prompts = [TokensPrompt(prompt_token_ids=list(map(int, p))) for p in request["prompts"]]
    params = [sampling_params(request, i) for i in range(len(prompts))]
    out: dict[str, Any] = {"startup_s": startup, "batches": {}}
    for size in request["batch_sizes"]:
        size = int(size)
        groups = [range(i, min(i + size, len(prompts))) for i in range(0, len(prompts), size)]
        llm.generate([prompts[i] for i in groups[0]], [params[i] for i in groups[0]],
                     use_tqdm=False)  # fmt: skip  # the warm-up
        before = counters(llm)
        tokens: list[list[int]] = [[] for _ in prompts]
        request_ids: list[str] = ["" for _ in prompts]
        seconds, made = [], []
        for repeat in range(int(request.get("runs", 1))):
            for group in groups:
                start = time.perf_counter()
                done = llm.generate(
                    [prompts[i] for i in group], [params[i] for i in group], use_tqdm=False
                )
                seconds.append(time.perf_counter() - start)
                made.append(sum(len(d.outputs[0].token_ids) for d in done))
                if repeat == 0:
                    for i, d in zip(group, done, strict=True):
                        tokens[i] = list(d.outputs[0].token_ids)
                        request_ids[i] = str(d.request_id)
        after = counters(llm)
        out["batches"][str(size)] = {
            "tokens": tokens,
            "request_ids": request_ids,
            "seconds": seconds,
            "generated": made,
            "spec_decode": {k: after[k] - before.get(k, 0.0) for k in after},
        }
    trace = _trace()
    if trace is not None:
        out["rounds"] = trace
    import torch
    import vllm

    out["versions"] = {"vllm": vllm.__version__, "torch": torch.__version__}
    out["threads"] = torch.get_num_threads()
    return out


def _trace() -> list[dict[str, Any]] | None:
    from sprinter_train.serving.vllm import proposer

    return None if proposer.PREDICTOR is None else proposer.PREDICTOR.trace


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    request = json.loads(Path(argv[0]).read_text())
    if request.get("trace") and request.get("predictor"):
        from sprinter_train.serving.vllm import plugin, proposer

        os.environ[plugin.PREDICTOR_ENV] = str(request["predictor"])
        proposer.install(str(request["predictor"])).trace = []
    result = run(request)
    Path(argv[1]).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
