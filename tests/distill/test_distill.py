"""Distillation on tiny models: the loss falls, the state resumes, the export loads."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sprinter_train.core.io import save_npz
from sprinter_train.distill.losses import distill_loss, slot_map
from sprinter_train.distill.trainer import heldout_alpha, load_checkpoint, train
from sprinter_train.models.student_init import build_student
from sprinter_train.models.tiny import build_tiny_model

CPU = torch.device("cpu")


def tiny_cfg(**overrides) -> dict:
    cfg = {
        "role": "draft",
        "max_minutes": 5,
        "max_tokens": 4 * 16 * 32,
        "eval_every_shards": 2,
        "teacher": {"top_k": 8, "batch_size": 8},
        "optim": {
            "lr": 3e-3,
            "weight_decay": 0.0,
            "warmup_steps": 2,
            "batch_sequences": 4,
            "grad_clip": 1.0,
        },
        "loss": {"ce_weight": 1.0, "tv_weight": 1.0},
        "student": {"init": "target_layers", "init_layers": [0], "embed_rank": 16},
    }
    cfg.update(overrides)
    return cfg


def make_corpus(folder, n_shards: int = 2, rows: int = 16, seq_len: int = 32):
    rng = np.random.default_rng(0)
    paths = []
    for i in range(n_shards):
        # a repetitive language so the teacher is predictable and the student can learn it
        start = rng.integers(0, 10, size=(rows, 1))
        tokens = ((start + np.arange(seq_len)) % 10 + 20).astype(np.uint16)
        paths.append(save_npz(folder / f"train-{i:05d}.npz", tokens=tokens))
    return paths


@pytest.fixture
def teacher():
    # a large init makes the teacher confident, so there is something definite to learn
    return build_tiny_model({"num_hidden_layers": 2, "initializer_range": 0.3}, seed=1)


def test_topk_loss_matches_brute_force_kl_and_overlap() -> None:
    torch.manual_seed(0)
    p_logits, q_logits = torch.randn(5, 12), torch.randn(5, 12)
    head = torch.arange(12)
    logp = torch.log_softmax(p_logits, -1)
    values, indices = logp.topk(12, -1)  # k = V: the top-k loss is the exact loss
    loss, parts = distill_loss(q_logits, values, indices, slot_map(head, 12), 1.0, 0.0)
    p, log_q = logp.exp(), torch.log_softmax(q_logits, -1)
    kl = (p * (logp - log_q)).sum(-1).mean()
    entropy = -(p * logp).sum(-1).mean()
    torch.testing.assert_close(loss, kl + entropy)
    torch.testing.assert_close(
        torch.tensor(parts["overlap_topk"]), torch.minimum(p, log_q.exp()).sum(-1).mean()
    )


def test_loss_ignores_teacher_tokens_outside_the_head() -> None:
    head = torch.tensor([0, 2, 4])
    slots = slot_map(head, 6)
    values = torch.log(torch.tensor([[0.5, 0.5]]))
    outside = distill_loss(torch.zeros(1, 3), values, torch.tensor([[1, 3]]), slots)[0]
    assert float(outside) == pytest.approx(1.0)  # no reachable mass: ce 0, overlap 0


def test_distill_loss_decreases_and_alpha_rises(tmp_path, teacher) -> None:
    corpus = make_corpus(tmp_path / "corpus")
    student = build_student(teacher, torch.arange(128), tiny_cfg()["student"], seed=0)
    heldout = torch.from_numpy(np.load(corpus[0])["tokens"][:4].astype(np.int64))
    before = heldout_alpha(student, teacher, heldout)
    state = train(
        student,
        teacher,
        corpus,
        tmp_path / "teacher",
        tmp_path / "state.pt",
        tiny_cfg(max_tokens=8 * 16 * 32),
        heldout,
        CPU,
        None,
    )
    losses = [point["loss"] for point in state.curve]
    assert losses[-1] < 0.8 * losses[0]
    assert heldout_alpha(student, teacher, heldout) > before


def test_training_resumes_where_it_stopped(tmp_path, teacher) -> None:
    corpus = make_corpus(tmp_path / "corpus")
    heldout = torch.from_numpy(np.load(corpus[0])["tokens"][:2].astype(np.int64))
    ckpt = tmp_path / "state.pt"
    student = build_student(teacher, torch.arange(64), tiny_cfg()["student"], seed=0)
    train(
        student,
        teacher,
        corpus,
        tmp_path / "teacher",
        ckpt,
        tiny_cfg(max_tokens=2 * 512),
        heldout,
        CPU,
        None,
    )
    resume = load_checkpoint(ckpt)
    assert resume["state"]["tokens"] == 2 * 512 and resume["state"]["visits"] == 2
    student.load_state_dict(resume["student"])
    state = train(
        student,
        teacher,
        corpus,
        tmp_path / "teacher",
        ckpt,
        tiny_cfg(max_tokens=3 * 512),
        heldout,
        CPU,
        resume,
    )
    assert state.tokens == 3 * 512 and state.visits == 3 and len(state.curve) == 3
    assert sorted(p.name for p in (tmp_path / "teacher").iterdir()) == [
        "train-00000-top8.npz",
        "train-00001-top8.npz",
    ]


def test_corrupt_checkpoint_starts_clean(tmp_path) -> None:
    ckpt = tmp_path / "state.pt"
    ckpt.write_bytes(b"not a checkpoint")
    assert load_checkpoint(ckpt) is None


def test_lr_warms_up_holds_then_anneals_to_the_final_fraction() -> None:
    from sprinter_train.distill.trainer import lr_at

    assert lr_at(0, 1.0, 10, 1.0, 0.25, 0.1) == pytest.approx(0.1)
    assert lr_at(50, 1.0, 10, 0.5, 0.25, 0.1) == pytest.approx(1.0)
    assert lr_at(50, 1.0, 10, 0.125, 0.25, 0.1) == pytest.approx(0.55)
    assert lr_at(50, 1.0, 10, 0.0, 0.25, 0.1) == pytest.approx(0.1)
    assert lr_at(50, 1.0, 10, 0.0, 0.0, 0.1) == pytest.approx(1.0)


def test_changing_passes_per_shard_on_resume_keeps_the_shard_cursor(tmp_path, teacher) -> None:
    corpus = make_corpus(tmp_path / "corpus", n_shards=3)
    heldout = torch.from_numpy(np.load(corpus[0])["tokens"][:2].astype(np.int64))
    ckpt = tmp_path / "state.pt"
    student = build_student(teacher, torch.arange(64), tiny_cfg()["student"], seed=0)
    two = tiny_cfg(max_tokens=2 * 512, passes_per_shard=2)
    state = train(student, teacher, corpus, tmp_path / "t", ckpt, two, heldout, CPU, None)
    assert (state.shard, state.shard_passes) == (1, 0)  # shard 0 seen twice, shard 1 next
    three = tiny_cfg(max_tokens=4 * 512, passes_per_shard=3)
    state = train(
        student, teacher, corpus, tmp_path / "t", ckpt, three, heldout, CPU, load_checkpoint(ckpt)
    )
    assert (state.shard, state.shard_passes) == (1, 2)  # not back to shard 0


def test_sparse_saves_still_write_the_last_state(tmp_path, teacher, monkeypatch) -> None:
    """save_every_visits=4 over 3 visits: no save at visits 1-2, one at the run's last visit."""
    import sprinter_train.distill.trainer as trainer

    saved: list[int] = []
    real = trainer.save_checkpoint
    monkeypatch.setattr(
        trainer,
        "save_checkpoint",
        lambda path, student, opt, state, recipe: (
            saved.append(state.visits),
            real(path, student, opt, state, recipe),
        ),
    )
    corpus = make_corpus(tmp_path / "corpus")
    heldout = torch.from_numpy(np.load(corpus[0])["tokens"][:2].astype(np.int64))
    student = build_student(teacher, torch.arange(64), tiny_cfg()["student"], seed=0)
    cfg = tiny_cfg(max_tokens=3 * 512, save_every_visits=4)
    train(student, teacher, corpus, tmp_path / "t", tmp_path / "s.pt", cfg, heldout, CPU, None)
    assert saved == [3] and load_checkpoint(tmp_path / "s.pt")["state"]["visits"] == 3
