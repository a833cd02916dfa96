"""The bench's figures and table: tokens per target call, and acceptance rates that mean the
same for every method (sprinter's verifier acceptances apart)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sprinter_train.bench.report.results_md import write_results
from sprinter_train.bench.report.summary import acceptance
from sprinter_train.bench.report.tables import UNSUPPORTED
from sprinter_train.bench.timing.latency import LatencyProfile
from sprinter_train.core.io import read_json
from sprinter_train.decoding.batch import DecodeStats
from sprinter_train.decoding.policies.registry import as_record
from sprinter_train.decoding.policies.sv import SpecVerificationPaper
from tests.decoding_helpers import companion_plan


def test_acceptance_rates_count_the_targets_checks_only() -> None:
    sd = DecodeStats(drafted=10, accepted=4)
    assert acceptance(sd) == {"acceptance_rate": 0.4, "verifier_acceptance_rate": None}
    # 8 drafts committed on the verifier's word, 2 checked by the target, 1 of them kept
    sprinter = DecodeStats(drafted=10, accepted=1, verifier_accepted=8, verifier_calls=10)
    assert acceptance(sprinter) == {
        "acceptance_rate": pytest.approx(0.5),
        "verifier_acceptance_rate": pytest.approx(0.8),
    }
    trusting = DecodeStats(drafted=4, verifier_accepted=4, verifier_calls=4)
    assert acceptance(trusting)["acceptance_rate"] is None  # the target checked nothing
    assert acceptance(DecodeStats()) == {"acceptance_rate": None, "verifier_acceptance_rate": None}


def test_a_verifier_that_only_picks_lengths_shows_no_verifier_acceptance(tmp_path: Path) -> None:
    """sd_learned asks its verifier every draft but commits nothing on its word: its verifier
    acceptance is '–', not 0.000 (sd, with no verifier at all, likewise)."""
    learned = DecodeStats(drafted=10, accepted=4, verifier_calls=12)
    assert acceptance(learned) == {"acceptance_rate": 0.4, "verifier_acceptance_rate": None}
    results = hand_made_results()
    rate = acceptance(learned)["verifier_acceptance_rate"]
    results["methods"]["sd_learned"] = {**row(1.5, 0.4, rate), "tokens": 20}
    write_results(tmp_path, results)
    lines = (tmp_path / "results.md").read_text().splitlines()
    line = next(line for line in lines if line.startswith("| sd_learned |"))
    assert "| 1.50 | 0.400 | – |" in line and "0.000" not in line


def test_results_md_says_how_sds_planner_chose_gamma(tmp_path: Path) -> None:
    results = hand_made_results()
    write_results(tmp_path, results)
    assert "chosen again" not in (tmp_path / "results.md").read_text()  # no planner ran
    rounds = {"4": {"2": 3, "0": 5}, "12": {"1": 2}, "3": {"0": 1}}
    planner = {"prior_alpha": 0.35, "margin": 0.05, "rounds_by_rows_and_gamma": rounds}
    results["settings"] = {"sd": {"gamma": 2, "planner": planner}}
    write_results(tmp_path, results)
    text = (tmp_path / "results.md").read_text()
    assert "prior alpha 0.350, switching only for 5% more" in text
    assert "rows 3: gamma 0 × 1; rows 4: gamma 0 × 5, gamma 2 × 3; rows 12: gamma 1 × 2." in text


def test_results_md_says_how_often_sv_read_its_companion(tmp_path: Path) -> None:
    results = hand_made_results()
    write_results(tmp_path, results)
    assert "read its companion" not in (tmp_path / "results.md").read_text()  # no plan ran
    plan = companion_plan(0.5, margin=0.03, warmup=4, probe_every=8).record()
    plan["rounds_by_rows_and_mode"].update(
        {"3-4": {"companion": 5, "prior": 20, "companion (probe)": 3}, "1": {"prior": 7}}
    )
    plan["speed_by_rows_and_mode"].update({"3-4": {"companion": 0.904, "prior": 1.246}})
    results["settings"] = {"sv": {"companion_plan": plan}}
    write_results(tmp_path, results)
    text = (tmp_path / "results.md").read_text()
    assert "sv read its companion in 8 of 35 rounds" in text
    assert "switching for 3% more, after 4 rounds of each, probing another every 8" in text
    assert (
        "rows 1: prior × 7; rows 3-4: companion × 5, companion (probe) × 3, prior × 20 "
        "(speed companion 0.90, prior 1.25)."
    ) in text


def row(tokens_per_call: float, rate: float | None, verifier_rate: float | None) -> dict:
    return {
        "tokens_per_s": 10.0,
        "wall_s": 2.0,
        "target_calls": 5,
        "draft_calls": 9,
        "tokens_per_target_call": tokens_per_call,
        "acceptance_rate": rate,
        "verifier_acceptance_rate": verifier_rate,
        "time_breakdown_s": {"target": 1.0, "draft": 0.5, "companion": 0.0, "verifier": 0.1},
    }


def hand_made_results() -> dict:
    return {
        "experiment": "exp",
        "num_prompts": 1,
        "max_new_tokens": 8,
        "sampling": {"temperature": 0.2},
        "device": "cpu",
        "dtype": "float32",
        "threads": 1,
        "models": {},
        "sd_gamma": 3,
        "alpha": 0.5,
        "alpha_source": "test",
        "latency_profile": {"target_ms": {"1": 30.0}, "draft_ms": 3.0, "companion_ms": None},
        "methods": {"sd": row(1.75, 0.321, None), "sprinter": row(2.5, 0.4, 0.875)},
    }


def test_results_md_shows_tokens_per_target_call_and_both_acceptances(tmp_path: Path) -> None:
    results = hand_made_results()
    write_results(tmp_path, results)
    assert read_json(tmp_path / "results.json")["methods"]["sd"]["tokens_per_target_call"] == 1.75
    lines = (tmp_path / "results.md").read_text().splitlines()
    header = next(line for line in lines if line.startswith("| method"))
    assert "| tokens / target call | acceptance | verifier acceptance |" in header
    assert "| 1.75 | 0.321 | – |" in next(line for line in lines if line.startswith("| sd |"))
    assert "| 2.50 | 0.400 | 0.875 |" in next(
        line for line in lines if line.startswith("| sprinter")
    )


def test_the_tv_column_and_batch_tables_show_only_what_ran(tmp_path: Path) -> None:
    results = hand_made_results()
    write_results(tmp_path, results)
    text = (tmp_path / "results.md").read_text()
    assert "TV 1st token" not in text and "goodput" not in text  # no sv ran, one batch size
    results["methods"]["sv_paper"] = {**row(1.5, 0.3, None), "tv_first_token": 0.0421}
    results["law_distance_prompts"] = 4
    results["traits"] = {"sv_paper": as_record(SpecVerificationPaper.traits)}  # lossy, by trait
    results["batches"] = {
        "4": {
            "methods": {"sd": row(3.0, 0.3, None)},
            "sd_gamma": 2,
            "groups": 1,
            "unsupported": {"hf_assisted": f"{UNSUPPORTED}: HF decodes one sequence"},
        }
    }
    write_results(tmp_path, results)
    lines = (tmp_path / "results.md").read_text().splitlines()
    assert "| 0.0421 |" in next(line for line in lines if line.startswith("| sv_paper |"))
    assert "| – |" in next(line for line in lines if line.startswith("| sd |"))  # no TV: –
    assert any("sv_paper 0.0421 (lossy" in line and "over 4 prompts" in line for line in lines)
    four = lines[lines.index("## Batch size 4") :]
    assert any(line.startswith("| sd | 10.0 |") for line in four)
    unsupported = next(line for line in four if line.startswith("| hf_assisted |"))
    header = next(line for line in four if line.startswith("| method | tokens/s"))
    assert UNSUPPORTED in unsupported and unsupported.count("|") == header.count("|")


def test_results_md_warns_when_the_load_exceeded_the_cores(tmp_path: Path) -> None:
    results = hand_made_results()
    load = {"load_average_start": 5.0, "load_average_end": 1.0, "cores": 2}
    results["provenance"] = {**load, "under_load": True}
    write_results(tmp_path, results)
    assert "other work shared the 2 cores" in (tmp_path / "results.md").read_text()
    results["provenance"] = {**load, "under_load": False}
    write_results(tmp_path, results)
    assert "other work shared" not in (tmp_path / "results.md").read_text()


def test_a_run_alone_is_not_under_load_but_one_beside_another_job_is() -> None:
    """A 2-thread bench alone reads a load of about 2.0 on 2 cores: that is itself, not
    other work; 3.5 at the end, or 2.6 before it started, is other work."""
    from unittest import mock

    from sprinter_train.bench.run import provenance

    with mock.patch.object(provenance, "cores", return_value=2):
        assert not provenance.under_load(2.01, own_threads=2)
        assert provenance.under_load(3.5, own_threads=2)
        assert provenance.under_load(2.6) and not provenance.under_load(1.8)


def test_a_bench_after_another_stage_is_judged_by_the_cores_others_keep_busy(
    monkeypatch,
) -> None:
    """In stage=all the bench starts with the load average still counting the previous
    stage's own 2 threads (about 2.0 on 2 cores): the measured busy cores of other processes,
    not that lagging average, say whether other work shared the machine."""
    from sprinter_train.bench.run import provenance
    from sprinter_train.bench.timing.latency import LatencyProfile
    from sprinter_train.core import machine

    monkeypatch.setattr(machine, "usable_cores", lambda *a: 2)
    assert not provenance.shared(0.1, 2.02) and provenance.shared(1.2, 0.0)
    assert provenance.shared(None, 3.5) and not provenance.shared(None, 1.0)
    started = {"torch_threads": 2, "cores": 2, "load_average_start": 2.02, "busy_cores_start": 0.05}
    for busy_end, end_load, loaded in [(0.1, 2.0, False), (1.5, 2.0, True), (0.1, 4.6, True)]:
        monkeypatch.setattr(machine, "busy_cores", lambda *a, b=busy_end, **k: b)
        monkeypatch.setattr(machine, "load_average", lambda e=end_load: e)
        done = provenance.finish(dict(started))
        assert done["under_load"] is loaded and done["busy_cores_end"] == busy_end
        warning = provenance.load_warning(done)
        assert (warning is not None) is loaded
        if loaded:
            assert f"other processes kept 0.1 and {busy_end:.1f} cores busy" in warning
    quiet = LatencyProfile({1: 30.0}, 3.0, None, 128, "cpu", "float32")
    quiet.load_average = {"start": 2.02, "end": 1.0, "busy_start": 0.05, "busy_end": 0.1}
    assert not quiet.measured_under_load
    quiet.load_average["busy_start"] = None  # an older profile: the load average decides
    assert quiet.measured_under_load


def test_results_md_reports_the_untimed_warm_up_and_hf_statics_compile(tmp_path: Path) -> None:
    results = hand_made_results()
    write_results(tmp_path, results)
    assert "Warm-up (untimed)" not in (tmp_path / "results.md").read_text()  # none recorded
    results["settings"] = {"hf_static": {"compile": True, "compile_s": 12.34}}
    results["batches"] = {
        "1": {"methods": {}, "sd_gamma": 3, "groups": 2, "warmup_s": {"sd": 0.5, "hf_static": 1.25}},
        "4": {"methods": {"sd": row(3.0, 0.3, None)}, "sd_gamma": 2, "groups": 1,
              "warmup_s": {"sd": 0.75}},
    }  # fmt: skip
    write_results(tmp_path, results)
    lines = (tmp_path / "results.md").read_text().splitlines()
    warm = lines[lines.index("## Warm-up (untimed)") :]
    assert "| method | batch 1 | batch 4 |" in warm
    assert "| sd | 0.50 | 0.75 |" in warm and "| hf_static | 1.25 | – |" in warm
    assert any("compiled its decode step in 12.3 s" in line for line in warm)
    assert not any("Set-up phases" in line for line in warm)  # none recorded


def test_results_md_says_how_long_each_set_up_phase_took_and_what_it_compiled(
    tmp_path: Path,
) -> None:
    """results.json's `setup_phases` (bench/run/phases.py) as one table in the warm-up section:
    the set-up phases one by one, the methods' warm-ups summed per batch size, and the
    warm-ups that compiled graphs named (where a recompile shows)."""
    results = hand_made_results()
    results["batches"] = {"1": {"methods": {}, "sd_gamma": 3, "groups": 2,
                                "warmup_s": {"sd": 0.5, "sprinter": 8.4}}}  # fmt: skip
    counts = {"cache_hits": 0, "cache_misses": 0}
    results["setup_phases"] = [
        {"phase": "latency profile", "seconds": 23.2, "compile_s": 22.0, "graphs": 12,
         "cache_hits": 10, "cache_misses": 2},
        {"phase": "alpha and the profile's check", "seconds": 7.5, "compile_s": 0.0,
         "graphs": 0, **counts},
        {"phase": "hf_static compile", "seconds": 28.0, "compile_s": 27.0, "graphs": 2,
         "cache_hits": 2, "cache_misses": 0},
        {"phase": "warm-up", "method": "sd", "batch_size": 1, "seconds": 0.5,
         "compile_s": 0.0, "graphs": 0, **counts},
        {"phase": "warm-up", "method": "sprinter", "batch_size": 1, "seconds": 8.4,
         "compile_s": 8.0, "graphs": 1, "cache_hits": 0, "cache_misses": 1},
    ]  # fmt: skip
    write_results(tmp_path, results)
    assert read_json(tmp_path / "results.json")["setup_phases"] == results["setup_phases"]
    lines = (tmp_path / "results.md").read_text().splitlines()
    warm = lines[lines.index("## Warm-up (untimed)") :]
    assert "| phase | seconds | compiling (s) | graphs compiled | from the compile cache |" in warm
    assert "| latency profile | 23.20 | 22.00 | 12 | 10 of 12 |" in warm
    assert "| alpha and the profile's check | 7.50 | 0.00 | 0 | – |" in warm
    assert "| hf_static compile | 28.00 | 27.00 | 2 | 2 of 2 |" in warm
    assert "| warm-ups at batch 1 | 8.90 | 8.00 | 1 | 0 of 1 |" in warm
    assert "Warm-ups that compiled graphs: sprinter at batch 1 (1)." in warm
    assert not any("After the set-up" in line for line in warm)  # no record: nothing beyond
    results["provenance"] = {"compile": {"seconds": 40.0, "cache_hits": 12, "cache_misses": 6}}
    write_results(tmp_path, results)
    warm = (tmp_path / "results.md").read_text().split("## Warm-up (untimed)")[1]
    assert "the timed runs compiled more: 3 compile-cache look-ups" in warm  # 18 less 15
    del results["batches"]["1"]["warmup_s"]  # phases alone still get the section
    write_results(tmp_path, results)
    text = (tmp_path / "results.md").read_text()
    assert "## Warm-up (untimed)" in text and "| latency profile | 23.20 |" in text


def test_results_md_prices_target_onlys_call_against_the_profile_prefills_apart(
    tmp_path: Path,
) -> None:
    results = hand_made_results()
    profile = LatencyProfile({1: 30.0, 2: 32.0}, 3.0, None, 128, "cpu", "float32")
    by_batch = profile.by_batch([1], 2)  # as the run holds it before writing results.json
    assert by_batch == json.loads(json.dumps(by_batch))  # and as the file keeps it
    results["latency_profile"]["by_batch"] = by_batch
    base = row(1.0, None, None)
    base["prefill_s"] = {"target": 0.25, "draft": 0.0, "companion": 0.0}
    base["cost_ms"] = {"target_call": 45.0}
    results["methods"] = {"target_only": base, **results["methods"]}
    write_results(tmp_path, results)
    lines = (tmp_path / "results.md").read_text().splitlines()
    header = next(line for line in lines if line.startswith("| method | wall s"))
    assert "| target | of it prefill |" in header and header.endswith("| target ms a call |")
    breakdown = [line for line in lines if line.startswith("| target_only | 2.00")]
    assert breakdown == ["| target_only | 2.00 | 1.00 | 0.25 | 0.50 | 0.00 | 0.10 | 0.40 | 45.00 |"]
    assert "| sd | 2.00 | 1.00 | – |" in "\n".join(lines)  # a run written before: no prefill
    assert (
        "target_only's target call, prefills apart: 45.00 ms, 1.50x the latency profile's "
        "1-token forward (30.00 ms)." in lines
    )


@pytest.mark.parametrize(
    ("ladder", "said"),
    [
        ([], "No τ stricter than its 0.3 was tried: bench.guard.tau_ladder is empty."),
        ([0.2], "No τ of bench.guard.tau_ladder is stricter than its 0.3."),
    ],
)  # fmt: skip
def test_results_md_says_plainly_when_no_stricter_tau_was_tried(
    tmp_path: Path, ladder: list[float], said: str
) -> None:
    """sprinter (τ 0.3) breaks the perplexity bar; with `bench.guard.tau_ladder=[]` ('never')
    or a ladder with nothing above 0.3 it is decoded at no other τ, and results.md must not
    say it was decoded again."""
    from sprinter_train.bench.quality.guard import perplexity_bar
    from sprinter_train.bench.quality.tau_ladder import hold_taus
    from sprinter_train.decoding.policies import Sprinter, TargetOnly

    results = hand_made_results()
    results["methods"]["target_only"] = {**row(1.0, None, None), "target_ppl": 2.0}
    results["methods"]["sprinter"]["target_ppl"] = 3.0
    results["traits"] = {
        "target_only": as_record(TargetOnly.traits), "sprinter": as_record(Sprinter.traits)
    }  # fmt: skip
    results["quality_guard"] = perplexity_bar(results["methods"], results["traits"], 1.1)
    policies = {"sprinter": Sprinter(None, tau=0.3, max_run=4)}
    # nothing to decode: no engine, target or prompt is needed, and none is touched
    hold_taus(results, policies, None, None, [], [], 8, ladder, 8)
    entry = results["quality_guard"]["tau_ladder"]["sprinter"]
    assert entry["tried"] == [] and entry["holds"] is None
    write_results(tmp_path, results)
    text = (tmp_path / "results.md").read_text()
    assert f"\nsprinter was not decoded again. {said}\n" in text
    assert "decoded again, untimed" not in text and "until one holds the bar" not in text
    warning = next(line for line in text.splitlines() if "sprinter's output" in line)
    assert warning.endswith(f"whatever ROUGE-L says. {said}")
