"""stage=evaluate: metric code against brute force, the chained tiny pipeline, transfer, errors."""

from __future__ import annotations

import dataclasses
import itertools
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
from omegaconf import open_dict

from sprinter_train.__main__ import run_stage
from sprinter_train.bench.run.methods import PEER_NAMES
from sprinter_train.core.classification import auc, brier, ece, eta_rates
from sprinter_train.core.config import compose_config
from sprinter_train.core.io import CorruptInputError, read_json
from sprinter_train.core.rules import sampled_acceptance
from sprinter_train.data.overlap import TrainOverlapError
from sprinter_train.decoding.features.table import feature_order
from sprinter_train.decoding.policies import Method, Traits, gamma_round
from sprinter_train.decoding.policies.base import RecordScore
from sprinter_train.decoding.policies.entropy import adaedl_records, svip_records
from sprinter_train.decoding.policies.registry import MethodError, greedy_exact, traits_of
from sprinter_train.evaluation.scores import predictor_descriptions
from sprinter_train.harvest.reader import MissingInputError
from sprinter_train.verifier.checkpoint import load_verifier, verifier_path
from tests.chain_helpers import TINY_CHAIN
from tests.synthetic import SYNTHETIC_FEATURES, write_synthetic_records

TINY = (
    *TINY_CHAIN,
    "bench.num_prompts=2",
    "bench.max_new_tokens=8",
    "bench.latency.reps=2",
    "bench.batch_sizes=[1,2]",  # the two prompts as one batch: batched decoding, bounded time
)
# methods whose output is the target's own: at temperature 0 they must emit target_only's tokens
# (those reading a verifier are left out: the greedy bench has none trained at T = 0)
GREEDY_EXACT = (
    *greedy_exact(compose_config().methods, {"verifier"}),
    "hf_assisted",
    "hf_assisted_heuristic",
    "hf_static",
)
# stage=all trains train.all_labels: the λ sweep, then the soft-label verifier
VERIFIERS = {"verifier_lam1", "verifier_lam1.2", "verifier_lam1.5", "verifier_accept"}
REPORT_AUC_KEYS = {
    *VERIFIERS,
    "sv_table",
    "svip_entropy",
    "adaedl_bound",
    "draft_q",
    "online_margin",
}


def compose_at(root: Path, *overrides: str):
    return compose_config(
        f"artifacts_root={root / 'artifacts'}",
        f"checkpoints_root={root / 'checkpoints'}",
        *TINY,
        *overrides,
    )


def brute_auc(y: np.ndarray, s: np.ndarray) -> float:
    """P(score of a positive > score of a negative), ties counting one half."""
    pos, neg = s[y == 1], s[y == 0]
    wins = sum((a > b) + 0.5 * (a == b) for a, b in itertools.product(pos, neg))
    return wins / (len(pos) * len(neg))


def brute_ece(y: np.ndarray, prob: np.ndarray, bins: int) -> float:
    total = 0.0
    for b in range(bins):
        lo, hi = b / bins, (b + 1) / bins
        inside = [
            (yy, pp)
            for yy, pp in zip(y, prob, strict=True)
            if lo <= pp < hi or (b == bins - 1 and pp == 1.0)
        ]
        if inside:
            rate = sum(yy for yy, _ in inside) / len(inside)
            conf = sum(pp for _, pp in inside) / len(inside)
            total += len(inside) / len(y) * abs(rate - conf)
    return total


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_auc_ece_brier_agree_with_brute_force(seed: int) -> None:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, 40)
    s = np.round(rng.random(40), 1)  # coarse scores: ties on purpose
    assert auc(y, s) == pytest.approx(brute_auc(y, s))
    assert ece(y, s, 10) == pytest.approx(brute_ece(y, s, 10))
    assert ece(y, s, 4) == pytest.approx(brute_ece(y, s, 4))
    assert brier(y, s) == pytest.approx(np.mean([(a - b) ** 2 for a, b in zip(s, y, strict=True)]))
    assert auc(np.ones(5), s[:5]) is None  # one class: undefined, not a number


