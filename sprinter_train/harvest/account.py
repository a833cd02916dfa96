"""What a harvest says about itself beside its records: the manifest's account of the
interleaved mix's alpha, and the result's records per second (kept apart from the driver,
which runs the harvest)."""

from __future__ import annotations

from typing import Any


def throughput(rows: int, phase_seconds: dict[str, float]) -> dict[str, Any]:
    """This rank's records/s over both phases and over the teacher-forced one alone, and their
    ratio: what generating the draft-, target-continued and interleaved mixes costs beside a
    harvest that only teacher-forces given sequences (none when nothing was written)."""
    generation = phase_seconds.get("generation", 0.0)
    forced = phase_seconds.get("teacher_forced", 0.0)
    if not rows or forced <= 0:
        return {}
    both = generation + forced
    return {
        "generation_seconds": generation,
        "teacher_forced_seconds": forced,
        "records_per_s": rows / both,
        "teacher_forced_records_per_s": rows / forced,
        "all_mix_ratio": forced / both,
    }


def interleaved_note(accept: float | None, max_run: int, hcfg: dict[str, Any]) -> dict[str, Any]:
    """The manifest's account of the interleaved mix's alpha (`accept`, None when `auto` had
    no interleaved prompt to measure on): its value and where it came from."""
    source = "given (harvest.interleaved_accept)"
    if hcfg["interleaved_accept"] == "auto":
        source = (
            "auto: mean beta = sum min(p, q) over the original sequences of the first "
            f"{hcfg['calibration_prompts']} prompts"
        )
    if accept is None:
        source = "auto, not measured: no interleaved prompts"
    return {"accept": accept, "source": source, "max_run": max_run}
