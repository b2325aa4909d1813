"""The encoder's self-attention as one fused kernel, for QUANTIZE=int8 models only.

ParlAI's MultiHeadAttention runs the encoder's self-attention as copies of every head, a matrix
product, a masked write, a softmax, a second product and another copy, each over the whole
(batch x heads x length x length) score tensor. `F.scaled_dot_product_attention` does the same
sum in one pass without materialising the scores: the encoder 1.15x faster on BlenderBot-90M's
shape at batch 1 and 8, 1.4x at 32, int8, one thread (docs/benchmarks.md).

It rounds differently, so the default (fp32, ParlAI's replies bit for bit) keeps ParlAI's
module; an int8 model's replies differ from ParlAI's already (bench.quality). A bf16 model keeps
it too: PyTorch's CPU kernel for bf16 attention measured 6x slower than fp32's here, without AMX.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from parlai.agents.transformer.modules import (
    MultiHeadAttention,
    TransformerEncoder,
    TransformerEncoderLayer,
)

from bot.inference.fastgen import qkv


class FusedSelfAttention(torch.nn.Module):  # type: ignore[misc]
    """An encoder layer's self-attention through `F.scaled_dot_product_attention`, with the
    layer's own (quantized) projections; called as ParlAI calls its attention there."""

    def __init__(self, attn: MultiHeadAttention) -> None:
        super().__init__()
        self.n_heads = attn.n_heads
        self.dim = attn.dim
        self.q_lin, self.k_lin, self.v_lin = attn.q_lin, attn.k_lin, attn.v_lin
        self.out_lin = attn.out_lin
        # their merged product where fastgen/qkv.py merged them (then the three are its Parts)
        merged = getattr(attn, qkv.MERGED, None)
        if merged is not None:
            setattr(self, qkv.MERGED, merged)
        # the module it stands in for (`restore`), in a tuple so that it is not registered as
        # a submodule: the model's state_dict keeps one key per weight
        self.replaced = (attn,)

    def forward(
        self, query: torch.Tensor, mask: torch.Tensor, **kwargs: Any
    ) -> tuple[torch.Tensor, None, None]:
        """`mask` is (batch, length), nonzero where a token is; the result's first item is
        what ParlAI's first item is (the attended values after `out_lin`)."""
        if kwargs.get("key") is not None or kwargs.get("incr_state"):
            raise ValueError("FusedSelfAttention is the encoder's self-attention only")
        bsz, length, dim = query.shape
        dh = dim // self.n_heads

        q, k, v = (
            t.view(bsz, length, self.n_heads, dh).transpose(1, 2) for t in qkv.project(self, query)
        )
        keep = (mask != 0).view(bsz, 1, 1, length)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        return self.out_lin(out.transpose(1, 2).reshape(bsz, length, dim)), None, None


def supported(model: Any) -> bool:
    """True when the model's encoder is ParlAI's stock one, whose layers call their attention
    as `FusedSelfAttention` expects."""
    enc: Any = getattr(model, "encoder", None)
    if type(enc) is not TransformerEncoder or getattr(enc.layers, "is_model_parallel", False):
        return False
    return all(
        type(layer) is TransformerEncoderLayer and type(layer.attention) is MultiHeadAttention
        for layer in enc.layers
    )


def prepare(model: Any) -> bool:
    """Swap the encoder layers' self-attention for `FusedSelfAttention` (in place: clones share
    the model); False, and nothing changed, where the encoder is not the stock one."""
    if not supported(model):
        return False
    for layer in model.encoder.layers:
        layer.attention = FusedSelfAttention(layer.attention)
    return True


def restore(model: Any) -> None:
    """Put ParlAI's own self-attention back where `prepare` swapped it (bench.peer's
    before-the-change figures)."""
    for layer in model.encoder.layers:
        if isinstance(layer.attention, FusedSelfAttention):
            layer.attention = layer.attention.replaced[0]