def test_eta_rates_and_baseline_scores() -> None:
    y = np.array([1, 1, 1, 0, 0])
    s = np.array([0.9, 0.6, 0.2, 0.7, 0.1])
    assert eta_rates(y, s, 0.5) == {"eta_TP": pytest.approx(2 / 3), "eta_FP": pytest.approx(0.5)}
    h = np.array([0.0, 1.0, 4.0])
    methods = compose_config().methods  # the constants the bench's policies use
    both = {"draft_entropy": np.zeros(3), "draft_entropy_raw": h}  # the rules read the raw H
    assert svip_records(both, methods.svip).tolist() == pytest.approx(
        [1.0, 1 - np.sqrt(0.15), 1 - np.sqrt(0.6)]
    )
    assert adaedl_records(both, methods.adaedl)[2] == pytest.approx(1 - np.sqrt(2.0))  # unclipped
    warped = {"draft_entropy": h, "draft_entropy_raw": np.zeros(3)}
    assert svip_records(warped, {**methods.svip, "warped_entropy": True})[2] == pytest.approx(
        1 - np.sqrt(0.6)
    )
    event = sampled_acceptance(np.full(100_000, 0.3), seed=1)
    assert event.mean() == pytest.approx(0.3, abs=0.006)
    assert (sampled_acceptance(np.ones(10), 0)).all() and not sampled_acceptance(
        np.zeros(10), 0
    ).any()


def check_bench_arithmetic(methods: dict[str, dict], most_tokens: int, batch: int = 1) -> None:
    """Every derived column of results.json follows from the counts it was derived from; at a
    batch size > 1 a batched forward is one call. sv and sd_learned may draft nothing: they skip
    drafting when their prior does not pay for a step (tiny models: a draft step costs about
    what the target's forward does), and sd's gamma=auto may choose 0 for the same reason."""
    base, sd = methods["target_only"], methods["sd"]
    for name, row in methods.items():
        assert 0 < row["tokens"] <= most_tokens, name  # the prompts' budgets, EOS may stop early
        assert row["tokens_per_s"] == pytest.approx(row["tokens"] / row["wall_s"]), name
        speedup = row["tokens_per_s"] / base["tokens_per_s"]
        assert row["speedup_vs_target_only"] == pytest.approx(speedup), name
        assert row["speedup_vs_sd"] == pytest.approx(row["tokens_per_s"] / sd["tokens_per_s"]), name
        per_call = row["tokens"] / row["target_calls"]
        assert row["tokens_per_target_call"] == pytest.approx(per_call), name
        assert 0 < row["target_calls"] <= row["tokens"], name  # a target call emits >= 1 token
        if name in (
            "sv",
            "sd_learned",
            "sd_online",
            "oracle",
        ):  # adaptive: a round that cannot pay drafts nothing
            continue
        if name == "sd" and row["draft_calls"] == 0:  # gamma auto chose 0: target-only decoding
            assert row["target_calls"] == row["tokens"] or batch > 1, name
        elif name == "hf_static":  # the target alone through HF: one call a token
            assert row["target_calls"] == row["tokens"] and row["draft_calls"] == 0, name
        elif name != "target_only":
            assert row["draft_calls"] > 0, name
    # target_only: one target call per token (a batched call: one per live row), no draft,
    # nothing to accept
    if batch == 1:
        assert base["target_calls"] == base["tokens"] and base["tokens_per_target_call"] == 1.0
    else:
        assert base["target_calls"] <= base["tokens"] <= batch * base["target_calls"]
    assert base["draft_calls"] == 0 and base["acceptance_rate"] is None
    assert base["speedup_vs_target_only"] == 1.0 and sd["speedup_vs_sd"] == 1.0


@pytest.fixture(scope="module")
def chained(tmp_path_factory) -> dict:
    """harvest -> train (λ sweep) -> tables -> evaluate on tiny models, through stage=all."""
    root = tmp_path_factory.mktemp("chain")
    cfg = compose_at(root, "stage=all", "experiment=chat")
    result = run_stage(cfg)
    return {"root": root, "cfg": cfg, "result": result}


