"""serving/vllm/cpu_fixes.py's expansion (no vLLM needed): each request's value spread over
its drafts, whatever the dtype (vLLM 0.32.0's CPU kernel left float outputs unwritten)."""

from __future__ import annotations

import torch

from sprinter_train.serving.vllm.cpu_fixes import expand


def by_loop(values: list, ends: list[int], replace_from, replace_to) -> list:
    out, start = [], 0
    for value, end in zip(values, ends, strict=True):
        out += [replace_to if value == replace_from else value] * (end - start)
        start = end
    return out


def test_float_values_are_spread_over_each_requests_drafts() -> None:
    temperature = torch.tensor([0.2, -1.0, 0.7, 1.3])  # -1: vLLM's greedy mark, read as 1
    ends = torch.tensor([3, 3, 7, 8], dtype=torch.int32)  # the second request drafted nothing
    output = torch.full((8,), float("nan"))
    expand(output, temperature, ends, -1.0, 1.0)
    assert (
        output.tolist()
        == torch.tensor(by_loop(temperature.tolist(), [3, 3, 7, 8], -1.0, 1.0)).tolist()
    )


def test_integer_values_go_to_the_integer_kernel_where_there_is_one() -> None:
    seen = []

    def kernel(*args) -> None:
        seen.append(args)

    ends = torch.tensor([2, 5])
    output = torch.zeros(5, dtype=torch.int64)
    expand(output, torch.tensor([4, 0]), ends, 0, 9, None, integer_kernel=kernel)
    assert len(seen) == 1 and output.tolist() == [0] * 5  # vLLM's own kernel did the work
    expand(output, torch.tensor([4, 0]), ends, 0, 9)
    assert output.tolist() == by_loop([4, 0], [2, 5], 0, 9)
