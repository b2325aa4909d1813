"""One chat's beam search inside the continuous batch (bot.inference.fastgen.continuous): its
hypotheses, the constraints on its scores (min length, n-gram and context blocking), the
selection of its next tokens and finished hypotheses, the settled start of its reply (a draft),
and its result, with the arithmetic of `beam.batched_generate` for a batch of one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from bot.inference.fastgen.beam import BatchedBeams
from bot.inference.fastgen.kernels import NEG, block_context_ngrams, block_self_ngrams


def shared_start(rows: Sequence[Sequence[int]]) -> list[int]:
    """The longest token prefix all `rows` share."""
    out = []
    for column in zip(*rows, strict=False):
        if any(token != column[0] for token in column):
            break
        out.append(column[0])
    return out


@dataclass
class ChatSearch:
    """One chat's beam search state, stepped by `ContinuousSearch`.

    `beam.batched_generate` for a batch of one: the same arithmetic in the same order.
    """

    key: Any  # the caller's handle for this chat (returned when it finishes)
    beam: int
    max_ts: int
    greedy: bool
    delay: int
    topk: int
    min_length: int
    block_ngram: int
    context_ngram: int
    length_penalty: float
    bos: int
    eos: int
    context: torch.Tensor | None  # (1, context length) for context blocking
    # per layer: keys transposed (heads, dh, L) and values (heads, L, dh)
    cross: list[tuple[torch.Tensor, torch.Tensor]]
    length: int  # encoder positions
    t: int = 0
    hyps: torch.Tensor = field(default_factory=lambda: torch.empty(0))
    scores: torch.Tensor = field(default_factory=lambda: torch.empty(0))
    last: torch.Tensor = field(default_factory=lambda: torch.empty(0))
    tokens_hist: list[torch.Tensor] = field(default_factory=list)
    back_hist: list[torch.Tensor] = field(default_factory=list)
    score_hist: list[torch.Tensor] = field(default_factory=list)
    eos_top: bool = False
    n_best: int = 0
    finished: list[tuple[int, int]] = field(default_factory=list)
    # the length-penalised scores of `finished`, as far as `settled` computed them
    _penalised: list[float] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        dev = self.cross[0][1].device
        self.hyps = torch.full((self.beam, 1), self.bos, dtype=torch.long, device=dev)
        self.scores = torch.zeros(1, self.beam, dtype=torch.float32, device=dev)
        self.last = torch.full((1, self.beam), self.bos, dtype=torch.long, device=dev)

    @property
    def done(self) -> bool:
        """ParlAI's TreeSearch.is_done, or the step limit reached."""
        return (self.eos_top and self.n_best >= self.beam) or self.t >= self.max_ts

    def constrain(self, lp: torch.Tensor) -> None:
        """Min length and n-gram blocking on this chat's rows of log-probabilities (in place)."""
        if self.t < self.min_length:
            lp[:, self.eos] = NEG
        if self.block_ngram > 0:
            block_self_ngrams(lp, self.hyps, self.block_ngram)
        if self.context is not None:
            block_context_ngrams(lp.unsqueeze(0), self.hyps, self.context, self.context_ngram)

    def select(
        self, lp: torch.Tensor, row_vals: torch.Tensor | None, row_toks: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Choose this step's hypotheses; returns (back-pointers, tokens), both (beam,).

        `lp` is (beam, vocab); `row_vals`/`row_toks` its per-row top-beam (beam search after
        the first step only).
        """
        beam, t = self.beam, self.t
        dev = lp.device
        scores, last = self.scores, self.last
        vocab = lp.size(-1)
        if t < self.delay:
            prior = scores if t == 0 else scores.masked_fill(last == self.eos, NEG)
            values, indices = lp.topk(self.topk, dim=-1)
            choices = torch.multinomial(torch.softmax(values, dim=-1), 1)
            tok_ids = indices.gather(1, choices).view(1, beam)
            new_scores = values.gather(1, choices).view(1, beam) + prior
            hyp_ids = torch.arange(beam, device=dev).expand(1, beam)
        elif t == 0:
            first = lp[:1, :]
            if self.greedy:
                best, tok = first.max(1, keepdim=True)
            else:
                best, tok = torch.topk(first, beam, dim=1)
            new_scores = best + scores[:, :1]
            hyp_ids = torch.zeros(1, beam, dtype=torch.long, device=dev)
            tok_ids = tok
        else:
            prior = scores.masked_fill(last == self.eos, NEG)
            if self.greedy:
                best, tok = lp.view(1, vocab).max(1, keepdim=True)
                new_scores = best + prior
                hyp_ids = torch.zeros(1, 1, dtype=torch.long, device=dev)
                tok_ids = tok
            else:
                assert row_vals is not None and row_toks is not None
                cand = row_vals.view(1, beam, beam) + prior.unsqueeze(2)
                new_scores, pos = torch.topk(cand.view(1, beam * beam), beam, dim=1)
                hyp_ids = torch.div(pos, beam, rounding_mode="trunc")
                tok_ids = row_toks.view(1, beam * beam).gather(1, pos)
        self.hyps = torch.cat(
            [torch.index_select(self.hyps, 0, hyp_ids.view(-1)), tok_ids.view(beam, 1)], dim=1
        )
        self.tokens_hist.append(tok_ids)
        self.back_hist.append(hyp_ids)
        self.score_hist.append(new_scores)
        self.t = t + 1
        if bool(tok_ids[0, 0] == self.eos):
            self.eos_top = True
        ended = (tok_ids[0] == self.eos) & (new_scores[0] > NEG)
        if bool(ended.any()):
            for k in ended.nonzero().view(-1).tolist():
                self.finished.append((t + 1, k))
                self.n_best += 1
        self.scores, self.last = new_scores, tok_ids
        return hyp_ids.view(-1), tok_ids.view(-1)

    def settled(self) -> tuple[list[int], bool]:
        """The tokens the reply will begin with, whatever the remaining steps do, and whether
        they are the whole reply (start and end tokens left out). Only these are shown in a
        draft: the best hypothesis so far is not a prefix of the result (beams overtake each
        other), so a draft made of it can take words back.

        What this proves, for the search `select` runs (ParlAI's TreeSearch: beam, greedy,
        delayed beam), after step t:

        1. The result is the finished hypothesis with the best length-penalised score
           (score / p(ts), p(ts) = ((2 + ts) / 6) ** length_penalty; the earlier finisher on
           a tie), or, when none finished by `max_ts`, row 0 there with its last token made
           the end token.
        2. Every hypothesis that finishes after t, and row 0 at `max_ts`, extends a live row
           of step t (last token not the end token, score above NEG): an ended row's
           extensions score NEG or less and are never counted as finished (nor row 0, unless
           every extension of every live row is blocked); min length and n-gram blocking
           only remove extensions.
        3. A finished hypothesis whose penalised score is below the best finished one's is
           never chosen (the best one stays in the list). Those within a rounding margin
           (1e-4, relative) of the best stay candidates, so float rounding decides nothing.
        4. Scores only fall (log-probabilities are <= 0), so a live row with score S can
           finish at a step T in (t, max_ts] with a penalised score of at most
           max(S / p(t + 1), S / p(max_ts)). A row whose bound is below the best finished
           score by more than the margin can no longer win, nor can its extensions.

        So the result extends one of: the finished candidates of 3 and the live rows not
        ruled out by 4, and their longest common token prefix is a prefix of the result.
        While nothing has finished, the prefix is cut to `max_ts - 1` tokens (the part of
        row 0 a forced end keeps). The whole reply is known once only finished candidates
        remain and they agree. The candidates of a later step descend from these (or are
        these), so the settled prefix only grows. Greedy search: the tokens so far. Sampling
        (top-k, nucleus) never runs here (the micro-batcher answers it, without drafts).
        """
        if self.t == 0:
            return [], False
        rows = self.hyps.tolist()
        scores = self.scores[0].tolist()
        last = self.last[0].tolist()
        # penalised scores of the finished hypotheses, computed once each
        for ts, k in self.finished[len(self._penalised) :]:
            self._penalised.append(float(self.score_hist[ts - 1][0, k]) / self._penalty(ts))
        candidates: list[list[int]] = []
        best = max(self._penalised, default=None)
        margin = 1e-4 * max(1.0, abs(best)) if best is not None else 0.0
        if best is not None:
            for (ts, k), score in zip(self.finished, self._penalised, strict=True):
                if score >= best - margin:
                    candidates.append(self._finished_path(ts, k))
        live = 0
        far = (self._penalty(self.t + 1), self._penalty(self.max_ts))
        for k in range(self.beam):
            if last[k] == self.eos or scores[k] <= NEG:
                continue
            if best is not None and max(scores[k] / p for p in far) < best - margin:
                continue  # it can no longer beat the best finished hypothesis
            candidates.append(rows[k][1:])
            live += 1
        if not candidates:
            return [], False
        prefix = shared_start(candidates)
        if best is None:
            prefix = prefix[: self.max_ts - 1]
        complete = live == 0 and all(len(c) == len(prefix) for c in candidates)
        return prefix, complete

    def _penalty(self, timestep: int) -> float:
        """The length penalty of a hypothesis that finishes at `timestep` (BatchedBeams')."""
        return math.pow((1 + timestep + 1) / 6, self.length_penalty)

    def _finished_path(self, timestep: int, hyp: int) -> list[int]:
        """The tokens of a finished hypothesis, without the start and end tokens."""
        out = []
        for i in range(timestep - 1, 0, -1):
            hyp = int(self.back_hist[i][0, hyp])
            out.append(int(self.tokens_hist[i - 1][0, hyp]))
        out.reverse()
        return out

    def result(self) -> BatchedBeams:
        """The finished search, answering get_rescored_finished like ParlAI's TreeSearch."""
        n = self.t
        tokens = torch.cat(self.tokens_hist).tolist() if self.tokens_hist else []
        back = torch.cat(self.back_hist).tolist() if self.back_hist else []
        dev = self.hyps.device
        scores = (
            torch.cat(self.score_hist)
            if self.score_hist
            else torch.zeros(0, self.beam, dtype=torch.float32, device=dev)
        )
        return BatchedBeams(
            tokens[:n],
            back[:n],
            scores[:n],
            self.finished,
            self.bos,
            self.eos,
            self.length_penalty,
            dev,
        )