@pytest.mark.heavy  # a stage chain: make test, not test-quick
def test_stage_all_chains_every_stage_and_writes_the_report(chained) -> None:
    cfg, result = chained["cfg"], chained["result"]
    assert result["harvest"]["records"] == 16 * 8
    assert set(result["train"]) == VERIFIERS
    bench = read_json(Path(result["bench"]["results"]))
    assert set(bench["methods"]) == set(cfg.bench.methods)  # sprinter and sv found their inputs
    assert not bench["skipped"]
    check_bench_arithmetic(bench["methods"], cfg.bench.num_prompts * cfg.bench.max_new_tokens)
    assert all(row["rouge_l_vs_target"] is not None for row in bench["methods"].values())
    assert bench["methods"]["sprinter"]["verifier_acceptance_rate"] is not None
    assert bench["methods"]["sd"]["verifier_acceptance_rate"] is None
    assert bench["methods"]["sd"]["tokens_per_target_call"] >= 1.0
    assert bench["settings"]["svip"]["c"] == cfg.methods.svip.c
    assert set(bench["batches"]) == {"1", "2"}
    for size, batch in bench["batches"].items():
        most = cfg.bench.num_prompts * cfg.bench.max_new_tokens
        check_bench_arithmetic(batch["methods"], most, int(size))
    assert set(bench["batches"]["2"]["unsupported"]) == {*PEER_NAMES}
    assert bench["methods"]["sv"]["tv_first_token"] == pytest.approx(0.0, abs=1e-6)
    assert 0.0 <= bench["methods"]["sv_paper"]["tv_first_token"] <= 1.0
    bench_md = (Path(cfg.experiment_dir) / "bench" / "results.md").read_text()
    assert all(f"| {name} |" in bench_md for name in cfg.bench.methods)
    assert {t["name"] for t in bench["targets"]} == set(cfg.bench.targets)
    assert "Against the bars" in bench_md and "sd_vs_hf_assisted" in bench_md
    assert (Path(cfg.experiment_dir) / "bench" / "pareto.png").stat().st_size > 1000
    assert "## Batch size 2" in bench_md
    assert (Path(cfg.experiment_dir) / "bench" / "goodput_vs_batch.png").stat().st_size > 1000
    eval_dir = Path(cfg.experiment_dir) / "eval"
    report = read_json(eval_dir / "report.json")
    assert set(report["auc"]) == REPORT_AUC_KEYS
    for key in ("info_gain_bits", "entropy_accepted", "entropy_rejected", "theorem_checks"):
        assert report[key] is not None, key
    assert all(0 <= v <= 1 for v in report["auc"].values() if v is not None)
    assert set(report["theorem_checks"]) == VERIFIERS
    check = report["theorem_checks"]["verifier_lam1.2"]
    assert {"theorem_3_1", "theorem_A_4", "theorem_3_3"} <= set(check)
    assert set(report["eta"]["draft_q"]) == {"0.3", "0.5", "0.7"}
    manifest = read_json(Path(cfg.experiment_dir) / "records" / "manifest.json")
    assert report["rows"] == manifest["counts"]["by_split"]["test"] > 0
    text = (eval_dir / "report.md").read_text()
    assert "verifier_lam1.2" in text and "Theorem A.4" in text and "SVIP" in text
    curve = report["learning_curve"]["verifier_lam1.2"]["points"]
    assert [p["fraction"] for p in curve] == [0.125, 0.5, 1.0]
    assert curve[-1]["test_auc_q_le_p"] == pytest.approx(report["auc"]["verifier_lam1.2"])
    assert "AUC against training records" in text
    for name in (
        "auc_vs_records",
        "roc_per_lambda",
        "roc_predictors",
        "reliability",
        "sv_table_calibration",
        "sv_table",
    ):
        assert (eval_dir / f"{name}.png").stat().st_size > 1000, name
    json.dumps(report, allow_nan=False)  # strict JSON: no NaN or Infinity
    # verifiers and table come from this very record set; a record score whose column these
    # records lack (sd_online's draft_margin, until the harvest records it) is named, not scored
    unscored = [n for n in report["notes"] if "was not scored" in n]
    assert [n for n in report["notes"] if n not in unscored] == []
    assert all(("online_margin" in report["auc"]) != bool(n) for n in unscored)
    assert all(v["trained_on_this_record_set"] for v in report["inputs"]["verifiers"].values())


