"""Continuous (step-level) batching of the batched beam search: chats join and leave every step.

`beam.batched_generate` runs one batch from its first step to its longest chat's last. Here the
running batch is a set of chats, each at its own decoding step with its own context length:

- a chat that joins runs its encoder alone (a batch of one, as ParlAI's solo reply does) and
  brings its cross-attention keys/values; the running chats' K/V are padded to the longest
  context, and the padding is masked, so a chat attends to its own context only;
- every row writes its self-attention keys/values at its own position (its chat's step) in a
  shared cache, takes its own position embedding, and attends to positions up to its own
  (later positions hold zeros or stale rows and are masked);
- one decoder forward serves every row of every chat; the search itself (min length, n-gram
  and context blocking, top-k, finished hypotheses) is each chat's own, the arithmetic of
  `beam.batched_generate` for a batch of one;
- a chat whose search is done leaves at once: its rows are dropped from the caches.

Each chat's own search is a `ChatSearch` (bot/inference/fastgen/chat_search.py).

The self-attention cache is a pool of row slots: per layer two buffers (the one read this step
and the one the beam back-pointers are gathered into, then swapped), each holding `slots >=
rows` rows of `capacity` positions. The rows in use are always the pool's first `rows` slots,
in the running chats' order; the free slots are the tail. A join takes the next free slots and
writes nothing into them (the new rows start at position 0 and write their own keys/values as
they go; what a previous chat left there is finite and masked); a leave is folded into the
step's back-pointer gather, which every step does anyway and which then simply skips the
leaving rows, so the rows behind them move up and their slots return to the tail. Neither
copies the other chats' rows, so both cost the same at `label_truncate` 256 as at 32. The pool
grows (doubling) when a join needs more slots than it has, copying the rows in use once, and
is let go when the last chat leaves. Steps compute on the first `rows` slots only (a view, no
gather of used slots).

Results equal ParlAI's solo search up to float rounding: a row's matrix products run in a batch
of another size, and masked attention sums a few exact zeros, so scores can differ in the last
bits and a near-tie can go the other way (tests/integration/inference/test_continuous.py
measures it).
`_MASKS = False` turns the masks off (a private switch for that test: it must then report
differences).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from parlai.utils.torch import neginf

from bot.inference.fastgen import projection
from bot.inference.fastgen.chat_search import ChatSearch
from bot.inference.fastgen.kernels import row_topk
from bot.inference.fastgen.policy import search_reason
from bot.inference.fastgen.steppers import (
    LayerOps,
    after_self_attention,
    as_dtype,
    bare_model,
    exact_products,
    fast_decoder_supported,
    slot_products,
)

# Private switch for the agreement test: False drops the padding and position masks, which must
# make chats' replies depend on their companions.
_MASKS = True
# Private switch for the slot-pool test: what a fresh pool's slots hold before any row wrote
# there. Any finite value must give the same scores (stale slots are masked); NaN must not.
_FILL = 0.0


def continuous_supported(agent: Any) -> str | None:
    """Why this agent's turns cannot run on the continuous path, or None when they can.

    The agent-level half of `policy.fallback_reason` (the batch-level half is checked per
    chat), plus the stock decoder that `ContinuousSearch` steps op for op.
    """
    from bot.inference.fastgen.agent import is_accelerated

    if not is_accelerated(agent) or not getattr(agent, "fast_search", True):
        return "not the batched search"
    why = search_reason(agent)
    if why is not None:
        return why
    if getattr(agent, "skip_generation", False):
        return "skip generation"
    if type(agent).get_prefix_tokens is not _base_prefix_tokens():
        return "prefix tokens"
    if not fast_decoder_supported(bare_model(agent)):
        return "not the stock transformer decoder"
    return None


def _base_prefix_tokens() -> Any:
    from parlai.core.torch_generator_agent import TorchGeneratorAgent

    return TorchGeneratorAgent.get_prefix_tokens


class ContinuousSearch:
    """The running batch: chats at different steps sharing one decoder forward per step.

    `join(key, batch)` adds a chat (its encoder runs now), `step()` advances every chat by one
    token and returns the chats that finished, which have left the batch.
    """

    def __init__(self, agent: Any) -> None:
        model = bare_model(agent)
        self.agent = agent
        self.model = model
        self.dec = model.decoder
        self.heads = self.dec.n_heads
        self.dim = self.dec.dim
        self.dh = self.dim // self.heads
        self.scale = math.sqrt(self.dh)
        self.variant = self.dec.variant
        self.exact = exact_products(model)  # False: faster cross-attention (slot_products)
        self.dev = next(model.parameters()).device
        # the decoder layers' modules as the step calls them, read once: the scheduler's search
        # lives as long as its model, whose weights never change while it serves
        self.ops = [LayerOps(layer) for layer in self.dec.layers]
        self.chats: list[ChatSearch] = []
        self.capacity = 0  # positions per slot
        self.cache: list[torch.Tensor] = []  # per layer (2, slots, heads, capacity, dh)
        self.spare: list[torch.Tensor] = []  # the buffers the next reorder writes into
        self.pos = torch.zeros(0, dtype=torch.long, device=self.dev)  # each row's step
        self.tokens = torch.zeros(0, 1, dtype=torch.long, device=self.dev)
        # per layer: every chat's encoder K/V, (chats, heads, dh, L) and (chats, heads, L, dh),
        # and the same as (chats x heads) batches for the products
        self._packed: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.cross: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.cross_fill = torch.zeros(0, dtype=torch.bool, device=self.dev)
        self.length = 0
        self._ahead: ContinuousSearch | None = None  # where `join_ahead` runs first steps

    @property
    def rows(self) -> int:
        """Hypothesis rows in flight."""
        return len(self.chats) * (self.chats[0].beam if self.chats else 0)

    def __len__(self) -> int:
        return len(self.chats)

    # --- joining ----------------------------------------------------------------------------

    def join_ahead(self, joins: Sequence[tuple[Any, Any]]) -> list[ChatSearch]:
        """Encode chats (`(key, batch)` pairs, as `join` takes them) and run their first step
        among themselves, in a batch of the newcomers only, before they join the running
        chats at step 1: their first token (and so their first draft) comes after a step of
        their own rows instead of a step of every row in flight. Returns the newcomers that
        finished at that step (a reply of one token); they never join."""
        if self._ahead is None:
            self._ahead = ContinuousSearch(self.agent)
        ahead = self._ahead
        for key, batch in joins:
            chat = ahead.join(key, batch)
            if self.chats and chat.beam != self.chats[0].beam:
                raise ValueError("every chat in the running batch must have the same beam size")
        done = ahead.step()
        if ahead.chats:
            self._adopt(ahead)
        return done

    def _adopt(self, ahead: ContinuousSearch) -> None:
        """Take over every chat of `ahead` (a search of newcomers, a few steps in): their
        cache rows (the positions written so far) go into free slots, their encoder K/V into
        the packed cross-attention tensors."""
        new = ahead.chats
        for j, chat in enumerate(new):
            chat.cross = [
                (kt[j, :, :, : chat.length], v[j, :, : chat.length]) for kt, v in ahead._packed
            ]
        written = int(ahead.pos.max())
        rows = self.rows
        self._admit(new, tokens=ahead.tokens, pos=ahead.pos)
        for mine, theirs in zip(self.cache, ahead.cache, strict=True):
            mine[:, rows : rows + ahead.rows, :, :written] = theirs[:, : ahead.rows, :, :written]
        ahead.clear(keep_pool=True)

    def join(self, key: Any, batch: Any) -> ChatSearch:
        """Encode one chat's batch (of one) and add it at step 0."""
        agent, model = self.agent, self.model
        opt = agent.opt
        inference = opt.get("inference", "greedy")
        greedy = inference == "greedy"
        beam = int(agent.beam_size)
        if greedy and beam != 1:
            raise ValueError("Greedy search can only be run with beam size 1.")
        if self.chats and self.chats[0].beam != beam:
            raise ValueError("every chat in the running batch must have the same beam size")
        enc_out, _ = model.encoder(*agent._encoder_input(batch))
        length = enc_out.size(1)
        cross = []
        for layer in self.dec.layers:
            attn = layer.encoder_attention
            k, v = (
                lin(enc_out)
                .view(1, length, self.heads, self.dh)
                .transpose(1, 2)
                .contiguous()
                .view(self.heads, length, self.dh)
                for lin in (attn.k_lin, attn.v_lin)
            )
            cross.append((k.transpose(1, 2).contiguous(), v))
        context_ngram = int(agent.beam_context_block_ngram)
        context = agent._get_batch_context(batch).to(self.dev) if context_ngram > 0 else None
        chat = ChatSearch(
            key=key,
            beam=beam,
            max_ts=int(agent.label_truncate or 256),
            greedy=greedy,
            delay=int(opt.get("beam_delay", 30)) if inference == "delayedbeam" else 0,
            topk=int(opt.get("topk", 10)),
            min_length=0 if greedy else int(agent.beam_min_length),
            block_ngram=int(agent.beam_block_ngram),
            context_ngram=context_ngram,
            length_penalty=float(opt.get("beam_length_penalty", 0.65)),
            bos=int(agent.START_IDX),
            eos=int(agent.END_IDX),
            context=context,
            cross=cross,
            length=length,
        )
        self._admit([chat])
        return chat

    @property
    def slots(self) -> int:
        """Row slots in the self-attention pool (used and free)."""
        return self.cache[0].size(1) if self.cache else 0

    def _admit(
        self,
        new: Sequence[ChatSearch],
        tokens: torch.Tensor | None = None,
        pos: torch.Tensor | None = None,
    ) -> None:
        """Room in the pool for `new`'s rows, which start at `pos` (default 0) fed `tokens`
        (default the start token)."""
        capacity = max([self.capacity, *(c.max_ts for c in new), 1])
        rows, add = self.rows, len(new) * new[0].beam
        dtype = new[0].cross[0][1].dtype
        if capacity > self.capacity and self.cache:
            # a chat allowed longer replies than the pool's slots hold (label_truncate changed)
            self.cache = [_grow(c, capacity) for c in self.cache]
            self.spare = [_grow(c, capacity) for c in self.spare]
        self.capacity = capacity
        if rows + add > self.slots:
            self._reserve(max(rows + add, 2 * self.slots), dtype)
        if tokens is None:
            tokens = torch.full((add, 1), self.model.start_idx, dtype=torch.long, device=self.dev)
        if pos is None:
            pos = torch.zeros(add, dtype=torch.long, device=self.dev)
        self.tokens = torch.cat([self.tokens, tokens])
        self.pos = torch.cat([self.pos, pos])
        self.chats.extend(new)
        self._pack_cross(new)

    def _reserve(self, slots: int, dtype: torch.dtype) -> None:
        """A bigger pool: the rows in use copied once (the positions written so far)."""
        rows = self.rows
        width = int(self.pos.max()) + 1 if rows else 0
        shape = (2, slots, self.heads, self.capacity, self.dh)

        def fresh() -> torch.Tensor:
            return torch.full(shape, _FILL, dtype=dtype, device=self.dev)

        cache = []
        for old in self.cache:
            grown = fresh()
            if rows:
                grown[:, :rows, :, :width] = old[:, :rows, :, :width]
            cache.append(grown)
        self.cache = cache or [fresh() for _ in self.dec.layers]
        self.spare = [fresh() for _ in self.dec.layers]

    def _pack_cross(self, new: Sequence[ChatSearch] = (), keep: list[int] | None = None) -> None:
        """The running chats' encoder K/V, padded to the longest context, and the mask of the
        padding: the chats at `keep` (indices into the packed ones; None: all) and then `new`.
        Incremental, so that a chat joining or leaving copies each tensor once."""
        n = len(self.chats)
        if n == 0:
            self._packed, self.cross, self.length = [], [], 0
            return
        if keep is not None and self._packed:
            index = torch.tensor(keep, dtype=torch.long, device=self.dev)
            self._packed = [
                (kt.index_select(0, index), v.index_select(0, index)) for kt, v in self._packed
            ]
        length = max(c.length for c in self.chats)
        if self._packed and length < self._packed[0][1].size(2):
            # the longest context left: drop the padding nobody needs any more
            self._packed = [
                (kt[..., :length].contiguous(), v[:, :, :length].contiguous())
                for kt, v in self._packed
            ]
        if new:
            packed = []
            for i in range(len(self.dec.layers)):
                like = new[0].cross[i][1]
                kt = like.new_zeros(len(new), self.heads, self.dh, length)
                v = like.new_zeros(len(new), self.heads, length, self.dh)
                for j, chat in enumerate(new):
                    kt[j, :, :, : chat.length] = chat.cross[i][0]
                    v[j, :, : chat.length] = chat.cross[i][1]
                if self._packed:
                    old_kt, old_v = self._packed[i]
                    grow = length - old_v.size(2)
                    if grow:
                        old_kt = F.pad(old_kt, (0, grow))
                        old_v = F.pad(old_v, (0, 0, 0, grow))
                    kt, v = torch.cat([old_kt, kt]), torch.cat([old_v, v])
                packed.append((kt, v))
            self._packed = packed
            for chat in new:
                chat.cross = []  # packed now: the chat's own copy is not needed any more
        self.length = length
        flat = n * self.heads
        self.cross = [
            (kt.view(flat, self.dh, length), v.view(flat, length, self.dh))
            for kt, v in self._packed
        ]
        beam = self.chats[0].beam
        pad = torch.arange(length, device=self.dev).unsqueeze(0) >= torch.tensor(
            [c.length for c in self.chats], device=self.dev
        ).unsqueeze(1)  # (n, length)
        if not _MASKS:
            pad = torch.zeros_like(pad)
        self.cross_fill = (
            pad.view(n, 1, 1, 1, length)
            .expand(n, beam, self.heads, 1, length)
            .reshape(n * beam * self.heads, 1, length)
        )

    # --- stepping ---------------------------------------------------------------------------

    def _heads(self, t: torch.Tensor) -> torch.Tensor:
        # ParlAI's prepare_head for one query position, in one reshape (steppers.FastDecoder)
        return t.reshape(t.size(0) * self.heads, 1, self.dh)

    def _merge(self, out: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        return as_dtype(out, like).reshape(like.size(0), 1, self.dim)

    def _self_attend(
        self,
        ops: LayerOps,
        x: torch.Tensor,
        q: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        fill: Any,
    ) -> torch.Tensor:
        dot = self._heads(q).div_(self.scale).bmm(keys.transpose(1, 2))
        if fill is not None:
            dot.masked_fill_(fill, neginf(dot.dtype))
        weights = as_dtype(F.softmax(dot, dim=-1, dtype=torch.float), x)
        return ops.self_out(self._merge(weights.bmm(values), x))

    def _cross_attend(
        self, ops: LayerOps, x: torch.Tensor, keys_t: torch.Tensor, values: torch.Tensor
    ) -> torch.Tensor:
        n, beam, length = len(self.chats), self.chats[0].beam, self.length
        q = self._heads(ops.cross_q(x)).div_(self.scale)
        # every beam slot against its chat's own K/V (never copied per hypothesis)
        dot = slot_products(q, keys_t, n, beam, self.heads, length, exact=self.exact).view(
            n * beam * self.heads, 1, length
        )
        dot.masked_fill_(self.cross_fill, neginf(dot.dtype))
        weights = as_dtype(F.softmax(dot, dim=-1, dtype=torch.float), x)
        out = slot_products(weights, values, n, beam, self.heads, self.dh, exact=self.exact)
        return ops.cross_out(self._merge(out, x))

    def _hidden(self) -> torch.Tensor:
        """The decoder's output for every row, (rows, 1, dim), before the output projection."""
        rows = self.rows
        pos = self.pos
        x = self.dec.forward_embedding(self.tokens, pos.unsqueeze(1))
        width = int(pos.max()) + 1
        # every row at the same position (one chat alone, or chats that joined together): its
        # keys/values go into one column by a plain slice write instead of a scatter
        same = int(pos.min()) == width - 1
        every: Any = slice(0, rows) if same else torch.arange(rows, device=self.dev)
        at: Any = width - 1 if same else pos
        fill = None
        if _MASKS and not same:
            later = torch.arange(width, device=self.dev).unsqueeze(0) > pos.unsqueeze(1)
            if bool(later.any()):
                fill = (
                    later.view(rows, 1, 1, width)
                    .expand(rows, self.heads, 1, width)
                    .reshape(rows * self.heads, 1, width)
                )
        for ops, cache, (ck, cv) in zip(self.ops, self.cache, self.cross, strict=True):
            residual = x
            if self.variant == "prelayernorm":
                x = ops.norm1(x)
            q, k, v = ops.project(x)
            cache[0, every, :, at] = k.view(rows, self.heads, self.dh)
            cache[1, every, :, at] = v.view(rows, self.heads, self.dh)
            # the rows in use are the pool's first `rows` slots: a view, no gather
            keys = cache[0, :rows].view(rows * self.heads, -1, self.dh)[:, :width]
            values = cache[1, :rows].view(rows * self.heads, -1, self.dh)[:, :width]
            x = self._self_attend(ops, x, q, keys, values, fill)
            x = after_self_attention(ops, self.variant, x, residual, self._cross_attend, ck, cv)
        if self.variant == "prelayernorm":
            x = self.dec.norm_embeddings(x)
        return x

    def step(self) -> list[ChatSearch]:
        """Advance every chat by one token; returns the chats that finished (they have left)."""
        if not self.chats:
            return []
        beam = self.chats[0].beam
        temperature = self.agent.temperature
        src, toks = [], []
        for lo, score in projection.step_scores(self.model, self._hidden(), beam):
            if temperature != 1.0:
                score.div_(temperature)
            lp = F.log_softmax(score, dim=-1, dtype=torch.float32)
            first = lo // beam
            chats = self.chats[first : first + score.size(0) // beam]
            for j, chat in enumerate(chats):
                chat.constrain(lp[j * beam : (j + 1) * beam])
            need_rows = any(not c.greedy and c.t > 0 and c.t >= c.delay for c in chats)
            row_vals, row_toks = row_topk(lp, beam) if need_rows else (None, None)
            for j, chat in enumerate(chats):
                rs = slice(j * beam, (j + 1) * beam)
                hyp_ids, tok_ids = chat.select(
                    lp[rs],
                    None if row_vals is None else row_vals[rs],
                    None if row_toks is None else row_toks[rs],
                )
                src.append(hyp_ids + (first + j) * beam)
                toks.append(tok_ids)
        keep = [i for i, c in enumerate(self.chats) if not c.done]
        done = [c for c in self.chats if c.done]
        if not keep:
            self.clear()
            return done
        rows = torch.cat([src[i] for i in keep])
        used = rows.numel()
        width = int(self.pos.max()) + 1
        for i, cache in enumerate(self.cache):
            # the cache follows the back-pointers of the chats that stay: the leaving chats'
            # rows are not gathered, so the others move up into the pool's first slots.
            # Positions past `width` hold nothing yet (stale values there are finite, and
            # masked).
            spare = self.spare[i]
            torch.index_select(cache[:, :, :, :width], 1, rows, out=spare[:, :used, :, :width])
            self.cache[i], self.spare[i] = spare, cache
        self.tokens = torch.cat([toks[i] for i in keep]).unsqueeze(1)
        self.pos = self.pos + 1
        if done:
            self._drop(keep)
        return done

    def _drop(self, keep: list[int]) -> None:
        """The chats at `keep` stay (their cache rows moved up already, in `step`'s gather)."""
        beam = self.chats[0].beam
        rows = torch.tensor(
            [i * beam + k for i in keep for k in range(beam)], dtype=torch.long, device=self.dev
        )
        self.pos = torch.index_select(self.pos, 0, rows)
        self.chats = [self.chats[i] for i in keep]
        self._pack_cross(keep=keep)

    def clear(self, keep_pool: bool = False) -> list[ChatSearch]:
        """Drop every chat (after a failure); returns them. `keep_pool`: keep the
        self-attention pool's buffers for the next chats."""
        chats = self.chats
        self.chats = []
        if not keep_pool:
            self.cache, self.spare, self.capacity = [], [], 0
        self.tokens = self.tokens[:0]
        self.pos = self.pos[:0]
        self._pack_cross()
        if self._ahead is not None:
            self._ahead.clear()
        return chats


def _grow(cache: torch.Tensor, capacity: int) -> torch.Tensor:
    grown = cache.new_full((*cache.shape[:3], capacity, cache.size(4)), _FILL)
    grown[:, :, :, : cache.size(3)] = cache
    return grown
