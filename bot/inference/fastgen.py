"""Batched beam search for ParlAI transformer generators, with the same results as ParlAI's.

ParlAI's `_generate` keeps one search object per chat: every step it runs a Python loop of per-chat
top-k calls and n-gram blocking, and reorders the decoder's whole incremental state, including the
encoder-side cross-attention keys and values, which never change within a beam. Here the search
runs on the whole batch at once:

- one log-softmax, one masked write for min length and n-gram blocking (beam and context, as
  tensor operations), one top-k per hypothesis row and one per chat over beam x beam candidates;
- the decoder is stepped by `_FastDecoder`, which computes the encoder K/V once per chat and never
  reorders them; only the self-attention cache follows the beam back-pointers.

Same results means bit for bit: every floating-point operation that produces a score runs with the
same shapes and in the same order as ParlAI's (matrix kernels give results that depend on the
number of rows, so the decoder always runs `batch x beam` rows, as ParlAI's does, even for chats
that are finished). The only place the two can part is an exact float tie at the k-th candidate,
where top-k's choice among equal values is unspecified in both. tests/integration/test_fastgen.py
proves it against ParlAI on random cases.

`accelerate(agent)` switches a loaded transformer generator to this search (SEARCH_IMPL=fast);
anything it does not cover (sampling, prefix tokens, token details, block lists, custom decoders
or generation hooks) falls back to ParlAI's own `_generate` per batch.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch
import torch.nn.functional as F
from parlai.agents.transformer.modules import (
    MultiHeadAttention,
    TransformerDecoder,
    TransformerDecoderLayer,
)
from parlai.agents.transformer.modules.generator import TransformerGeneratorModel
from parlai.agents.transformer.transformer import TransformerGeneratorAgent
from parlai.core.torch_generator_agent import TorchGeneratorAgent
from parlai.utils.torch import neginf

log = logging.getLogger(__name__)

# ParlAI's neginf(torch.float32): what it writes into blocked log-probabilities (the search
# always works in float32).
NEG = neginf(torch.float32)
# Below this many encoder rows, a matrix kernel may round differently for `batch` and
# `batch x beam` copies of the same rows, so the cross-attention K/V are then projected from the
# expanded encoder output, exactly as ParlAI does (cheap at that size).
_COMPACT_KV_MIN_ROWS = 64
# Hooks of TorchGeneratorAgent that `_generate` relies on; a class that overrides any of them
# generates differently, and keeps ParlAI's search.
_GENERATION_HOOKS = (
    "_generate",
    "_treesearch_factory",
    "_get_batch_context",
    "_get_initial_decoder_input",
    "_get_next_decoder_input",
    "_generation_activation",
    "_encoder_input",
)


def _fast_generate(
    self: Any,
    batch: Any,
    beam_size: int,
    max_ts: int,
    prefix_tokens: Any = None,
) -> tuple[list[tuple[Any, Any, Any]], list[Any]]:
    """ParlAI's `_generate` contract: (top hypothesis per chat, one search result per chat).

    The batched search where it applies, ParlAI's own otherwise (see `fallback_reason`).
    """
    why = fallback_reason(self, batch, prefix_tokens)
    if why is not None:
        if why != "disabled":
            log.debug("ParlAI's own search for this batch: %s", why)
        result: tuple[list[tuple[Any, Any, Any]], list[Any]] = TorchGeneratorAgent._generate(
            self, batch, beam_size, max_ts, prefix_tokens=prefix_tokens
        )
        return result
    with torch.no_grad():
        return batched_generate(self, batch, beam_size, max_ts)


class FastTransformerGeneratorAgent(TransformerGeneratorAgent):  # type: ignore[misc]
    """ParlAI's transformer generator with the batched beam search.

    `fast_search = False` on an instance turns it off (ParlAI's search), e.g. to compare the two.
    """

    fast_search = True
    _generate = _fast_generate


_fast_classes: dict[type, type] = {TransformerGeneratorAgent: FastTransformerGeneratorAgent}


def _keeps_generation_hooks(cls: type) -> bool:
    return all(
        getattr(cls, name) is getattr(TorchGeneratorAgent, name) for name in _GENERATION_HOOKS
    )


def is_accelerated(agent: Any) -> bool:
    """True when the agent runs the batched search (unless switched off per instance)."""
    return getattr(type(agent), "_generate", None) is _fast_generate


def accelerate(agent: Any) -> Any:
    """Switch a loaded transformer generator (and its future clones) to the batched search.

    Anything else is returned unchanged: other model types, and generator subclasses that change
    how generation works. The agent keeps its state; only its class changes (to a subclass of
    its own), and `clone()` builds `type(self)`, so clones use the new search too.
    """
    cls = type(agent)
    if is_accelerated(agent) or not isinstance(agent, TransformerGeneratorAgent):
        return agent
    if not _keeps_generation_hooks(cls):
        log.info("%s customises generation; keeping ParlAI's search", cls.__name__)
        return agent
    fast = _fast_classes.get(cls)
    if fast is None:
        # a subclass of the agent's own class (a mixin would change the instance layout, and
        # __class__ assignment requires the same layout)
        fast = type(
            f"Fast{cls.__name__}",
            (cls,),
            {"__module__": __name__, "fast_search": True, "_generate": _fast_generate},
        )
        _fast_classes[cls] = fast
    agent.__class__ = fast
    log.info("batched beam search on for %s", cls.__name__)
    return agent


def fallback_reason(agent: Any, batch: Any, prefix_tokens: Any) -> str | None:
    """Why this batch must use ParlAI's search, or None when the batched one applies."""
    if not getattr(agent, "fast_search", True):
        return "disabled"
    opt = agent.opt
    if opt.get("inference", "greedy") not in ("beam", "greedy"):
        return f"inference={opt.get('inference')}"
    if prefix_tokens is not None:
        return "prefix tokens"
    if getattr(agent, "show_token_details", False):
        return "token details"
    if hasattr(agent, "_rerank_beams"):
        return "reranking hook"
    if getattr(agent, "beam_block_list", None):
        return "beam block list"
    if opt.get("gpu_beam_blocking", False) and torch.cuda.is_available():
        return "gpu beam blocking"
    if batch.text_vec is None:
        return "no text_vec"
    if agent.beam_context_block_ngram > 0 and agent._get_batch_context(batch) is None:
        return "no context for context blocking"
    model = agent.model
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        model = model.module
    if model.training:
        return "model in training mode"
    return None


# --------------------------------------------------------------------------------------------
# decoder steppers


class _GenericDecoder:
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
    """True when the model is ParlAI's stock encoder-decoder transformer, which `_FastDecoder`
    re-implements op for op; anything else (swapped layers, other variants) is stepped by
    `_GenericDecoder`."""
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


class _FastDecoder:
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
        length = enc_out.size(1)
        self.length = length
        expand = torch.arange(bsz, device=dev).repeat_interleave(beam)
        # beam 1 has nothing to share; tiny inputs keep ParlAI's exact GEMM shape (see above)
        self.compact = beam > 1 and bsz * length >= _COMPACT_KV_MIN_ROWS
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
        self.tokens = torch.full((rows, 1), model.start_idx, dtype=torch.long, device=dev)
        self.step = 0

    def _heads(self, t: torch.Tensor) -> torch.Tensor:
        # ParlAI's prepare_head for one query position
        return (
            t.view(self.rows, 1, self.heads, self.dh)
            .transpose(1, 2)
            .contiguous()
            .view(self.rows * self.heads, 1, self.dh)
        )

    def _merge(self, out: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        # ParlAI's reshaping of the attended values back to (rows, 1, dim)
        return (
            out.type_as(like)
            .view(self.rows, self.heads, 1, self.dh)
            .transpose(1, 2)
            .contiguous()
            .view(self.rows, 1, self.dim)
        )

    def _self_attend(
        self, attn: Any, x: torch.Tensor, keys_t: torch.Tensor, values: torch.Tensor
    ) -> torch.Tensor:
        q = self._heads(attn.q_lin(x))
        dot = q.div_(self.scale).bmm(keys_t)
        # decoder self-attention masks nothing while stepping (ParlAI's mask is all ones)
        weights = F.softmax(dot, dim=-1, dtype=torch.float).type_as(x)
        return attn.out_lin(self._merge(weights.bmm(values), x))  # type: ignore[no-any-return]

    def _cross_attend(
        self, attn: Any, x: torch.Tensor, keys_t: torch.Tensor, values: torch.Tensor
    ) -> torch.Tensor:
        q = self._heads(attn.q_lin(x)).div_(self.scale)
        if not self.compact:
            dot = q.bmm(keys_t)
        else:
            # one (chats x heads) batch of single-query products per beam slot
            per_slot = q.view(self.bsz, self.beam, self.heads, 1, self.dh)
            dot = torch.stack(
                [
                    per_slot[:, j]
                    .reshape(-1, 1, self.dh)
                    .bmm(keys_t)
                    .view(self.bsz, self.heads, 1, self.length)
                    for j in range(self.beam)
                ],
                dim=1,
            ).view(self.rows * self.heads, 1, self.length)
        dot.masked_fill_(self.cross_fill, neginf(dot.dtype))
        weights = F.softmax(dot, dim=-1, dtype=torch.float).type_as(x)
        if not self.compact:
            out = weights.bmm(values)
        else:
            per_slot = weights.view(self.bsz, self.beam, self.heads, 1, self.length)
            out = torch.stack(
                [
                    per_slot[:, j]
                    .reshape(-1, 1, self.length)
                    .bmm(values)
                    .view(self.bsz, self.heads, 1, self.dh)
                    for j in range(self.beam)
                ],
                dim=1,
            )
        return attn.out_lin(self._merge(out, x))  # type: ignore[no-any-return]

    def logits(self, step: int) -> torch.Tensor:
        """Scores of the next token for every row, shape (rows, vocab)."""
        t = step
        positions = torch.tensor([[t]], dtype=torch.long, device=self.tokens.device)
        x = self.dec.forward_embedding(self.tokens, positions)
        post = self.variant in ("aiayn", "xlm", "bart")
        width = t + 1
        for layer, cache, (ck, cv) in zip(self.dec.layers, self.cache, self.cross, strict=True):
            sa = layer.self_attention
            residual = x
            if self.variant == "prelayernorm":
                x = layer.norm1(x)
            cache[0, :, :, t] = sa.k_lin(x).view(self.rows, self.heads, self.dh)
            cache[1, :, :, t] = sa.v_lin(x).view(self.rows, self.heads, self.dh)
            keys = cache[0].view(self.rows * self.heads, -1, self.dh)[:, :width]
            values = cache[1].view(self.rows * self.heads, -1, self.dh)[:, :width]
            x = self._self_attend(sa, x, keys.transpose(1, 2), values)
            x = x + residual
            if post:
                x = layer.norm1(x)
            residual = x
            if self.variant == "prelayernorm":
                x = layer.norm2(x)
            x = self._cross_attend(layer.encoder_attention, x, ck, cv)
            x = residual + x
            if post:
                x = layer.norm2(x)
            residual = x
            if self.variant == "prelayernorm":
                x = layer.norm3(x)
            x = layer.ffn(x)
            x = residual + x
            if post:
                x = layer.norm3(x)
        if self.variant == "prelayernorm":
            x = self.dec.norm_embeddings(x)
        self.step = t + 1
        return self.model.output(x).squeeze(1)  # type: ignore[no-any-return]

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


# --------------------------------------------------------------------------------------------
# the search


class BatchedBeams:
    """One chat's finished hypotheses, answering `get_rescored_finished` like ParlAI's
    TreeSearch (the only thing `eval_step` asks of the beams `_generate` returns)."""

    def __init__(
        self,
        tokens: list[list[int]],
        back: list[list[int]],
        scores: torch.Tensor,
        finished: list[tuple[int, int]],
        bos: int,
        eos: int,
        length_penalty: float,
        device: torch.device,
    ) -> None:
        self._tokens = tokens  # [step][hyp]: token chosen at step (outputs[1:])
        self._back = back  # [step][hyp]: hypothesis it extends (bookkeep)
        self._scores = scores  # (steps, beam) float32 cumulative scores (all_scores[1:])
        self._finished = finished
        self._bos = bos
        self._eos = eos
        self._length_penalty = length_penalty
        self._device = device
        self._rescored: list[tuple[torch.Tensor, torch.Tensor, None]] | None = None

    def _score(self, timestep: int, hyp: int) -> torch.Tensor:
        if timestep == 0:
            return torch.zeros((), dtype=torch.float32, device=self._device)
        return self._scores[timestep - 1, hyp]

    def _path(self, timestep: int, hyp: int) -> list[int]:
        out = []
        for i in range(timestep, 0, -1):
            out.append(self._tokens[i - 1][hyp])
            hyp = self._back[i - 1][hyp]
        out.append(self._bos)
        out.reverse()
        return out

    def get_rescored_finished(self, n_best: int | None = None) -> list[Any]:
        """Finished hypotheses as (tokens, length-penalised score, None), best first."""
        if self._rescored is None:
            finished = self._finished
            forced = not finished
            if forced:
                # never finished: ParlAI ends the top hypothesis where it stands
                steps = len(self._tokens)
                finished = [(steps, 0)]
            rescored = []
            for timestep, hyp in finished:
                penalty = math.pow((1 + timestep + 1) / 6, self._length_penalty)
                rescored.append((timestep, hyp, self._score(timestep, hyp) / penalty))
            # stable, like ParlAI's sorted(..., reverse=True): earlier finishers win ties
            rescored.sort(key=lambda item: float(item[2]), reverse=True)
            self._rescored = []
            for timestep, hyp, score in rescored:
                path = self._path(timestep, hyp)
                if forced:
                    path[-1] = self._eos
                tokens = torch.tensor(path, dtype=torch.long, device=self._device)
                self._rescored.append((tokens, score, None))
        return self._rescored if n_best is None else self._rescored[:n_best]


def _row_topk(x: torch.Tensor, k: int, chunk: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k per row of a (rows, vocab) tensor, values sorted descending.

    Over a large vocabulary, first the k blocks of `chunk` entries with the highest maxima, then
    the top k among those: every top-k entry lies in one of them (a block holding a top-k entry
    has a maximum at least as high, and at most k - 1 other blocks can beat it). Same values as
    torch.topk over the whole row, at a third of the cost; as with torch.topk, which of several
    exactly equal entries is picked is unspecified.
    """
    rows, vocab = x.shape
    blocks = vocab // chunk
    if blocks < 4 * k:
        values, indices = torch.topk(x, k, dim=1)
        return values, indices
    main = blocks * chunk
    grid = x[:, :main].view(rows, blocks, chunk)
    best = grid.amax(dim=2).topk(k, dim=1).indices  # (rows, k)
    cand = grid.gather(1, best.unsqueeze(2).expand(rows, k, chunk)).view(rows, k * chunk)
    offsets = torch.arange(chunk, device=x.device)
    index = (best.unsqueeze(2) * chunk + offsets).view(rows, k * chunk)
    if main < vocab:
        cand = torch.cat([cand, x[:, main:]], dim=1)
        tail = torch.arange(main, vocab, device=x.device).expand(rows, vocab - main)
        index = torch.cat([index, tail], dim=1)
    values, pos = cand.topk(k, dim=1)
    return values, index.gather(1, pos)


def _block_self_ngrams(lp: torch.Tensor, hyps: torch.Tensor, n: int) -> None:
    """ParlAI's TreeSearch._block_ngrams on its own hypotheses, for every row at once.

    `lp` is (rows, vocab), `hyps` (rows, length) including the start token. A token is blocked
    when it would repeat an n-gram the hypothesis already contains.
    """
    length = hyps.size(1)
    if n == 1:
        lp.scatter_(1, hyps, NEG)
        return
    if length < n:
        return
    windows = hyps.unfold(1, n, 1)  # (rows, length - n + 1, n)
    prefix = hyps[:, length - (n - 1) :]
    match = (windows[:, :, :-1] == prefix.unsqueeze(1)).all(dim=2)
    r, w = match.nonzero(as_tuple=True)
    if r.numel():
        lp[r, windows[r, w, -1]] = NEG


def _block_context_ngrams(
    lp: torch.Tensor, hyps: torch.Tensor, context: torch.Tensor, n: int
) -> None:
    """ParlAI's context blocking for every row at once.

    `lp` is (bsz, beam, vocab), `hyps` (bsz * beam, length), `context` (bsz, context length),
    padding included (ParlAI blocks with the padded batch row too).
    """
    bsz, beam, _ = lp.shape
    length = hyps.size(1)
    if context.size(1) == 0:
        return
    if n == 1:
        index = context.unsqueeze(1).expand(bsz, beam, context.size(1))
        lp.scatter_(2, index, NEG)
        return
    if length < n - 1 or context.size(1) < n:
        return
    windows = context.unfold(1, n, 1)  # (bsz, windows, n)
    prefix = hyps[:, length - (n - 1) :].view(bsz, beam, 1, n - 1)
    match = (windows[:, :, :-1].unsqueeze(1) == prefix).all(dim=3)  # (bsz, beam, windows)
    b, k, w = match.nonzero(as_tuple=True)
    if b.numel():
        lp[b, k, windows[b, w, -1]] = NEG


def batched_generate(
    agent: Any, batch: Any, beam_size: int, max_ts: int
) -> tuple[list[tuple[Any, Any, Any]], list[BatchedBeams]]:
    """ParlAI's beam (or greedy) search over the whole batch at once; see the module docstring.

    Follows TorchGeneratorAgent._generate, TreeSearch.advance, BeamSearch/GreedySearch
    .select_paths and TreeSearch.get_rescored_finished step for step.
    """
    model = agent.model
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        model = model.module
    opt = agent.opt
    greedy = opt.get("inference", "greedy") == "greedy"
    if greedy and beam_size != 1:
        raise ValueError("Greedy search can only be run with beam size 1.")
    beam = beam_size
    bsz = batch.batchsize
    dev = batch.text_vec.device
    rows = bsz * beam
    eos, bos = agent.END_IDX, agent.START_IDX
    min_length = 0 if greedy else agent.beam_min_length
    block_ngram = agent.beam_block_ngram
    context_ngram = agent.beam_context_block_ngram
    length_penalty = opt.get("beam_length_penalty", 0.65)
    temperature = agent.temperature

    encoder_states = model.encoder(*agent._encoder_input(batch))
    stepper: _FastDecoder | _GenericDecoder
    if fast_decoder_supported(model):
        stepper = _FastDecoder(model, encoder_states, bsz, beam, max_ts)
    else:
        stepper = _GenericDecoder(agent, model, encoder_states, bsz, beam)
    context = agent._get_batch_context(batch).to(dev) if context_ngram > 0 else None

    hyps = torch.full((rows, 1), bos, dtype=torch.long, device=dev)  # partial_hyps, all rows
    scores = torch.zeros(bsz, beam, dtype=torch.float32, device=dev)
    last = torch.full((bsz, beam), bos, dtype=torch.long, device=dev)
    base = (torch.arange(bsz, device=dev) * beam).unsqueeze(1)
    tokens_hist: list[torch.Tensor] = []
    back_hist: list[torch.Tensor] = []
    score_hist: list[torch.Tensor] = []
    steps = [0] * bsz  # advances per chat (len(outputs) - 1 in ParlAI)
    eos_top = [False] * bsz
    n_best = [0] * bsz
    finished: list[list[tuple[int, int]]] = [[] for _ in range(bsz)]

    for t in range(max_ts):
        active = [not (eos_top[b] and n_best[b] >= beam) for b in range(bsz)]
        if not any(active):
            break
        score = stepper.logits(t).view(bsz, beam, -1)
        if temperature != 1.0:
            score.div_(temperature)
        lp = F.log_softmax(score, dim=-1, dtype=torch.float32)
        vocab = lp.size(-1)
        if t < min_length:
            lp[:, :, eos] = NEG
        if block_ngram > 0:
            _block_self_ngrams(lp.view(rows, vocab), hyps, block_ngram)
        if context is not None:
            _block_context_ngrams(lp, hyps, context, context_ngram)

        if t == 0:
            # only the first hypothesis of each chat exists yet
            first = lp[:, 0, :]
            if greedy:
                best, tok = first.max(1, keepdim=True)
            else:
                best, tok = torch.topk(first, beam, dim=1)
            new_scores = best + scores[:, :1]
            hyp_ids = torch.zeros(bsz, beam, dtype=torch.long, device=dev)
            tok_ids = tok
        else:
            prior = scores.masked_fill(last == eos, NEG)
            if greedy:
                best, tok = lp.view(bsz, vocab).max(1, keepdim=True)
                new_scores = best + prior
                hyp_ids = torch.zeros(bsz, 1, dtype=torch.long, device=dev)
                tok_ids = tok
            else:
                vals, toks = _row_topk(lp.view(rows, vocab), beam)
                cand = vals.view(bsz, beam, beam) + prior.unsqueeze(2)
                new_scores, pos = torch.topk(cand.view(bsz, beam * beam), beam, dim=1)
                hyp_ids = torch.div(pos, beam, rounding_mode="trunc")
                tok_ids = toks.view(bsz, beam * beam).gather(1, pos)

        act = torch.tensor(active, device=dev).unsqueeze(1)
        # finished chats keep their hypotheses (ParlAI stops advancing them)
        hyp_ids = torch.where(act, hyp_ids, torch.arange(beam, device=dev).unsqueeze(0))
        tok_ids = torch.where(act, tok_ids, last)
        new_scores = torch.where(act, new_scores, scores)
        src = (base + hyp_ids).view(-1)
        hyps = torch.cat([torch.index_select(hyps, 0, src), tok_ids.view(rows, 1)], dim=1)
        stepper.advance(src, tok_ids.view(-1))

        tokens_hist.append(tok_ids)
        back_hist.append(hyp_ids)
        score_hist.append(new_scores)
        ended = (tok_ids == eos) & (new_scores > NEG) & act
        top_eos = (tok_ids[:, 0] == eos).tolist()
        for b in range(bsz):
            if active[b]:
                steps[b] = t + 1
                if top_eos[b]:
                    eos_top[b] = True
        if bool(ended.any()):
            for b, k in ended.nonzero().tolist():
                finished[b].append((t + 1, k))
                n_best[b] += 1
        scores, last = new_scores, tok_ids

    tokens_all = torch.stack(tokens_hist).tolist() if tokens_hist else []
    back_all = torch.stack(back_hist).tolist() if back_hist else []
    scores_all = (
        torch.stack(score_hist)
        if score_hist
        else torch.zeros(0, bsz, beam, dtype=torch.float32, device=dev)
    )
    beams = []
    for b in range(bsz):
        n = steps[b]
        beams.append(
            BatchedBeams(
                [step[b] for step in tokens_all[:n]],
                [step[b] for step in back_all[:n]],
                scores_all[:n, b],
                finished[b],
                bos,
                eos,
                length_penalty,
                dev,
            )
        )
    preds = [b.get_rescored_finished()[0] for b in beams]
    return preds, beams