@pytest.mark.heavy  # a stage chain: make test, not test-quick
def test_every_auc_has_its_prompt_interval_and_every_verifier_its_calibration(chained) -> None:
    """report.json: an interval beside every AUC (the test prompts resampled), the paired
    verifier - q(x) difference, ECE/Brier before and after each sidecar's temperature, the
    soft-label verifier judged against min(1, p/q); report.md prints all of them."""
    from sprinter_train.evaluation.bootstrap import PromptBootstrap
    from sprinter_train.evaluation.report_format import fmt_ci
    from sprinter_train.harvest.reader import open_records

    cfg = chained["cfg"]
    eval_dir = Path(cfg.experiment_dir) / "eval"
    report = read_json(eval_dir / "report.json")
    assert set(report["auc_ci"]) == set(report["auc_sampled_ci"]) == REPORT_AUC_KEYS
    for name, ci in report["auc_ci"].items():
        assert ci is None or 0.0 <= ci[0] <= ci[1] <= 1.0, name
    assert report["bootstrap"]["prompts"] == report["prompts"]
    assert report["bootstrap"]["resamples"] == cfg.evaluate.bootstrap.resamples
    records = open_records(cfg.experiment_dir)
    frame = records.frame.iloc[records.rows_of("test")]
    boot = PromptBootstrap.from_cfg(cfg.evaluate.bootstrap, frame["prompt_id"].to_numpy())
    y = frame["ratio"].to_numpy() <= 1.0
    assert report["auc_ci"]["draft_q"] == pytest.approx(boot.auc_interval(y, frame["q"]))
    assert set(report["auc_minus_draft_q"]) <= VERIFIERS
    calibration = report["verifier_calibration"]
    assert set(calibration) == VERIFIERS
    assert calibration["verifier_lam1.2"]["target"] == "q/p <= 1.2"
    soft = calibration["verifier_accept"]
    assert soft["label"] == "accept_prob" and soft["target"] == "min(1, p/q)"
    for name, entry in calibration.items():
        assert entry["temperature"] > 0 and entry["fitted_on"] == "val", name
        assert set(entry["own_target"]) == {
            "ece_before",
            "ece_after",
            "brier_before",
            "brier_after",
        }
    text = (eval_dir / "report.md").read_text()
    shown = fmt_ci(report["auc"]["draft_q"], report["auc_ci"]["draft_q"])
    assert shown.count("[") == 1 and f"| draft_q | {shown} |" in text
    assert "## Verifier calibration" in text and "| verifier_accept | accept_prob |" in text
    assert (eval_dir / "reliability_verifiers.png").stat().st_size > 1000


@pytest.mark.heavy  # a stage chain: make test, not test-quick
def test_greedy_lossless_methods_emit_target_onlys_tokens(chained) -> None:
    """At temperature 0 in float32 every lossless method's output is target_only's: the same
    token count and the target's perplexity of it equal to the last bit (one forward of the
    same tokens). The bench runs on a copy of the chain's records and table, so the chain's
    own bench results stay as they were."""
    root = chained["root"]
    experiment = root / "artifacts" / "greedy"
    for part in ("records", "tables"):
        shutil.copytree(root / "artifacts" / "chat" / part, experiment / part)
    cfg = compose_at(
        root,
        "stage=bench",
        "experiment=greedy",
        "sampling.temperature=0",
        "bench.judge.enabled=false",
        f"bench.methods=[target_only,{','.join(GREEDY_EXACT)}]",
    )
    run_stage(cfg)
    bench = read_json(experiment / "bench" / "results.json")
    assert set(bench["methods"]) == {"target_only", *GREEDY_EXACT} and not bench["skipped"]
    methods = bench["methods"]
    check_bench_arithmetic(methods, cfg.bench.num_prompts * cfg.bench.max_new_tokens)
    base = methods["target_only"]
    for name in GREEDY_EXACT:
        row = methods[name]
        assert row["tokens"] == base["tokens"], name
        assert row["target_ppl"] == base["target_ppl"], name
        assert row["rouge_l_vs_target"] == base["rouge_l_vs_target"], name
    batched = bench["batches"]["2"]["methods"]  # the engine's methods, both prompts at once
    for name in {"target_only", *GREEDY_EXACT} - {*PEER_NAMES}:
        assert batched[name]["tokens"] == base["tokens"], name
        assert batched[name]["rouge_l_vs_target"] == base["rouge_l_vs_target"], name


