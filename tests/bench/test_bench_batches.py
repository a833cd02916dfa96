"""The bench over batch sizes on tiny models: groups of consecutive prompts, a row's tokens
the same at every batch size, per-batch gamma, and the `batches` section of results.json
with its tables and goodput plot."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from sprinter_train.__main__ import run_stage
from sprinter_train.bench.report.tables import UNSUPPORTED
from sprinter_train.bench.run.methods import at_batch_size, plan_methods
from sprinter_train.bench.run.phases import phase
from sprinter_train.bench.run.prepare import batch_sizes_for
from sprinter_train.bench.run.runs import engine_decode, groups, run_methods
from sprinter_train.bench.timing.latency import LatencyProfile
from sprinter_train.core.config import compose_config
from sprinter_train.core.io import read_json
from sprinter_train.core.sampling import SamplingConfig
from sprinter_train.data.prompts import Prompt
from sprinter_train.decoding.batch import DecodeStats
from sprinter_train.decoding.builder import build_engine, build_runner
from sprinter_train.decoding.policies.registry import greedy_exact
from sprinter_train.decoding.timings import Timings
from sprinter_train.harvest.manifest import model_identity
from sprinter_train.models.roles import load_roles
from sprinter_train.models.tiny import build_tiny_model
from tests.decoding_helpers import PACK_EVERY
from tests.synthetic import write_synthetic_records

# the methods that emit the target's greedy tokens and need no trained predictor or companion
GREEDY_EXACT = tuple(greedy_exact(compose_config().methods, {"verifier", "table", "companion"}))
SPEED = (
    "tokens",
    "wall_s",
    "tokens_per_s",
    "target_calls",
    "draft_calls",
    "companion_calls",
    "tokens_per_target_call",
    "acceptance_rate",
    "verifier_acceptance_rate",
    "time_breakdown_s",
    "speedup_vs_target_only",
    "speedup_vs_sd",
    "rouge_l_vs_target",
)


def test_no_batch_size_runs_above_the_number_of_prompts() -> None:
    """3 prompts at batch 64 are one group of 3: it runs, and is reported, as batch 3."""
    assert batch_sizes_for([4, 64], 3) == [1, 3]
    assert batch_sizes_for([4, 8], 20) == [1, 4, 8]
    assert batch_sizes_for([], 5) == [1]


def test_groups_are_consecutive_and_the_last_may_be_short() -> None:
    assert groups(5, 2) == [range(0, 2), range(2, 4), range(4, 5)]
    assert groups(3, 8) == [range(0, 3)] and groups(4, 1) == [range(i, i + 1) for i in range(4)]


def test_each_batch_size_gets_its_own_gamma(compose_cfg) -> None:
    cfg = compose_cfg("stage=bench", "bench.methods=[sd,svip,hf_assisted]")
    plan = plan_methods(cfg, 4, build_tiny_model({}, seed=0), False)
    at_8 = at_batch_size(plan, cfg, 2)
    assert plan.policies["sd"].gamma == 4 and at_8.policies["sd"].gamma == 2
    assert at_8.settings["sd"]["gamma"] == 2 and plan.settings["sd"]["gamma"] == 4
    assert at_8.peers["hf_assisted"]["num_assistant_tokens"] == 2
    assert at_8.policies["svip"] is plan.policies["svip"]  # nothing auto: shared
    fixed = compose_cfg("stage=bench", "bench.methods=[sd]", "methods.sd.gamma=5")
    plan = plan_methods(fixed, 4, build_tiny_model({}, seed=0), False)
    assert at_batch_size(plan, fixed, 2).policies["sd"].gamma == 5


def test_a_rows_greedy_tokens_are_the_same_at_every_batch_size(compose_cfg) -> None:
    """Five prompts of different lengths at batch 1 and 4 (a full group and a group of one):
    every lossless method emits target_only's tokens in every row, at both sizes."""
    cfg = compose_cfg("stage=bench", f"bench.methods=[target_only,{','.join(GREEDY_EXACT)}]")
    profile = LatencyProfile({1: 30.0, 2: 31.0, 3: 33.0}, 3.0, None, 128, "cpu", "float32")
    target = build_tiny_model({}, seed=0)
    draft = build_tiny_model({"num_hidden_layers": 1}, seed=1)
    plan = plan_methods(cfg, 3, draft, False)
    engine = build_engine(
        build_runner(target, 128),
        SamplingConfig(temperature=0),
        128,
        draft=build_runner(draft, 128),
        pack_every=PACK_EVERY,
        timings=Timings(**profile.priors()),  # as the stage primes its engine's
    )
    lengths = (4, 9, 2, 6, 3)
    prompts = [
        Prompt(f"p{i}", "syn", "test", "", [(7 * i + k) % 120 + 3 for k in range(n)], None)
        for i, n in enumerate(lengths)
    ]
    names = ["target_only", *GREEDY_EXACT]
    tokens = {}
    for size in (1, 4):
        decode = engine_decode(engine, at_batch_size(plan, cfg, 3).policies, 12)
        runs = run_methods(decode, names, prompts, size, seed=0, warmup_runs=0)
        assert [len(r.prompts) for r in runs["sd"]] == ([1] * 5 if size == 1 else [4, 1])
        tokens[size] = {n: [t for r in rs for t in r.tokens] for n, rs in runs.items()}
    reference = tokens[1]["target_only"]
    assert all(len(t) == 12 for t in reference)
    for size in (1, 4):
        for name in names:
            assert tokens[size][name] == reference, (size, name)


