"""Build a fresh student from the target: layers copied from chosen target layers (or PCA-
narrowed random layers), SVD-factorised embedding, head restricted to frequent tokens.

Initialising from target layers learned faster per token than a random narrow student
(alpha 0.31 vs 0.23 at equal tokens in our measurements), so it is the default recipe.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import PreTrainedModel

from sprinter_train.models.student import SprinterDraftConfig, SprinterDraftForCausalLM


def _target_embedding(target: PreTrainedModel) -> torch.Tensor:
    return target.get_input_embeddings().weight.detach().float()


def _target_head(target: PreTrainedModel) -> torch.Tensor:
    return target.get_output_embeddings().weight.detach().float()


def build_student(
    target: PreTrainedModel,
    head_token_ids: torch.Tensor | None,
    recipe: dict[str, Any],
    seed: int = 0,
) -> SprinterDraftForCausalLM:
    """Create the student described by `recipe` (see conf/distill/default.yaml: student)."""
    torch.manual_seed(seed)
    base = target.config.to_dict()
    init = recipe.get("init", "target_layers")
    layers = list(recipe.get("init_layers") or [])
    hidden = base["hidden_size"] if init == "target_layers" else int(recipe["hidden_size"])
    settings = {
        key: base[key]
        for key in (
            "vocab_size",
            "rms_norm_eps",
            "max_position_embeddings",
            "bos_token_id",
            "eos_token_id",
            "pad_token_id",
            "hidden_act",
        )
        if key in base
    }
    settings["rope_parameters"] = base.get("rope_parameters") or {
        "rope_type": "default",
        "rope_theta": base.get("rope_theta", 10000.0),
    }
    if init == "target_layers":
        settings.update(
            hidden_size=hidden,
            intermediate_size=base["intermediate_size"],
            num_attention_heads=base["num_attention_heads"],
            num_key_value_heads=base["num_key_value_heads"],
            head_dim=base.get("head_dim") or hidden // base["num_attention_heads"],
            num_hidden_layers=len(layers),
        )
    elif init == "pca":
        settings.update(
            hidden_size=hidden,
            intermediate_size=int(recipe["intermediate_size"]),
            num_attention_heads=int(recipe["num_attention_heads"]),
            num_key_value_heads=int(recipe["num_key_value_heads"]),
            head_dim=hidden // int(recipe["num_attention_heads"]),
            num_hidden_layers=int(recipe["num_layers"]),
        )
    else:
        raise ValueError(f"unknown student init {init!r}: use target_layers or pca")
    head_k = int(head_token_ids.numel()) if head_token_ids is not None else None
    config = SprinterDraftConfig(
        embed_rank=recipe.get("embed_rank"), head_vocab_size=head_k, **settings
    )
    student = SprinterDraftForCausalLM(config)

    embedding = _target_embedding(target)
    head = _target_head(target)
    if init == "pca":  # project the target's embedding space onto its top principal directions
        _, _, v = torch.linalg.svd(embedding - embedding.mean(0), full_matrices=False)
        basis = v[:hidden].t()  # d_target x hidden
        embedding, head = embedding @ basis, head @ basis
    with torch.no_grad():
        if config.embed_rank:
            u, s, vt = torch.linalg.svd(embedding, full_matrices=False)
            r = config.embed_rank
            student.model.embed_tokens.low.weight.copy_(u[:, :r] * s[:r])
            student.model.embed_tokens.up.weight.copy_(vt[:r].t())
        else:
            student.model.embed_tokens.weight.copy_(embedding)
        rows = head[head_token_ids] if head_token_ids is not None else head
        student.lm_head.weight.copy_(rows)
        if head_token_ids is not None:
            student.lm_head.token_ids.copy_(head_token_ids)
        if init == "target_layers":
            for mine, source in enumerate(layers):
                student.model.layers[mine].load_state_dict(target.model.layers[source].state_dict())
            student.model.norm.load_state_dict(target.model.norm.state_dict())
    return student.float()