@pytest.mark.heavy  # a stage chain: make test, not test-quick
def test_evaluate_scores_the_same_rows_as_the_exported_verifier(chained) -> None:
    """report AUC = AUC of the checkpoint's own scores on the test rows (no hidden re-ordering)."""
    from sprinter_train.harvest.reader import open_records
    from sprinter_train.verifier.data import split_features
    from sprinter_train.verifier.embedder import make_embedder

    cfg = chained["cfg"]
    records = open_records(cfg.experiment_dir)
    checkpoint = load_verifier(verifier_path(cfg.checkpoint_dir, 1.5))
    embedder = make_embedder(cfg, checkpoint.spec, records)  # the default reads the token's
    features, rows = split_features(records, "test", checkpoint.spec, embedder)
    y = records.frame["ratio"].to_numpy()[rows] <= 1.0
    report = read_json(Path(cfg.experiment_dir) / "eval" / "report.json")
    assert report["auc"]["verifier_lam1.5"] == pytest.approx(
        auc(y, checkpoint.score(features.batch()))
    )


@pytest.mark.heavy  # a stage chain: make test, not test-quick
def test_transfer_between_two_tiny_experiments(chained) -> None:
    """SPRINTER Table 4: verifiers of one dataset scored on another's test records, both ways."""
    root = chained["root"]
    code = compose_at(
        root,
        "stage=all",
        "experiment=code",
        "data=humaneval",
        "all_steps=[evaluate,harvest,train,tables]",  # run in pipeline order whatever the order
    )
    steps = run_stage(code)
    assert list(steps) == ["harvest", "train", "tables", "evaluate", "seconds"]  # no bench
    with pytest.raises(ValueError, match="unknown step.*'plot'"):
        run_stage(compose_at(root, "stage=all", "experiment=code", "all_steps=[harvest,plot]"))
    forward = run_stage(
        compose_at(root, "stage=evaluate", "experiment=chat", "evaluate.transfer=[code]")
    )
    assert forward["auc"]  # the stage's own summary
    report = read_json(Path(chained["cfg"].experiment_dir) / "eval" / "report.json")
    assert set(report["transfer"]["code"]["auc"]) == VERIFIERS
    assert set(report["transfer"]["code"]["auc_ci"]) == VERIFIERS
    assert report["transfer"]["code"]["prompts"] > 0
    assert "## Transfer" in (Path(chained["cfg"].experiment_dir) / "eval" / "report.md").read_text()
    assert report["transfer"]["code"]["rows"] > 0
    run_stage(compose_at(root, "stage=evaluate", "experiment=code", "evaluate.transfer=[chat]"))
    reverse = read_json(Path(code.experiment_dir) / "eval" / "report.json")
    assert reverse["transfer"]["chat"]["rows"] == report["rows"]
    with pytest.raises(MissingInputError, match="stage=harvest"):
        run_stage(
            compose_at(root, "stage=evaluate", "experiment=chat", "evaluate.transfer=[missing]")
        )


