"""Stages run through the registry on tiny models, as a user would run them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM

from sprinter_train.__main__ import run_stage
from sprinter_train.core.distributions import implied_speedup
from sprinter_train.distill.output import model_card
from sprinter_train.models.tiny import build_tiny_model, build_tiny_tokenizer
from sprinter_train.stages import train as train_stage
from tests.distill_helpers import TINY_DISTILL


@pytest.mark.heavy
def test_distill_stage_exports_a_loadable_draft_and_resumes(compose_cfg, tmp_path: Path) -> None:
    out = tmp_path / "draft"
    common = [*TINY_DISTILL, f"distill.output_dir={out}", "distill.passes_per_shard=2"]
    first = run_stage(compose_cfg("stage=distill", "distill.max_tokens=768", *common))
    assert first["tokens"] == 768
    draft = AutoModelForCausalLM.from_pretrained(out)
    assert type(draft).__name__ == "SprinterDraftForCausalLM"
    q = torch.softmax(draft(input_ids=torch.tensor([[5, 6, 7]])).logits.float(), -1)
    assert int((q[0, -1] > 0).sum()) == 64
    assert "## Recipe" in (out / "README.md").read_text()
    assert (out / "training_curve.png").stat().st_size > 0
    second = run_stage(compose_cfg("stage=distill", "distill.max_tokens=1024", *common))
    assert second["tokens"] == 1024  # continued from 768, not restarted
    # a fresh machine has no optimiser state: training continues from the exported model
    for state_file in (tmp_path / "artifacts").rglob("state.pt"):
        state_file.unlink()
    third = run_stage(compose_cfg("stage=distill", "distill.max_tokens=1280", *common))
    assert third["tokens"] == 1280
    state = json.loads((out / "training_state.json").read_text())["state"]
    assert [p["tokens"] for p in state["curve"]] == [256, 512, 768, 1024, 1280]


def test_the_distill_model_card_names_the_teacher_and_data_of_the_config(compose_cfg) -> None:
    cfg = compose_cfg(
        "stage=distill",
        "models.target.gguf_file=Other-1B-Chat.Q8_0.gguf",
        "data.name=my_chats",
    )
    dcfg = OmegaConf.to_container(cfg.distill, resolve=True)
    card = model_card(dcfg, {"curve": [], "tokens": 0, "seconds": 0.0}, cfg)
    assert card.startswith("# Other-1B-Chat draft for speculative decoding")
    assert "most frequent\n  my_chats tokens" in card and "- data: my_chats (train split" in card
    assert "SmolLM2" not in card and "ShareGPT" not in card


def test_distill_refuses_data_its_corpus_does_not_read(compose_cfg) -> None:
    with pytest.raises(ValueError, match="from sharegpt_package conversations.*data=humaneval"):
        run_stage(compose_cfg("stage=distill", "models=tiny_random", "data=humaneval"))


def test_draft_eval_writes_the_documented_keys(compose_cfg, tmp_path: Path) -> None:
    cfg = compose_cfg(
        "stage=draft_eval",
        "models=tiny_random",
        "experiment=tiny",
        "draft_eval.num_sequences=3",
        "draft_eval.seq_len=48",
        "draft_eval.latency_reps=3",
        "draft_eval.gammas=[1,2,3]",
        "draft_eval.context_tokens=16",
        "draft_eval.floor_reps=3",
    )
    result = run_stage(cfg)
    saved = json.loads((Path(cfg.experiment_dir) / "draft_eval.json").read_text())
    for key in ("alpha", "greedy_agreement", "c", "verify_cost", "implied_speedup", "best_gamma"):
        assert key in saved
    assert 0 < saved["alpha"] < 1 and 0 <= saved["greedy_agreement"] <= 1
    assert set(saved["alpha_by_setting"]) == {"default", "T=1"}
    assert saved["c"] > 0 and saved["positions"] > 0
    for gamma in (1, 2, 3):
        expected = implied_speedup(
            result["alpha"], gamma, result["c"], result["verify_cost"][gamma]
        )
        assert saved["implied_speedup"][str(gamma)] == pytest.approx(expected)
    assert saved["best_gamma"] == max(result["implied_speedup"], key=result["implied_speedup"].get)
    best = result["implied_speedup"][result["best_gamma"]]
    assert saved["targets_met"] == {
        "alpha": result["alpha"] >= 0.45,
        "c": result["c"] <= 0.12,
        "implied_speedup": best >= 1.2,
    }
    floor = saved["step_floor"]
    for key in ("floor_ms", "model_step_ms", "engine_step_ms", "target_step_ms"):
        assert floor[key] > 0
    assert floor["targets_met"] == {
        "engine_over_floor": floor["engine_step_ms"] / floor["floor_ms"] <= 1.3,
        "c_engine": floor["engine_step_ms"] / floor["target_step_ms"] <= 0.06,
    }


def test_a_tokenizer_mismatch_stops_draft_eval_before_any_work(compose_cfg) -> None:
    cfg = compose_cfg("stage=draft_eval", "models=tiny_random", "+models.draft.tokenizer.shift=7")
    with pytest.raises(RuntimeError, match="disagree"):
        run_stage(cfg)


def test_draft_eval_writes_its_figures_into_the_model_card(compose_cfg, tmp_path: Path) -> None:
    folder = tmp_path / "draft"
    build_tiny_model({"head_vocab_size": 64, "embed_rank": 8}, seed=2).save_pretrained(folder)
    build_tiny_tokenizer().save_pretrained(folder)
    (folder / "README.md").write_text("# card\n\n## Recipe\nx\n")
    overrides = [
        "stage=draft_eval",
        "models=tiny_random",
        f"models.draft.path={folder}",
        "draft_eval.num_sequences=2",
        "draft_eval.seq_len=40",
        "draft_eval.latency_reps=2",
        "draft_eval.gammas=[1]",
        "draft_eval.context_tokens=8",
        "draft_eval.floor_reps=2",
        "draft_eval.update_model_card=true",
    ]
    run_stage(compose_cfg(*overrides))
    run_stage(compose_cfg(*overrides))  # a second run replaces the section, it does not append
    card = (folder / "README.md").read_text()
    assert card.startswith("# card") and "## Recipe" in card
    assert card.count("## Measured") == 1 and "best gamma 1" in card
    assert "the floor)" in card and "target engine_over_floor <= 1.3" in card


def test_stage_all_trains_every_lambda_then_the_soft_label_verifier(
    compose_cfg, monkeypatch
) -> None:
    calls = []

    def fake_train(cfg) -> dict:
        labels = train_stage.labels_of(cfg)
        calls.append([label.name for label in labels])
        return {f"verifier_{label.name}": {"lam": label.lam} for label in labels}

    monkeypatch.setattr(train_stage, "run", fake_train)
    cfg = compose_cfg("stage=all", "all_steps=[train]")
    result = run_stage(cfg)
    assert calls == [["lam1", "lam1.2", "lam1.5"], ["accept"]]  # one stage run per label
    assert cfg.train.label == "ratio"  # each run had its own copy of the config
    assert list(result) == ["train", "seconds"]
    expected = {"verifier_lam1", "verifier_lam1.2", "verifier_lam1.5", "verifier_accept"}
    assert set(result["train"]) == expected
    assert all(set(r) == {"lam", "stage_seconds"} for r in result["train"].values())
    one = run_stage(
        compose_cfg("stage=all", "all_steps=[train]", "train.lam=1.2", "train.all_labels=[ratio]")
    )
    assert calls[-1] == ["lam1.2"] and set(one["train"]) == {"verifier_lam1.2"}


def test_stage_all_refuses_an_empty_step_list(compose_cfg) -> None:
    with pytest.raises(ValueError, match=r"all_steps=\[\] is out of range: a non-empty list"):
        run_stage(compose_cfg("stage=all", "all_steps=[]"))
