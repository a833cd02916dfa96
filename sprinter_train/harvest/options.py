"""The harvest's settings as a run reads them: the options a shard's contents depend on (its
fingerprint), `auto` alpha resolved by measuring it, and the section's hand checks.

What each key holds alone (type, range) is declared in stages/schema.py (HARVEST) and checked
before the stage is dispatched; what stays here is what the declaration cannot say.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch

from sprinter_train.core.sampling import SamplingConfig
from sprinter_train.data.prompts import Prompt
from sprinter_train.harvest.calibration import accept_setting, measure_accept
from sprinter_train.harvest.continuations import RunLaw
from sprinter_train.models.roles import Roles


@dataclass(frozen=True)
class HarvestOptions:
    """The settings a shard's contents depend on (all of them go into the fingerprint)."""

    mix_weights: dict[str, float]
    continuation_tokens: int  # generated tokens per draft/target/interleaved prompt
    positions_per_prompt: int  # records per prompt at most (the original mix's region)
    gamma: int  # sd_interleaved's block size
    interleaved_accept: float | None  # P(a draft run goes on); None: auto, not measured yet
    interleaved_max_run: int  # drafts a round at most (the run goes on in the next round)
    hidden_layer: int
    seed: int
    split: str | None
    prompts_per_shard: int
    sampling: SamplingConfig

    @classmethod
    def from_cfg(cls, hcfg: dict[str, Any], sampling: SamplingConfig) -> HarvestOptions:
        n = int(hcfg["continuation_tokens"])
        cap = int(hcfg.get("max_positions_per_prompt") or n)
        whole = (n, cap, int(hcfg["gamma"]), int(hcfg["interleaved_max_run"]))
        if min(whole) < 1:
            raise ValueError(
                "harvest.continuation_tokens, max_positions_per_prompt, gamma, "
                "interleaved_max_run: >= 1"
            )
        return cls(
            mix_weights={k: float(v) for k, v in hcfg["mix_weights"].items()},
            continuation_tokens=min(n, cap),
            positions_per_prompt=cap,
            gamma=int(hcfg["gamma"]),
            interleaved_accept=accept_setting(hcfg["interleaved_accept"]),
            interleaved_max_run=int(hcfg["interleaved_max_run"]),
            hidden_layer=int(hcfg["hidden_layer"]),
            seed=int(hcfg["seed"]),
            split=hcfg.get("split"),
            prompts_per_shard=max(1, int(hcfg["shard_rows"]) // cap),
            sampling=sampling,
        )

    def fingerprint_settings(self) -> dict[str, Any]:
        return {**asdict(self), "sampling": asdict(self.sampling)}

    @property
    def runs(self) -> RunLaw:
        return RunLaw(self.interleaved_accept, self.interleaved_max_run)

    def needs_accept(self) -> bool:
        """Whether alpha is still to be measured: `auto`, and interleaved prompts exist."""
        return self.interleaved_accept is None and self.mix_weights.get("interleaved", 0) > 0


def resolve_accept(
    options: HarvestOptions,
    models: Roles,
    prompts: Sequence[Prompt],
    calibration_prompts: int,
    device: torch.device,
) -> HarvestOptions:
    """The options with `auto` alpha measured on the first `calibration_prompts` prompts
    (harvest/calibration.py); unchanged when it is given or no prompt is interleaved."""
    if not options.needs_accept():
        return options
    alpha = measure_accept(
        models,
        prompts[:calibration_prompts],
        options.positions_per_prompt,
        options.sampling,
        device,
    )
    return replace(options, interleaved_accept=alpha)


def harvest_problems(harvest: dict[str, Any]) -> list[str]:
    """The `harvest` section's problems its declaration (stages/schema.py's HARVEST) does not
    catch, one line each: interleaved_accept is auto or in (0, 1), where HARVEST's range
    admits 1 (calibration.accept_setting, which the run reads it with)."""
    problems: list[str] = []
    if "interleaved_accept" in harvest:
        try:
            accept_setting(harvest["interleaved_accept"])
        except ValueError as error:
            problems.append(str(error))
    return problems


def shared_rows_of(hcfg: dict[str, Any]) -> int:
    """harvest.shared_generation_rows, a whole number >= 0 (0: target and interleaved rows
    never share a generation call)."""
    value = hcfg["shared_generation_rows"]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(
            f"harvest.shared_generation_rows must be a whole number >= 0, got {value!r}"
        )
    return value
