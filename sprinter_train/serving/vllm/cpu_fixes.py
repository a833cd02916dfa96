"""A fix to vLLM 0.32.0's CPU build that sampled speculative decoding needs to be lossless.

vLLM's rejection sampler spreads each request's temperature (and top-p, top-k) over its
drafts with `expand_batch_to_tokens`, a Triton kernel that the CPU build routes to a C++
one (`vllm.utils.cpu_triton_utils._expand_kernel_impl`). That routing casts the output to
int64 before the call (`_ensure_int64`): a float32 output is copied, the copy filled, and the
real output left as `new_empty` made it. The target's probabilities are then taken at
whatever temperature the uninitialised memory held, so drafts are accepted at the wrong rate
and the corrections drawn from the wrong law (the target drafting for itself, sampled, keeps
few of its drafts: docs/results/vllm.md; tests/serving/test_vllm_engine.py checks our
draft's acceptance in vLLM against the project's).

`install` routes float expansions to a plain torch implementation (integer ones keep
vLLM's kernel). Called by the plugin in every vLLM process; a no-op off the CPU build.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

KERNEL = "vllm.v1.sample.rejection_sampler.expand_kernel"


def expand(
    output: torch.Tensor,
    input_val: torch.Tensor,
    cu_num_tokens: torch.Tensor,
    replace_from: Any,
    replace_to: Any,
    MAX_NUM_TOKENS: Any = None,  # noqa: N803  (the kernel's own argument name)
    *,
    integer_kernel: Any = None,
) -> None:
    """output[t] = input_val[request of draft t] (replace_from read as replace_to), the
    requests' drafts ending at `cu_num_tokens`."""
    if integer_kernel is not None and output.dtype == input_val.dtype == torch.int64:
        integer_kernel(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS)
        return
    ends = cu_num_tokens.to(torch.long)
    if ends.numel() == 0:
        return
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    values = torch.where(
        input_val == replace_from, torch.as_tensor(replace_to, dtype=input_val.dtype), input_val
    )
    total = int(ends[-1])
    output[:total] = values.repeat_interleave(counts, output_size=total).to(output.dtype)


@functools.cache
def install() -> bool:
    """Route vLLM's CPU expand kernel through `expand`; whether it was routed."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    from vllm.utils import cpu_triton_utils

    original = cpu_triton_utils._expand_kernel_impl
    fixed = functools.wraps(original)(functools.partial(expand, integer_kernel=original))
    cpu_triton_utils._expand_kernel_impl = fixed  # where the platform registers it later
    from vllm.v1.sample import rejection_sampler

    registered = rejection_sampler.expand_kernel  # where the platform registered it already
    if getattr(registered, "_impl", None) is original:
        registered._impl = registered.func = fixed
    return True
