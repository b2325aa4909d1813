"""Decoder steppers: one step of the decoder for every hypothesis row, and its incremental state.

`batched_generate` asks a stepper for the next-token scores of every row (`logits`), then tells
it which row each hypothesis extends and which token it appended (`advance`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from parlai.agents.transformer.modules import (
    MultiHeadAttention,
    TransformerDecoder,
    TransformerDecoderLayer,
    TransformerFFN,
)
from parlai.agents.transformer.modules.generator import TransformerGeneratorModel
from parlai.utils.torch import neginf
from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

from bot.inference.fastgen import projection, qkv

# Below this many encoder rows, a matrix kernel may round differently for `batch` and
# `batch x beam` copies of the same rows, so the cross-attention K/V are then projected from the
# expanded encoder output, exactly as ParlAI does (cheap at that size).
COMPACT_KV_MIN_ROWS = 64


# Whether quantized and cast models merge a chat's beam slots into one cross-attention product
# (the default). use_merged_slots(False) keeps the per-slot products (`slot_products`) for them
# too: bench.peer's "before" systems (ours_batch_int8slots, ours_batch_int8prev) and the
# agreement test in tests/integration/inference/test_fastproj.py.
MERGE_SLOTS = True


def use_merged_slots(enabled: bool) -> None:
    """Set MERGE_SLOTS for this process (a model process or a benchmark's worker)."""
    global MERGE_SLOTS
    MERGE_SLOTS = enabled


# Variants that normalise after each residual (ParlAI's "postlayernorm" family).
POST_NORM = ("aiayn", "xlm", "bart")


Op = Callable[[torch.Tensor], torch.Tensor]


def direct(module: Any) -> Op:
    """`module`'s forward without nn.Module's call machinery, for the kinds a decoder step
    meets: the same op with the same arguments, so the same values. Per call this saves the
    module call and, for a dynamic int8 linear, its no-op `.to(x.dtype)`: a few µs each, 50 or
    more times a token (docs/benchmarks.md). Any other module is called as it is."""
    kind = type(module)
    if kind is torch.nn.Linear:
        weight, bias = module.weight, module.bias
        return lambda x: F.linear(x, weight, bias)
    if kind is DynamicLinear and module._packed_params.dtype == torch.qint8:
        packed = module._packed_params._packed_params
        version = module.version
        if version is None or version < 4:
            return lambda x: torch.ops.quantized.linear_dynamic(x, packed)
        return lambda x: torch.ops.quantized.linear_dynamic(x, packed, True)
    if kind is torch.nn.LayerNorm:
        shape, weight, bias, eps = module.normalized_shape, module.weight, module.bias, module.eps
        return lambda x: F.layer_norm(x, shape, weight, bias, eps)
    if kind is TransformerFFN and not module.training:
        # lin1, the nonlinearity, lin2: its dropout is the identity outside training
        lin1, act, lin2 = direct(module.lin1), module.nonlinear, direct(module.lin2)
        return lambda x: lin2(act(lin1(x)))
    return module  # type: ignore[no-any-return]


class LayerOps:
    """One decoder layer's modules as the step calls them (`direct`), looked up once per search
    instead of through nn.Module attributes at every step."""

    def __init__(self, layer: Any) -> None:
        sa, ea = layer.self_attention, layer.encoder_attention
        self.norm1, self.norm2, self.norm3 = (
            direct(layer.norm1),
            direct(layer.norm2),
            direct(layer.norm3),
        )
        # the self-attention's query, key and value: an int8 model's as one product
        # (fastgen/qkv.py), else three
        self.project = qkv.projector(sa, direct)
        self.self_out = direct(sa.out_lin)
        self.cross_q, self.cross_out = direct(ea.q_lin), direct(ea.out_lin)
        self.ffn = direct(layer.ffn)


def after_self_attention(
    ops: LayerOps,
    variant: str,
    x: torch.Tensor,
    residual: torch.Tensor,
    cross_attend: Callable[[LayerOps, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
    ck: torch.Tensor,
    cv: torch.Tensor,
) -> torch.Tensor:
    """The rest of one decoder layer once its self-attention ran: residual and norm,
    cross-attention (`cross_attend` with the chat's keys `ck` and values `cv`), FFN, in
    ParlAI's operation order (so scores stay bit for bit)."""
    post = variant in POST_NORM
    x = x + residual
    if post:
        x = ops.norm1(x)
    residual = x
    if variant == "prelayernorm":
        x = ops.norm2(x)
    x = cross_attend(ops, x, ck, cv)
    x = residual + x
    if post:
        x = ops.norm2(x)
    residual = x
    if variant == "prelayernorm":
        x = ops.norm3(x)
    x = ops.ffn(x)
    x = residual + x
    if post:
        x = ops.norm3(x)
    return x


def as_dtype(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """`t.type_as(like)` without the call where the dtypes already agree."""
    return t if t.dtype == like.dtype else t.to(like.dtype)


class GenericDecoder:
    """Any TorchGeneratorModel, stepped exactly the way ParlAI's `_generate` steps it."""

    def __init__(self, agent: Any, model: Any, encoder_states: Any, bsz: int, beam: int) -> None:
        dev = agent_device(agent)
        self.model = model
        self.agent = agent
        inds = torch.arange(bsz, device=dev).unsqueeze(1).repeat(1, beam).view(-1)
        self.encoder_states = model.reorder_encoder_states(encoder_states, inds)
        self.decoder_input = agent._get_initial_decoder_input(bsz, beam, dev)
        self.incr_state: Any = None

    def logits(self, step: int) -> torch.Tensor:
        """Scores of the next token for every row, shape (rows, vocab)."""
        score, self.incr_state = self.model.decoder(
            self.decoder_input, self.encoder_states, self.incr_state
        )
        score = self.model.output(score[:, -1:, :])
        return score.squeeze(1)

    def advance(self, rows: torch.Tensor, tokens: torch.Tensor) -> None:
        """Follow the back-pointers `rows` and append `tokens` (both shape (rows,))."""
        self.incr_state = self.model.reorder_decoder_incremental_state(self.incr_state, rows)
        self.decoder_input = torch.cat(
            [torch.index_select(self.decoder_input, 0, rows), tokens.unsqueeze(1)], dim=-1
        )


def fast_decoder_supported(model: Any) -> bool:
    """True when the model is ParlAI's stock encoder-decoder transformer, which `FastDecoder`
    re-implements op for op; anything else (swapped layers, other variants) is stepped by
    `GenericDecoder`."""
    if not isinstance(model, TransformerGeneratorModel):
        return False
    if type(model).output is not TransformerGeneratorModel.output:
        return False
    dec = model.decoder
    if type(dec) is not TransformerDecoder or getattr(dec.layers, "is_model_parallel", False):
        return False
    if type(dec).forward_embedding is not TransformerDecoder.forward_embedding:
        return False
    if dec.variant not in ("aiayn", "xlm", "prelayernorm", "bart"):
        return False
    for layer in dec.layers:
        if type(layer) is not TransformerDecoderLayer:
            return False
        if type(layer.self_attention) is not MultiHeadAttention:
            return False
        if type(layer.encoder_attention) is not MultiHeadAttention:
            return False
        for attn in (layer.self_attention, layer.encoder_attention):
            if attn.n_heads != dec.n_heads or attn.dim != dec.dim:
                return False
    return True


def bit_exact(model: Any) -> bool:
    """True when the decoder runs ParlAI's own fp32 arithmetic (no QUANTIZE, no DTYPE cast).

    Then every product keeps ParlAI's shapes, so replies stay bit for bit. A quantized or cast
    model's replies already differ from ParlAI's in the last bits (bench.quality measures by how
    much), so its search may take faster shapes that round differently (`slot_products`).
    """
    lin = model.decoder.layers[0].self_attention.q_lin
    return type(lin) is torch.nn.Linear and lin.weight.dtype == torch.float32


def exact_products(model: Any) -> bool:
    """Whether the search keeps ParlAI's per-hypothesis product shapes for this model."""
    return bit_exact(model) or not MERGE_SLOTS


def slot_products(
    lhs: torch.Tensor,
    shared: torch.Tensor,
    chats: int,
    beam: int,
    heads: int,
    outer: int,
    *,
    exact: bool,
) -> torch.Tensor:
    """Cross-attention's products of every beam slot against its chat's one copy of the
    encoder keys or values, as (chats, beam, heads, 1, outer).

    `lhs` is (chats x beam x heads, 1, inner): the queries (inner = head dim) or the attention
    weights (inner = context length); `shared` is (chats x heads, inner, outer), one per chat.
    `exact`: one (chats x heads) batch of single-row products per beam slot, stacked by slot,
    which round as ParlAI's per-hypothesis products do (the ops that parity was checked on).
    Otherwise one product of all `beam` rows of a chat and head at once: a real matrix product
    instead of `beam` vector ones, rounding differently: 2.7x and 3.3x faster for one layer's
    two products at beam 10, batch 8 (docs/benchmarks.md).
    """
    inner = lhs.size(-1)
    if exact:
        per_slot = lhs.view(chats, beam, heads, 1, inner)
        return torch.stack(
            [
                per_slot[:, j].reshape(-1, 1, inner).bmm(shared).view(chats, heads, 1, outer)
                for j in range(beam)
            ],
            dim=1,
        )
    rows = lhs.view(chats, beam, heads, inner).transpose(1, 2).reshape(chats * heads, beam, inner)
    out = rows.bmm(shared).view(chats, heads, beam, outer).transpose(1, 2)
    return out.contiguous().view(chats, beam, heads, 1, outer)


class FastDecoder:
    """ParlAI's TransformerDecoder stepped one token at a time with cheaper state handling.

    The arithmetic is ParlAI's (same modules, same op order, same per-matrix shapes), so scores
    are identical. What changes is the bookkeeping:

    - the self-attention cache lives in a preallocated buffer that one gather per step reorders
      (ParlAI copies it twice: concatenate, then reorder);
    - the encoder-side keys and values are projected once per chat, not once per hypothesis, and
      never reordered (ParlAI reorders them every step although they never change within a
      beam). Cross-attention then runs one batched product per beam slot against the per-chat
      K/V: the same single-query products ParlAI computes, without reading beam-size copies of
      the encoder states from memory every step.
    """

    def __init__(
        self, model: Any, encoder_states: Any, bsz: int, beam: int, max_steps: int
    ) -> None:
        self.model = model
        self.dec = model.decoder
        enc_out, enc_mask = encoder_states
        dev = enc_out.device
        rows = bsz * beam
        self.bsz, self.beam, self.rows = bsz, beam, rows
        self.heads = self.dec.n_heads
        self.dim = self.dec.dim
        self.dh = self.dim // self.heads
        self.scale = math.sqrt(self.dh)
        self.variant = self.dec.variant
        self.exact = exact_products(model)
        length = enc_out.size(1)
        self.length = length
        expand = torch.arange(bsz, device=dev).repeat_interleave(beam)
        # beam 1 has nothing to share; tiny inputs keep ParlAI's exact GEMM shape (see above)
        self.compact = beam > 1 and bsz * length >= COMPACT_KV_MIN_ROWS
        source = enc_out if self.compact else torch.index_select(enc_out, 0, expand)
        n = source.size(0)
        self.cross: list[tuple[torch.Tensor, torch.Tensor]] = []
        for layer in self.dec.layers:
            attn = layer.encoder_attention
            k, v = (
                lin(source)
                .view(n, length, self.heads, self.dh)
                .transpose(1, 2)
                .contiguous()
                .view(n * self.heads, length, self.dh)
                for lin in (attn.k_lin, attn.v_lin)
            )
            self.cross.append((k.transpose(1, 2), v))
        mask = torch.index_select(enc_mask, 0, expand)
        self.cross_fill = (
            (mask == 0)
            .view(rows, 1, -1, length)
            .repeat(1, self.heads, 1, 1)
            .expand(rows, self.heads, 1, length)
            .reshape(rows * self.heads, 1, length)
        )
        capacity = max(max_steps, 1)
        dtype = enc_out.dtype
        self.cache = [
            torch.empty(2, rows, self.heads, capacity, self.dh, dtype=dtype, device=dev)
            for _ in self.dec.layers
        ]
        self.spare = [torch.empty_like(c) for c in self.cache]
        self.ops = [LayerOps(layer) for layer in self.dec.layers]
        self.tokens = torch.full((rows, 1), model.start_idx, dtype=torch.long, device=dev)
        self.step = 0

    def _heads(self, t: torch.Tensor) -> torch.Tensor:
        # ParlAI's prepare_head for one query position: (rows, 1, dim) -> (rows x heads, 1, dh),
        # in one reshape (its view-transpose-contiguous-view moves nothing at one position)
        return t.reshape(self.rows * self.heads, 1, self.dh)

    def _merge(self, out: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        # ParlAI's reshaping of the attended values back to (rows, 1, dim), likewise
        return as_dtype(out, like).reshape(self.rows, 1, self.dim)

    def _self_attend(
        self,
        ops: LayerOps,
        x: torch.Tensor,
        q: torch.Tensor,
        keys_t: torch.Tensor,
        values: torch.Tensor,
    ) -> torch.Tensor:
        dot = self._heads(q).div_(self.scale).bmm(keys_t)
        # decoder self-attention masks nothing while stepping (ParlAI's mask is all ones)
        weights = as_dtype(F.softmax(dot, dim=-1, dtype=torch.float), x)
        return ops.self_out(self._merge(weights.bmm(values), x))

    def _cross_attend(
        self, ops: LayerOps, x: torch.Tensor, keys_t: torch.Tensor, values: torch.Tensor
    ) -> torch.Tensor:
        q = self._heads(ops.cross_q(x)).div_(self.scale)
        if not self.compact:
            dot = q.bmm(keys_t)
        else:
            dot = slot_products(
                q, keys_t, self.bsz, self.beam, self.heads, self.length, exact=self.exact
            ).view(self.rows * self.heads, 1, self.length)
        dot.masked_fill_(self.cross_fill, neginf(dot.dtype))
        weights = as_dtype(F.softmax(dot, dim=-1, dtype=torch.float), x)
        if not self.compact:
            out = weights.bmm(values)
        else:
            out = slot_products(
                weights, values, self.bsz, self.beam, self.heads, self.dh, exact=self.exact
            )
        return ops.cross_out(self._merge(out, x))

    def logits(self, step: int) -> torch.Tensor:
        """Scores of the next token for every row, shape (rows, vocab)."""
        return projection.scores(self.model, self.hidden(step)).squeeze(1)

    def hidden(self, step: int) -> torch.Tensor:
        """The decoder's output for every row, (rows, 1, dim), before the output projection."""
        t = step
        positions = torch.tensor([[t]], dtype=torch.long, device=self.tokens.device)
        x = self.dec.forward_embedding(self.tokens, positions)
        width = t + 1
        for ops, cache, (ck, cv) in zip(self.ops, self.cache, self.cross, strict=True):
            residual = x
            if self.variant == "prelayernorm":
                x = ops.norm1(x)
            q, k, v = ops.project(x)
            cache[0, :, :, t] = k.view(self.rows, self.heads, self.dh)
            cache[1, :, :, t] = v.view(self.rows, self.heads, self.dh)
            keys = cache[0].view(self.rows * self.heads, -1, self.dh)[:, :width]
            values = cache[1].view(self.rows * self.heads, -1, self.dh)[:, :width]
            x = self._self_attend(ops, x, q, keys.transpose(1, 2), values)
            x = after_self_attention(ops, self.variant, x, residual, self._cross_attend, ck, cv)
        if self.variant == "prelayernorm":
            x = self.dec.norm_embeddings(x)
        self.step = t + 1
        return x

    def advance(self, rows: torch.Tensor, tokens: torch.Tensor) -> None:
        """Follow the back-pointers `rows` and feed `tokens` next (both shape (rows,))."""
        width = self.step
        for i, cache in enumerate(self.cache):
            spare = self.spare[i]
            torch.index_select(cache[:, :, :, :width], 1, rows, out=spare[:, :, :, :width])
            self.cache[i], self.spare[i] = spare, cache
        self.tokens = tokens.unsqueeze(1)


def agent_device(agent: Any) -> torch.device:
    """The device the agent's model lives on."""
    return next(agent.model.parameters()).device


def bare_model(agent: Any) -> Any:
    """The agent's model, unwrapped from DistributedDataParallel."""
    model = agent.model
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return model.module
    return model
