"""The batched beam (greedy, delayed beam) search, and the per-chat result it hands ParlAI."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F

from bot.inference.fastgen import projection
from bot.inference.fastgen.kernels import (
    NEG,
    block_context_ngrams,
    block_self_ngrams,
    context_ngram_blocks,
    row_topk,
    self_ngram_blocks,
)
from bot.inference.fastgen.steppers import (
    FastDecoder,
    GenericDecoder,
    bare_model,
    fast_decoder_supported,
)


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


# ENCODER_BUCKETS: chats whose contexts differ in length by more than this share an encoder
# batch only when that pads at most this fraction of its positions.
BUCKET_WASTE = 0.1


def encode(agent: Any, model: Any, batch: Any) -> Any:
    """The encoder over the batch: ParlAI's (one padded batch, the default), or, with
    `agent.encoder_buckets` (ENCODER_BUCKETS=on), over buckets of contexts of similar length,
    each padded only to its own longest, the outputs then laid out as the padded batch (the
    padding positions zero and masked, as ParlAI's encoder leaves them).

    Buckets change how many rows each matrix product runs on, so the encoder outputs differ
    from the padded batch's in the last bits and a near-tie can go the other way: opt-in
    (tests/integration/inference/test_fastgen.py measures the agreement)."""
    inputs = agent._encoder_input(batch)
    text = batch.text_vec
    if not getattr(agent, "encoder_buckets", False) or len(inputs) != 1 or inputs[0] is not text:
        return model.encoder(*inputs)
    bsz, width = text.shape
    filled = text != agent.NULL_IDX
    lengths = filled.sum(1)
    right_padded = bool(
        (filled == (torch.arange(width, device=text.device) < lengths[:, None])).all()
    )
    if bsz < 2 or not right_padded:
        return model.encoder(*inputs)
    order = sorted(range(bsz), key=lambda i: int(lengths[i]))
    buckets: list[list[int]] = [[order[0]]]
    for i in order[1:]:
        bucket = [*buckets[-1], i]
        longest = int(lengths[i])
        used = sum(int(lengths[j]) for j in bucket)
        if longest * len(bucket) - used <= BUCKET_WASTE * longest * len(bucket):
            buckets[-1] = bucket
        else:
            buckets.append([i])
    if len(buckets) == 1:
        return model.encoder(*inputs)
    out: torch.Tensor | None = None
    mask = torch.zeros(bsz, width, dtype=torch.bool, device=text.device)
    for bucket in buckets:
        index = torch.tensor(bucket, dtype=torch.long, device=text.device)
        longest = int(lengths[bucket[-1]])
        part, part_mask = model.encoder(text.index_select(0, index)[:, :longest])
        if out is None:
            out = part.new_zeros(bsz, width, part.size(2))
        out[index, :longest] = part
        mask[index, :longest] = part_mask
    return out, mask


def batched_generate(
    agent: Any, batch: Any, beam_size: int, max_ts: int
) -> tuple[list[tuple[Any, Any, Any]], list[BatchedBeams]]:
    """ParlAI's beam, greedy or delayed-beam search over the whole batch at once.

    Follows TorchGeneratorAgent._generate, TreeSearch.advance, BeamSearch/GreedySearch/
    DelayedBeamSearch .select_paths and TreeSearch.get_rescored_finished step for step. The
    sampled steps of delayed beam draw for all chats at once: with one chat the draws are
    ParlAI's (same seed, same reply); with several they come in another order.
    """
    model = bare_model(agent)
    opt = agent.opt
    inference = opt.get("inference", "greedy")
    greedy = inference == "greedy"
    # Delayed beam (Massarelli et al., 2019; ParlAI's DelayedBeamSearch): the first `delay`
    # tokens of every hypothesis are sampled from its own top-k, then beam search goes on.
    delay = int(opt.get("beam_delay", 30)) if inference == "delayedbeam" else 0
    topk = int(opt.get("topk", 10))
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

    encoder_states = encode(agent, model, batch)
    stepper: FastDecoder | GenericDecoder
    if fast_decoder_supported(model):
        stepper = FastDecoder(model, encoder_states, bsz, beam, max_ts)
    else:
        stepper = GenericDecoder(agent, model, encoder_states, bsz, beam)
    context = agent._get_batch_context(batch).to(dev) if context_ngram > 0 else None
    fused = projection.of(model) if isinstance(stepper, FastDecoder) else None
    if fused is not None and not fused.fuse:
        fused = None  # its full scores come through stepper.logits

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
        if fused is None:
            # what each branch below takes of the log-probabilities, block by block of chats
            # (one block unless the int8 projection's row blocks pay: projection.py)
            picks = []
            for lo, score in _step_scores(stepper, model, t, beam):
                n = score.size(0)
                score = score.view(n // beam, beam, -1)
                if temperature != 1.0:
                    score.div_(temperature)
                lp = F.log_softmax(score, dim=-1, dtype=torch.float32)
                vocab = lp.size(-1)
                if t < min_length:
                    lp[:, :, eos] = NEG
                if block_ngram > 0:
                    block_self_ngrams(lp.view(n, vocab), hyps[lo : lo + n], block_ngram)
                if context is not None:
                    chats = slice(lo // beam, (lo + n) // beam)
                    block_context_ngrams(lp, hyps[lo : lo + n], context[chats], context_ngram)
                picks.append(_pick(lp, t, delay, greedy, beam, topk))
            cvals = torch.cat([v for v, _ in picks]) if len(picks) > 1 else picks[0][0]
            ctoks = torch.cat([i for _, i in picks]) if len(picks) > 1 else picks[0][1]
        else:
            # the projection fused with log-softmax, masking and top-k (projection.py): each
            # branch below takes the same top-k entries it takes from the full scores
            assert isinstance(stepper, FastDecoder)
            blocked = _blocked_pairs(
                rows, t < min_length, eos, hyps, block_ngram, context, context_ngram, beam
            )
            k = topk if t < delay else 1 if greedy else beam
            cvals, ctoks = fused.topk(stepper.hidden(t).squeeze(1), k, temperature, blocked)

        if t < delay:
            # TopKSampling.select_paths: every row draws one token from its own top-k (at the
            # first step all rows are the same start: that is what makes them differ)
            prior = scores if t == 0 else scores.masked_fill(last == eos, NEG)
            values, indices = cvals, ctoks
            choices = torch.multinomial(torch.softmax(values, dim=-1), 1)
            tok_ids = indices.gather(1, choices).view(bsz, beam)
            new_scores = values.gather(1, choices).view(bsz, beam) + prior
            hyp_ids = torch.arange(beam, device=dev).expand(bsz, beam)
        elif t == 0:
            # only the first hypothesis of each chat exists yet
            if fused is not None:
                best = cvals.view(bsz, beam, -1)[:, 0, :]
                tok = ctoks.view(bsz, beam, -1)[:, 0, :]
            else:
                best, tok = cvals, ctoks  # per chat (_pick)
            new_scores = best + scores[:, :1]
            hyp_ids = torch.zeros(bsz, beam, dtype=torch.long, device=dev)
            tok_ids = tok
        else:
            prior = scores.masked_fill(last == eos, NEG)
            if greedy:
                best, tok = cvals.view(bsz, 1), ctoks.view(bsz, 1)
                new_scores = best + prior
                hyp_ids = torch.zeros(bsz, 1, dtype=torch.long, device=dev)
                tok_ids = tok
            else:
                vals, toks = cvals, ctoks
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


def _step_scores(
    stepper: FastDecoder | GenericDecoder, model: Any, t: int, beam: int
) -> Iterator[tuple[int, torch.Tensor]]:
    """The step's next-token scores, (first row, scores of whole chats' rows)."""
    if isinstance(stepper, FastDecoder):
        yield from projection.step_scores(model, stepper.hidden(t), beam)
    else:
        yield 0, stepper.logits(t)


def _pick(
    lp: torch.Tensor, t: int, delay: int, greedy: bool, beam: int, topk: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """What the step takes of the log-probabilities `lp` (chats, beam, vocab) of some chats,
    as (values, tokens): each row's top-k while sampling; at the first step each chat's best
    (greedy) or top `beam` of its first row; then each row's best (greedy) or top `beam`."""
    flat = lp.view(-1, lp.size(-1))
    if t < delay:
        values, tokens = flat.topk(topk, dim=-1)
    elif t == 0 and greedy:
        values, tokens = lp[:, 0, :].max(1, keepdim=True)
    elif t == 0:
        values, tokens = torch.topk(lp[:, 0, :], beam, dim=1)
    elif greedy:
        values, tokens = flat.max(1, keepdim=True)
    else:
        values, tokens = row_topk(flat, beam)
    return values, tokens


def _blocked_pairs(
    rows: int,
    short: bool,
    eos: int,
    hyps: torch.Tensor,
    block_ngram: int,
    context: torch.Tensor | None,
    context_ngram: int,
    beam: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The (row, token) pairs the search masks this step: end of sentence while the reply is
    shorter than the minimum (`short`), then self and context n-gram blocking."""
    parts = []
    if short:
        r = torch.arange(rows, device=hyps.device)
        parts.append((r, torch.full_like(r, eos)))
    if block_ngram > 0:
        parts.append(self_ngram_blocks(hyps, block_ngram))
    if context is not None:
        parts.append(context_ngram_blocks(hyps, context, context_ngram, beam))
    if not parts:
        empty = torch.zeros(0, dtype=torch.long, device=hyps.device)
        return empty, empty
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