@pytest.mark.heavy  # a stage chain: make test, not test-quick
def test_transfer_refuses_records_of_the_verifiers_own_train_prompts(chained) -> None:
    """The same dataset under another data.seed puts some of the verifiers' train prompts in
    the other records' test split: refused, or with evaluate.allow_train_overlap counted."""
    root = chained["root"]
    run_stage(compose_at(root, "stage=harvest", "experiment=chat_seed1", "data.seed=1"))
    with pytest.raises(TrainOverlapError, match=r"evaluate\.transfer=chat_seed1.*allow_train"):
        run_stage(
            compose_at(root, "stage=evaluate", "experiment=chat", "evaluate.transfer=[chat_seed1]")
        )
    run_stage(
        compose_at(
            root,
            "stage=evaluate",
            "experiment=chat",
            "evaluate.transfer=[chat_seed1]",
            "evaluate.allow_train_overlap=true",
        )
    )
    report = read_json(Path(chained["cfg"].experiment_dir) / "eval" / "report.json")
    counts = report["transfer"]["chat_seed1"]["train_overlap"]
    assert set(counts) == VERIFIERS and all(n > 0 for n in counts.values())


@pytest.mark.heavy  # a stage chain: make test, not test-quick
def test_token_embedding_feature_reads_the_drafts_embedding(chained) -> None:
    cfg = compose_at(
        chained["root"],
        "stage=train",
        "experiment=chat",
        "train.lam=1.2",
        "train.features=[hidden,token_embedding]",
        "checkpoints_root=" + str(chained["root"] / "ablation"),
    )
    result = run_stage(cfg)["verifier_lam1.2"]
    meta = load_verifier(result["checkpoint"]).meta
    assert meta["features"]["layout"] == [
        {"name": "hidden", "width": 64},
        {"name": "token_embedding", "width": 64},
    ]


@pytest.mark.heavy  # a stage chain: make test, not test-quick
def test_evaluate_scores_a_verifier_of_every_decode_time_feature(tmp_path) -> None:
    """A verifier trained on the decode-time features (and the target's stale hidden state)
    is scored by evaluate on the features training built for the same rows (evaluate once
    read only q, H(q) and the token and failed on the others)."""
    from sprinter_train.harvest.reader import open_records
    from sprinter_train.verifier.data import split_features

    names = [n for n in feature_order() if n != "token_embedding"]  # the synthetic ids: no draft
    overrides = (f"train.features=[{','.join(names)}]", "train.lam=1.2", "evaluate.lams=[1.2]")
    exp = tmp_path / "artifacts" / "feat"
    write_synthetic_records(exp, rows=2048, d=8, shard_rows=1024)
    for stage in ("train", "tables", "evaluate"):
        run_stage(compose_at(tmp_path, f"stage={stage}", "experiment=feat", *overrides))
    report = read_json(exp / "eval" / "report.json")
    checkpoint = load_verifier(verifier_path(tmp_path / "checkpoints" / "feat", 1.2))
    assert checkpoint.spec.names == tuple(names)
    features, rows = split_features(open_records(exp), "test", checkpoint.spec)
    y = open_records(exp).frame["ratio"].to_numpy()[rows] <= 1.0
    assert report["auc"]["verifier_lam1.2"] == pytest.approx(
        auc(y, checkpoint.score(features.batch()))
    )


@pytest.mark.heavy  # a stage chain: make test, not test-quick
def test_missing_inputs_name_the_stage_that_makes_them(tmp_path, chained) -> None:
    with pytest.raises(MissingInputError, match="stage=harvest"):
        run_stage(compose_at(tmp_path, "stage=evaluate", "experiment=none"))
    # records exist but no verifiers
    exp = tmp_path / "artifacts" / "syn"
    write_synthetic_records(exp, rows=2048, d=8, shard_rows=1024)
    with pytest.raises(MissingInputError, match=r"stage=train experiment=syn train.lam=1\b"):
        run_stage(compose_at(tmp_path, "stage=evaluate", "experiment=syn"))
    # verifiers but no table, on records with a companion
    run_stage(compose_at(tmp_path, "stage=train", "experiment=syn", SYNTHETIC_FEATURES))
    with pytest.raises(MissingInputError, match="stage=tables experiment=syn"):
        run_stage(compose_at(tmp_path, "stage=evaluate", "experiment=syn"))
    run_stage(compose_at(tmp_path, "stage=tables", "experiment=syn"))
    report = run_stage(compose_at(tmp_path, "stage=evaluate", "experiment=syn"))
    # the planted direction makes the verifiers strong; the synthetic A informs the table
    assert report["auc"]["verifier_lam1"] > 0.9 and report["auc"]["sv_table"] > 0.7
    assert report["entropy_rejected"] > report["entropy_accepted"]
    # a sidecar that does not say which records trained it is refused before any scoring
    sidecar = tmp_path / "checkpoints" / "syn" / "verifier-lam1.2.json"
    meta = json.loads(sidecar.read_text())
    del meta["records"]
    sidecar.write_text(json.dumps(meta))
    with pytest.raises(CorruptInputError, match="verifier-lam1.2.json .*no records.*stage=train"):
        run_stage(compose_at(tmp_path, "stage=evaluate", "experiment=syn"))


