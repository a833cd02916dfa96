"""A lean forward for the distilled draft, over a KV cache written in place.

At batch 1 on a CPU a draft step should cost about what streaming its weights costs
(bench/timing/step_floor.py). The generic Hugging Face forward adds, every step, a causal-mask
builder, a rotary embedding recomputed from scratch, a dynamic cache that concatenates
(copies) every layer's keys and values, and a module call per norm and projection; for a
two-layer student that overhead is as large as the arithmetic. `LeanDraft` runs the same
Llama arithmetic, in the same order and dtype, as plain tensor operations: rotary tables
computed once (and grown when needed), the visibility mask taken from the caller, and the
keys and values written into preallocated buffers (`StaticKV`, static_kv.py).

On a CPU (float32, and bf16 where native), the draft's matrices are also kept prepacked in
oneDNN's blocked layout (`pack`, weight_packing.py): F.linear hands oneDNN the plain (out,
in) weight on every call, and at batch 1 its bf16 products are slower than the packed ones,
most of all with the weights in cache (the same values, checked bit for bit;
docs/results/design-figures.md, "Prepacked linears"; float32: `models.packed`).

Whether a loaded model decodes through it: `supports_lean`, `allow_lean`, `uses_lean`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

# StaticKV: decoding/ (cache/rows.py, runner/backends.py) imports it from here too
from sprinter_train.models.static_kv import KVLayer, StaticKV
from sprinter_train.models.weight_packing import pack, project

LEAN_ALLOWED = "sprinter_lean_allowed"  # the attribute `allow_lean` sets on a model


def supports_lean(model: nn.Module) -> bool:
    """Whether `LeanDraft` computes what this model's own forward does: the distilled draft
    (a Llama: default rotary embedding, no biases, SiLU MLP, eager or SDPA attention), also
    when loaded from a folder's copy of student.py."""
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) != "sprinter_draft":
        return False
    rope = getattr(config, "rope_parameters", None) or {}
    return (
        rope.get("rope_type", "default") == "default"
        and not getattr(config, "attention_bias", False)
        and not getattr(config, "mlp_bias", False)
        and getattr(config, "hidden_act", None) == "silu"
        and getattr(config, "_attn_implementation", None) in (None, "sdpa", "eager")
        and getattr(model.get_output_embeddings(), "weight", None) is not None
    )


def allow_lean(model: nn.Module, allowed: bool) -> None:
    """Record `models.lean_draft` on a loaded model: False keeps its decoding forwards on its
    own forward even where `supports_lean` holds."""
    setattr(model, LEAN_ALLOWED, allowed)


def uses_lean(model: nn.Module) -> bool:
    """Whether a runner left to choose decodes this model through `LeanDraft`: it supports the
    lean forward and its loader allowed it (models never marked are allowed)."""
    return bool(getattr(model, LEAN_ALLOWED, True)) and supports_lean(model)


@dataclass
class LayerWeights:
    """One decoder layer's tensors as the lean forward uses them: q, k and v stacked into one
    matrix and gate and up into another (one matmul each: the same dot products, so the same
    values, for fewer calls), every matrix through `pack`, the norms the model's own."""

    input_norm: torch.Tensor
    qkv: torch.Tensor
    o: torch.Tensor
    post_norm: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor


class LeanDraft:
    """The draft's forward as plain tensor operations over a `StaticKV`.

    It holds the model's parameter objects, so in-place changes (an optimiser step,
    `load_state_dict`, `.to()`) reach it; the stacked and packed matrices are copies, rebuilt
    when a source's version counter or storage changed. Parameters replaced by new objects are
    not seen: build a new one then. `held[r, s]` says whether cached slot s holds one of row
    r's tokens; a query sees those and the block's slots up to its own. A row feeds its
    tokens first in the block, so a real query never sees an empty block slot; a padding query
    (past the row's count) sees its own slot, stays finite, and is never read.
    """

    def __init__(self, model: nn.Module) -> None:
        if not supports_lean(model):
            raise ValueError("LeanDraft runs the distilled draft (model_type sprinter_draft)")
        config = model.config
        self.model = model
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(config.num_key_value_heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // self.heads)
        self.intermediate = int(config.intermediate_size)
        self.scale = self.head_dim**-0.5
        self.eps = float(config.rms_norm_eps)
        base = float(config.rope_parameters["rope_theta"])
        steps = torch.arange(0, self.head_dim, 2, dtype=torch.float)
        self.inv_freq = 1.0 / (base ** (steps / self.head_dim))  # as LlamaRotaryEmbedding
        # (positions, 2, head dim) in the model's dtype: cos, then sin with its first half
        # negated (see _grow_tables); one lookup a step
        self._rope_table: torch.Tensor | None = None
        self._decoder = list(model.model.layers)
        embedding = model.model.embed_tokens
        factorised = hasattr(embedding, "low")  # FactorizedEmbedding: a lookup, then up
        self._lookup = embedding.low.weight if factorised else embedding.weight
        self._up = embedding.up.weight if factorised else None
        self._final_norm = model.model.norm.weight
        self._head = model.get_output_embeddings().weight
        self._sources = [  # every matrix the lean forward copies (stacks or packs)
            p
            for layer in self._decoder
            for p in (
                layer.self_attn.q_proj.weight,
                layer.self_attn.k_proj.weight,
                layer.self_attn.v_proj.weight,
                layer.self_attn.o_proj.weight,
                layer.mlp.gate_proj.weight,
                layer.mlp.up_proj.weight,
                layer.mlp.down_proj.weight,
            )
        ] + [w for w in (self._up, self._head) if w is not None]
        self._stamp: list[tuple[int, int]] = []
        self._layers: list[LayerWeights] = []
        self._packed_up, self._packed_head = self._up, self._head  # through `pack` once used
        head = model.get_output_embeddings()
        self.head_ids: torch.Tensor | None = None  # a restricted head's ids, ascending
        self._head_order: torch.Tensor | None = None  # the permutation into that order
        if hasattr(head, "token_ids"):
            ids = head.token_ids
            order = ids.argsort()
            self.head_ids = ids[order]
            if not bool((order == torch.arange(len(ids), device=ids.device)).all()):
                self._head_order = order

    # -- the forward -------------------------------------------------------------------------

    @torch.inference_mode()
    def forward(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        held: torch.Tensor,
        kv: StaticKV,
        hidden_layer: int = -1,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append the block ids (rows, width) at `positions` to `kv`, whose slots `held`
        (rows, slots) marks; return the final normed hidden states and those of
        `hidden_layer` (as `models.body.body`: -1 the final, k >= 0 `hidden_states[k]`),
        both (rows, width, d)."""
        layers = self._weights()
        width = ids.shape[1]
        while len(kv.layers) < len(layers):
            kv.layers.append(KVLayer())
        x = self._embed(ids)
        cos, sin = self._rope(positions, held.shape[1] + width)
        mask = self._mask(held, width)
        chosen = x if hidden_layer == 0 else None
        for index, weights in enumerate(layers):
            x = self._layer(weights, x, cos, sin, mask, kv.layers[index])
            if hidden_layer == index + 1 and index + 1 < len(layers):
                chosen = x
        final = self._norm(self._final_norm, x)
        return final, final if chosen is None else chosen

    def head_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits over a restricted head's tokens in ascending vocabulary order (`head_ids`),
        or over the whole vocabulary for a full head."""
        if not self._stamp or self._stamp[-1] != (self._head._version, self._head.data_ptr()):
            self._weights()  # the head is the last source: the rest waits for the forward
        logits = project(hidden, self._packed_head)
        if self._head_order is not None:
            logits = logits[..., self._head_order]
        return logits

    # -- its parts ---------------------------------------------------------------------------

    def _weights(self) -> list[LayerWeights]:
        """The layers' weights, rebuilt with the packed up-projection and head if a copied
        source changed since last time (the rotary table too: a cast or move changes every
        source's storage)."""
        stamp = [(p._version, p.data_ptr()) for p in self._sources]
        if stamp != self._stamp:
            with torch.no_grad():
                self._layers = [self._stack(layer) for layer in self._decoder]
                self._packed_up = None if self._up is None else pack(self._up)
                self._packed_head = pack(self._head)
            self._rope_table = None
            self._stamp = stamp
        return self._layers

    @staticmethod
    def _stack(layer: nn.Module) -> LayerWeights:
        attn, mlp = layer.self_attn, layer.mlp
        return LayerWeights(
            layer.input_layernorm.weight,
            pack(torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])),
            pack(attn.o_proj.weight),
            layer.post_attention_layernorm.weight,
            pack(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])),
            pack(mlp.down_proj.weight),
        )

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        x = F.embedding(ids, self._lookup)
        return x if self._packed_up is None else project(x, self._packed_up)

    def _norm(self, weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """LlamaRMSNorm: in float32, cast back, then scaled by the weight in the model dtype
        (in place: the cast is a new tensor, or in float32 the product is)."""
        h = x.float()  # x itself in float32: not to be written to
        scale = h.pow(2).mean(-1, keepdim=True).add_(self.eps).rsqrt_()
        return (h * scale).to(x.dtype).mul_(weight)

    def _rope(self, positions: torch.Tensor, needed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin at each position: (rows, width, 1, head dim). A position is
        below `needed` (slots held plus the block: a row's tokens sit in increasing slots), so
        the table grows from a host-side number and no step waits for the device."""
        table = self._rope_table
        if table is None or table.shape[0] < needed:
            table = self._grow_tables(max(needed, 2 * (0 if table is None else table.shape[0])))
        both = table[positions]
        return both[:, :, :1], both[:, :, 1:]

    def _grow_tables(self, size: int) -> torch.Tensor:
        """LlamaRotaryEmbedding's cos and sin (float32, cast to the model dtype) for positions
        0 .. size - 1. rotate_half(x) * sin is swap_halves(x) * (-sin_1, sin_2): the sign is
        folded into the table, which is exact."""
        weight = self._final_norm
        freqs = torch.arange(size, dtype=torch.float)[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        half = self.head_dim // 2
        cos = emb.cos().to(weight.dtype)
        sin = emb.sin().to(weight.dtype)
        sin[:, :half] = -sin[:, :half]
        self._rope_table = torch.stack([cos, sin], dim=1).to(weight.device)
        return self._rope_table

    @staticmethod
    def _mask(held: torch.Tensor, width: int) -> torch.Tensor:
        """(rows, 1, width, slots + width) bool: the row's cached slots, then the block's
        slots up to the query's own (causal within the block)."""
        if width == 1:
            return F.pad(held, (0, 1), value=True).view(held.shape[0], 1, 1, -1)
        block = torch.ones((width, width), dtype=torch.bool, device=held.device).tril()
        cached = held[:, None, :].expand(-1, width, -1)
        return torch.cat([cached, block.expand(held.shape[0], -1, -1)], dim=-1)[:, None]

    def _layer(
        self,
        weights: LayerWeights,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor,
        cache: KVLayer,
    ) -> torch.Tensor:
        """LlamaDecoderLayer: x + attention(norm(x)), then + mlp(norm(x))."""
        rows, width, _ = x.shape
        qkv = project(self._norm(weights.input_norm, x), weights.qkv)
        qkv = qkv.view(rows, width, self.heads + 2 * self.kv_heads, self.head_dim)
        rotated = self._rotate(qkv[:, :, : self.heads + self.kv_heads], cos, sin)
        q = rotated[:, :, : self.heads]
        keys, values = cache.append(
            rotated[:, :, self.heads :].transpose(1, 2),
            qkv[:, :, self.heads + self.kv_heads :].transpose(1, 2),
        )
        # the residual sums in place on the new projections (x + y == y + x, bit for bit)
        x = project(self._attend(q, keys, values, mask), weights.o).add_(x)
        gate_up = project(self._norm(weights.post_norm, x), weights.gate_up)
        h = F.silu(gate_up[..., : self.intermediate]).mul_(gate_up[..., self.intermediate :])
        return project(h, weights.down).add_(x)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x * cos + rotate_half(x) * sin, with the sign of rotate_half in `sin`: the halves
        swapped by one roll, the second product and the sum in place on new tensors."""
        return (x * cos).add_(x.roll(self.head_dim // 2, -1).mul_(sin))

    def _attend(
        self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """Grouped-query attention without repeating keys: the query heads that share a key
        head become extra query rows of it. q (rows, width, heads, dim) -> (rows, width, d)."""
        rows, width = q.shape[:2]
        group = self.heads // self.kv_heads
        q = q.transpose(1, 2).reshape(rows, self.kv_heads, group * width, self.head_dim)
        if width > 1:
            mask = mask.expand(rows, group, width, mask.shape[-1]).reshape(
                rows, 1, group * width, mask.shape[-1]
            )
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.scale)
        out = out.reshape(rows, self.heads, width, self.head_dim).transpose(1, 2)  # CUDA: strided
        return out.reshape(rows, width, self.heads * self.head_dim)