@pytest.fixture(scope="module")
def bench(tmp_path_factory) -> dict:
    """stage=bench on tiny models, greedy, at batch 1 and 4, with an SV table to use."""
    from sprinter_train.core.config import compose_config

    root = tmp_path_factory.mktemp("batches")
    cfg = compose_config(
        f"artifacts_root={root}",
        "device=cpu",
        "dtype=float32",
        "num_threads=1",
        "stage=bench",
        "models=tiny_random",
        "experiment=batches",
        "sampling.temperature=0",
        "data.max_prompt_tokens=48",
        "bench.num_prompts=5",
        "bench.max_new_tokens=8",
        "bench.batch_sizes=[4]",  # batch 1 runs anyway
        "bench.gamma_max=3",
        "bench.latency.reps=1",
        "bench.judge.enabled=false",
        "bench.law_distance_prompts=3",
        "bench.methods=[target_only,sd,svip,sv,sv_paper,hf_assisted]",
    )
    roles = load_roles(cfg.models, torch.device("cpu"), torch.float32)  # the bench's models
    models = {m.role: model_identity(m) for m in roles.all()}  # sv's table must name them
    write_synthetic_records(
        Path(cfg.experiment_dir), rows=2048, d=8, shard_rows=1024, models=models
    )
    run_stage(compose_config(f"artifacts_root={root}", "stage=tables", "experiment=batches"))
    run_stage(cfg)
    out = Path(cfg.experiment_dir) / "bench"
    return {"results": read_json(out / "results.json"), "out": out}


@pytest.mark.heavy  # a whole bench stage (the module's fixture)
def test_results_json_has_a_batches_section_per_batch_size(bench) -> None:
    results = bench["results"]
    assert results["batch_sizes"] == [1, 4] and set(results["batches"]) == {"1", "4"}
    one, four = results["batches"]["1"], results["batches"]["4"]
    assert set(one["methods"]) == set(results["methods"])
    for name, row in results["methods"].items():
        assert {k: row[k] for k in SPEED} == {k: one["methods"][name][k] for k in SPEED}, name
    assert set(four["methods"]) == {"target_only", "sd", "svip", "sv", "sv_paper"}
    assert set(four["unsupported"]) == {"hf_assisted"} and not one["unsupported"]
    assert four["unsupported"]["hf_assisted"].startswith(UNSUPPORTED)
    assert "target_ppl" not in four["methods"]["sd"]  # quality is the batch-1 run's
    assert (one["groups"], four["groups"]) == (5, 2)
    assert one["sd_gamma"] == results["sd_gamma"] and 0 <= four["sd_gamma"] <= 3  # 0: none pays
    base = four["methods"]["target_only"]
    for name, row in four["methods"].items():
        assert row["tokens_per_s"] == pytest.approx(row["tokens"] / row["wall_s"]), name
        assert row["speedup_vs_target_only"] == pytest.approx(
            row["tokens_per_s"] / base["tokens_per_s"]
        )
        assert row["tokens"] == results["methods"][name]["tokens"], name  # greedy: same rows
        # greedy: every method is lossless, so each scores 100 against target_only, outputs
        # that decode to no word included (they scored 0 against themselves: issue 39 item 2)
        assert row["rouge_l_vs_target"] == base["rouge_l_vs_target"] == 100.0, name
    # five rows in two batched groups: fewer target forwards than at batch 1
    assert base["target_calls"] < results["methods"]["target_only"]["target_calls"]
    profile = results["latency_profile"]["by_batch"]
    assert set(profile) == {"1", "4"} and set(profile["4"]["target_ms"]) == {"1", "2", "3", "4"}