@pytest.mark.heavy  # a stage chain: make test, not test-quick
def test_ceiling_and_shortfall_sections_explain_a_short_auc(chained) -> None:
    root = chained["root"]
    run_stage(
        compose_at(
            root,
            "stage=evaluate",
            "experiment=chat",
            "evaluate.ceiling.enabled=true",
            "evaluate.ceiling.mlp_hidden=8",
            "evaluate.target_auc=1.01",  # every verifier is short of it
        )
    )
    eval_dir = Path(chained["cfg"].experiment_dir) / "eval"
    report = read_json(eval_dir / "report.json")
    models = report["ceiling"]["models"]
    assert "linear: hidden + q + H(q) + embedding of x" in models  # the tiny draft's embedding
    assert report["ceiling"]["rows"]["test"] == report["rows"]
    text = (eval_dir / "report.md").read_text()
    assert "Below the target AUC, and why" in text and "What the draft's features" in text
    assert text.count("< 1.01") == len(VERIFIERS)  # one line per verifier
    for entry in models.values():  # the probes' test AUCs on the same test prompts
        assert entry["test_auc_ci"] is None or entry["test_auc_ci"][0] <= entry["test_auc_ci"][1]


@pytest.mark.heavy  # a stage chain: make test, not test-quick
def test_the_report_has_every_mix_and_the_feature_ablation(chained) -> None:
    root = chained["root"]
    run_stage(
        compose_at(
            root,
            "stage=evaluate",
            "experiment=chat",
            "evaluate.ablation.enabled=true",
            "evaluate.ablation.embedding=true",
            "evaluate.bootstrap.resamples=50",
        )
    )
    eval_dir = Path(chained["cfg"].experiment_dir) / "eval"
    report = read_json(eval_dir / "report.json")
    by_mix = report["by_mix"]
    assert set(by_mix) <= {"original", "draft", "target", "interleaved", "all"}
    assert sum(by_mix[m]["rows"] for m in by_mix if m != "all") == report["rows"]
    assert by_mix["all"]["auc"] == report["auc"]
    for mix in set(by_mix) & {"original", "interleaved"}:
        assert f"verifier_lam1.2 on {mix}" in " ".join(report["verifier_by_mix"])
    ablation = report["ablation"]
    assert ablation["groups"] == list(feature_order())  # the records give every group
    assert not ablation["skipped"]
    assert ablation["rows"]["test"] == report["rows"] and ablation["seconds"] > 0
    assert set(ablation["drop_one"]) == set(ablation["groups"])
    text = (eval_dir / "report.md").read_text()
    assert "Every predictor on each prefix mix" in text and "Feature ablation" in text


@pytest.mark.heavy  # a stage chain: make test, not test-quick
def test_ceiling_leaves_out_an_embedding_it_cannot_load(chained, monkeypatch) -> None:
    from sprinter_train.evaluation import ceiling_report as module
    from sprinter_train.harvest.reader import open_records

    def other_draft(*args, **kwargs):
        raise ValueError("the token_embedding feature needs the harvest's draft")

    monkeypatch.setattr(module, "make_embedder", other_draft)
    cfg = compose_at(chained["root"], "stage=evaluate", "experiment=chat")
    out = module.ceiling_report(cfg, open_records(cfg.experiment_dir))
    assert "harvest's draft" in out["embedding_skipped"]
    assert not any("embedding" in name for name in out["models"])
    assert "linear: hidden + q + H(q)" in out["models"]


