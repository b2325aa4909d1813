"""Search kernels on the whole batch at once: top-k over a large vocabulary, n-gram blocking."""

from __future__ import annotations

import torch
from parlai.utils.torch import neginf

# ParlAI's neginf(torch.float32): what it writes into blocked log-probabilities (the search
# always works in float32).
NEG = neginf(torch.float32)


def row_topk(x: torch.Tensor, k: int, chunk: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
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


def block_self_ngrams(lp: torch.Tensor, hyps: torch.Tensor, n: int) -> None:
    """ParlAI's TreeSearch._block_ngrams on its own hypotheses, for every row at once.

    `lp` is (rows, vocab), `hyps` (rows, length) including the start token. A token is blocked
    when it would repeat an n-gram the hypothesis already contains.
    """
    if n == 1:
        lp.scatter_(1, hyps, NEG)
        return
    r, tok = self_ngram_blocks(hyps, n)
    if r.numel():
        lp[r, tok] = NEG


def self_ngram_blocks(hyps: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The (row, token) pairs `block_self_ngrams` blocks."""
    rows, length = hyps.shape
    if n == 1:
        r = torch.arange(rows, device=hyps.device).repeat_interleave(length)
        return r, hyps.reshape(-1)
    if length < n:
        return _none(hyps.device)
    windows = hyps.unfold(1, n, 1)  # (rows, length - n + 1, n)
    prefix = hyps[:, length - (n - 1) :]
    match = (windows[:, :, :-1] == prefix.unsqueeze(1)).all(dim=2)
    r, w = match.nonzero(as_tuple=True)
    return r, windows[r, w, -1]


def _none(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    empty = torch.zeros(0, dtype=torch.long, device=device)
    return empty, empty


def block_context_ngrams(
    lp: torch.Tensor, hyps: torch.Tensor, context: torch.Tensor, n: int
) -> None:
    """ParlAI's context blocking for every row at once.

    `lp` is (bsz, beam, vocab), `hyps` (bsz * beam, length), `context` (bsz, context length),
    padding included (ParlAI blocks with the padded batch row too).
    """
    bsz, beam, _ = lp.shape
    if context.size(1) == 0:
        return
    if n == 1:
        index = context.unsqueeze(1).expand(bsz, beam, context.size(1))
        lp.scatter_(2, index, NEG)
        return
    r, tok = context_ngram_blocks(hyps, context, n, beam)
    if r.numel():
        lp[torch.div(r, beam, rounding_mode="trunc"), r % beam, tok] = NEG


def context_ngram_blocks(
    hyps: torch.Tensor, context: torch.Tensor, n: int, beam: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The (row, token) pairs `block_context_ngrams` blocks (rows of `hyps`, bsz * beam)."""
    bsz = context.size(0)
    length = hyps.size(1)
    if context.size(1) == 0:
        return _none(hyps.device)
    if n == 1:
        r = torch.arange(bsz * beam, device=hyps.device).repeat_interleave(context.size(1))
        return r, context.repeat_interleave(beam, dim=0).reshape(-1)
    if length < n - 1 or context.size(1) < n:
        return _none(hyps.device)
    windows = context.unfold(1, n, 1)  # (bsz, windows, n)
    prefix = hyps[:, length - (n - 1) :].view(bsz, beam, 1, n - 1)
    match = (windows[:, :, :-1].unsqueeze(1) == prefix).all(dim=3)  # (bsz, beam, windows)
    b, k, w = match.nonzero(as_tuple=True)
    return b * beam + k, windows[b, w, -1]