@pytest.mark.heavy  # a whole bench stage (the module's fixture)
def test_results_record_each_set_up_phase_and_each_warm_up(bench) -> None:
    """results.json's `setup_phases`: the profile, alpha with its check, then every method's
    warm-up at every batch size (HF's peers at batch 1 only), each with its seconds and what
    it compiled; results.md's warm-up section tables them."""
    phases = bench["results"]["setup_phases"]
    names = [p["phase"] for p in phases]
    assert names[:2] == ["latency profile", "alpha and the profile's check"]
    warm = [(p["method"], p["batch_size"]) for p in phases if p["phase"] == "warm-up"]
    methods = ["target_only", "sd", "svip", "sv", "sv_paper"]
    assert warm == [(m, 1) for m in [*methods, "hf_assisted"]] + [(m, 4) for m in methods]
    keys = {"seconds", "compile_s", "graphs", "cache_hits", "cache_misses"}
    assert all(keys <= set(p) and p["seconds"] >= 0 and p["graphs"] >= 0 for p in phases)
    text = (bench["out"] / "results.md").read_text()
    assert "| latency profile |" in text and "| warm-ups at batch 4 |" in text


@pytest.mark.heavy  # a whole bench stage (the module's fixture)
def test_sv_paper_reports_its_distance_and_sv_reports_none(bench) -> None:
    methods = bench["results"]["methods"]
    assert len(methods["sv"]["tv_first_token_per_prompt"]) == 3
    assert methods["sv"]["tv_first_token"] == pytest.approx(0.0, abs=1e-6)
    assert 0.0 <= methods["sv_paper"]["tv_first_token"] <= 1.0
    assert "tv_first_token" not in methods["sd"]


@pytest.mark.heavy  # a whole bench stage (the module's fixture)
def test_results_md_has_a_table_per_batch_size_and_the_goodput_plot(bench) -> None:
    out = bench["out"]
    text = (out / "results.md").read_text()
    assert "## Batch size 1" in text and "## Batch size 4" in text
    four = text[text.index("## Batch size 4") :]
    assert f"| hf_assisted | {UNSUPPORTED} |" in four
    assert "| sv_paper |" in four and "| target_only |" in four
    assert four.count("| method | wall s | target | of it prefill | draft | companion |") == 1
    assert "TV 1st token" in text and "sv_paper" in text[: text.index("## Batch size 4")]
    assert "| batch | target 1 |" in text  # the latency profile by batch size
    assert (out / "goodput_vs_batch.png").stat().st_size > 1000


@pytest.mark.heavy  # a whole bench stage (the module's fixture)
def test_results_carry_provenance_and_greedy_differences_from_target_only(bench) -> None:
    results = bench["results"]
    prov = results["provenance"]
    assert prov["config"]["bench"]["num_prompts"] == 5 and prov["code_version"]
    assert (prov["device"], prov["dtype"], prov["torch_threads"]) == ("cpu", "float32", 1)
    assert prov["load_average_start"] is not None and prov["load_average_end"] is not None
    assert set(prov["hashes"]["models"]) == {"target", "draft", "companion"}
    table = str(Path(bench["out"]).parent / "tables" / "sv_table.json")
    assert len(prov["hashes"]["tables"][table]) == 16
    differing = {n: r["outputs_differing_from_target_only"] for n, r in results["methods"].items()}
    # float32 greedy: the lossless engine methods repeat target_only token for token
    assert {n: differing[n] for n in ("target_only", "sd", "svip", "sv")} == dict.fromkeys(
        ("target_only", "sd", "svip", "sv"), 0
    )
    assert all(isinstance(differing[n], int) for n in ("sv_paper", "hf_assisted"))