@dataclass
class OneDraft(Method):
    """A method that exists only in this test: one draft a row, verified (so lossless), and
    a record score, q(x) to a power, for evaluate to rank."""

    traits: ClassVar[Traits] = Traits(
        lossless=True,
        greedy_exact=True,
        needs=frozenset(),
        law_computed=False,
        exports=False,
        rivals=("sd",),
        record_score=RecordScore(
            "one_draft_q",
            ("q",),
            lambda columns, settings: np.asarray(columns["q"]) ** float(settings["power"]),
            lambda settings: f"q(x)^{settings['power']}",
        ),
    )

    power: float
    name: str = "one_draft"

    def round(self, engine, batch):
        return gamma_round(engine, batch, 1)


@pytest.mark.heavy  # a stage chain: make test, not test-quick
def test_a_method_from_one_class_and_one_config_runs_through_bench_and_evaluate(chained) -> None:
    """OneDraft and its config node, added here and nowhere else: the bench runs it beside
    target_only and records its traits, and evaluate scores its rule on the records."""
    root = chained["root"]
    for kind in ("artifacts", "checkpoints"):
        shutil.copytree(root / kind / "chat", root / kind / "newmethod")
    node = {"_target_": f"{__name__}.OneDraft", "power": 2.0}
    for stage, extra in (
        ("bench", ["bench.methods=[target_only,one_draft]", "bench.judge.enabled=false"]),
        ("evaluate", []),
    ):
        cfg = compose_at(root, f"stage={stage}", "experiment=newmethod", *extra)
        with open_dict(cfg):
            cfg.methods.one_draft = node
        run_stage(cfg)
    bench = read_json(root / "artifacts" / "newmethod" / "bench" / "results.json")
    row = bench["methods"]["one_draft"]
    assert row["draft_calls"] > 0 and row["tokens"] > 0 and not bench["skipped"]
    assert bench["traits"]["one_draft"]["rivals"] == ["sd"]
    assert bench["settings"]["one_draft"]["power"] == 2.0
    report = read_json(root / "artifacts" / "newmethod" / "eval" / "report.json")
    # q(x)^2 ranks the rows as q(x) does: the same AUC
    assert report["auc"]["one_draft_q"] == pytest.approx(report["auc"]["draft_q"])


def test_a_method_class_without_traits_is_refused() -> None:
    """A class that declares no traits (here: inherits Method's annotation only) cannot run."""
    node = {"_target_": f"{__name__}.NoTraits"}
    with pytest.raises(MethodError, match="declares no traits: give it"):
        traits_of(node, "no_traits")
    claims = {"_target_": f"{__name__}.ClaimsALaw"}
    with pytest.raises(MethodError, match="law_computed but it defines no first_draft_keeps"):
        traits_of(claims, "claims_a_law")
    with pytest.raises(MethodError, match="is not a Method"):
        traits_of({"_target_": "collections.OrderedDict"}, "odd")
    with pytest.raises(TypeError, match="record_score"):  # every field is required
        Traits(
            lossless=True,
            greedy_exact=True,
            needs=frozenset(),
            law_computed=False,
            exports=False,
            rivals=(),
        )  # type: ignore[call-arg]
    cfg = compose_config("stage=bench")
    with open_dict(cfg):
        cfg.methods.no_traits = node
    with pytest.raises(MethodError, match="no_traits"):
        predictor_descriptions(cfg, {})


class NoTraits(Method):
    def round(self, engine, batch):
        return gamma_round(engine, batch, 0)


class ClaimsALaw(NoTraits):
    """Says the bench can compute its first token's law, but gives no first-draft rule."""

    traits: ClassVar[Traits] = dataclasses.replace(OneDraft.traits, law_computed=True)