@pytest.mark.heavy  # a whole bench stage (the module's fixture)
def test_sd_auto_plans_every_round_from_the_bench_alpha_and_records_it(bench) -> None:
    """sd's planner starts from the bench's alpha and records the gammas it chose by live
    rows (at most 4 here, gamma 0..gamma_max); its greedy rows are target_only's (above)."""
    results = bench["results"]
    planner = results["settings"]["sd"]["planner"]
    assert planner["prior_alpha"] == results["alpha"] and planner["gamma_max"] == 3
    rounds = planner["rounds_by_rows_and_gamma"]
    assert rounds and {int(rows) for rows in rounds} <= {1, 2, 3, 4}
    assert {int(g.split()[0]) for per in rounds.values() for g in per} <= {
        0,
        1,
        2,
        3,
    }  # "2 (probe)"
    assert "Rounds by live rows and gamma" in (bench["out"] / "results.md").read_text()


def test_few_groups_are_decoded_again_and_keep_their_median_run() -> None:
    """One group and min_timed_runs=4: four passes, method order rotating, and each method
    keeps the run of median time (the lower middle of four), with that run's own tokens."""
    calls: list[str] = []
    walls = {"a": iter([5.0, 1.0, 3.0, 2.0]), "b": iter([9.0, 7.0, 8.0, 6.0])}

    def decode(name, group, seeds):
        calls.append(name)
        wall = next(walls[name])
        return [[int(wall)]], wall, DecodeStats(target_calls=int(wall))

    prompt = Prompt("p0", "syn", "test", "", [3, 4], None)
    runs = run_methods(decode, ["a", "b"], [prompt], 1, 0, warmup_runs=0, min_timed_runs=4)
    assert calls == ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert runs["a"][0].wall_s == 2.0 and runs["a"][0].tokens == [[2]]
    assert runs["b"][0].wall_s == 7.0 and runs["b"][0].stats.target_calls == 7
    # enough groups: one pass
    calls.clear()
    walls = {"a": iter([1.0] * 4), "b": iter([1.0] * 4)}
    runs = run_methods(decode, ["a", "b"], [prompt] * 4, 1, 0, warmup_runs=0, min_timed_runs=4)
    assert len(calls) == 8 and len(runs["a"]) == 4


def test_each_methods_warm_up_is_timed_apart_from_its_runs() -> None:
    """Warm-up seconds (compilation lands there) are reported per method, never in a run."""
    prompt = Prompt("p0", "syn", "test", "", [3, 4], None)
    slow = {"a": iter([0.05, 0.0]), "b": iter([0.0, 0.0])}

    def decode(name, group, seeds):
        time.sleep(next(slow[name]))
        return [[1]], 1.0, DecodeStats(target_calls=1)

    warmup_s: dict[str, float] = {}
    runs = run_methods(decode, ["a", "b"], [prompt], 1, 0, warmup_runs=1, warmup_s=warmup_s)
    assert set(warmup_s) == {"a", "b"} and warmup_s["a"] >= 0.05 > warmup_s["b"]
    assert runs["a"][0].wall_s == 1.0


def test_each_methods_warm_up_is_a_set_up_phase_with_what_it_compiled() -> None:
    """`bench.phases.phase` around each warm-up: its seconds and the graphs dynamo compiled
    in it, so a method whose warm-up compiles (a recompile too) is named in results.md."""
    prompt = Prompt("p0", "syn", "test", "", [3, 4], None)

    def doubled(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    step = torch.compile(doubled, fullgraph=True, backend="eager")  # dynamo, no inductor

    def decode(name, group, seeds):
        if name == "a":
            step(torch.ones(3))  # compiles on its first call: the warm-up's
        return [[1]], 1.0, DecodeStats(target_calls=1)

    phases: list = []

    def warm_up(name: str):
        return phase(phases, "warm-up", method=name, batch_size=1)

    run_methods(decode, ["a", "b"], [prompt], 1, 0, warmup_runs=1, warm_up=warm_up)
    assert [(r["method"], r["batch_size"], r["graphs"]) for r in phases] == [
        ("a", 1, 1),
        ("b", 1, 0),
    ]
    assert all(r["seconds"] >= 0 and r["compile_s"] >= 0 for r in phases)
    assert phases[0]["compile_s"] > 0 == phases[1]["compile_s"]
