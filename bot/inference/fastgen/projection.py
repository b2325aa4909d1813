"""The output projection (hidden state -> next-token scores over the vocabulary) in the fast path.

ParlAI scores with `F.linear(x, embeddings.weight)` over the whole vocabulary, then the search
takes a log-softmax and a top-k of it. At BlenderBot-90M's 54,944 words that projection is 42%
of a beam-10 reply's arithmetic, and dynamic int8 quantization never sees it (it is not an
`nn.Linear`). `Projection` is the faster variant the fast search uses when a faster mode is on
(QUANTIZE=int8, DTYPE=bf16/fp16); the default keeps ParlAI's own call, bit for bit.

- kind "int8": the embedding matrix quantized per row (per output channel) to int8 and
  prepacked for fbgemm (`torch.ops.quantized.linear_dynamic`: activations quantized per call,
  int32 accumulation). On a VNNI/AMX CPU it is 3-6x faster than the fp32 product.
- kind "fused": the weights as they are (fp32, or the bf16/fp16 of DTYPE), computed in slices.

`topk` fuses the projection with the log-softmax and the top-k: the vocabulary is walked in
slices whose scores stay in cache; each slice gives its log-sum-exp (merged into the
log-softmax's normaliser over the whole vocabulary) and its own top-k after the blocked tokens
are masked; the merged candidates, less the normaliser, are the top-k log-probabilities. The
full-vocabulary scores never exist at once, and the tokens are those of `F.linear` +
`log_softmax` + `topk` (tests/unit/inference/test_projection.py).

Row blocks (kind "int8"): with many rows of hypotheses (beam 10 at batch 16 and more), the full
scores are (rows, 54,944) floats, 70 MB at 320 rows, and the log-softmax and top-k that follow
each read them from memory again. `blocks` cuts the rows into blocks of whole chats of about
`BLOCK_ROWS` rows, and the search takes each block through the projection, its log-softmax,
masks and top-k while it is in cache (beam.py, continuous.py). Each block's activations are
quantized over the whole input's range (`block_scores`: a row holding its min and max goes
along), so the scores, and hence the replies, are those of one call over every row, to the bit
(tests/unit/inference/test_projection.py). Measured on an AVX2-only EPYC, one thread (a probe,
median of 5, projection + log-softmax + top-10 per row): 253 -> 156 ms at 320 rows, 153 -> 118
at 240, 119 -> 83 at 160; at 80 and 120 rows no gain (36 -> 38, 54 -> 58), hence `BLOCK_FROM`.

It does not pay on this CPU, so it is off (`fuse=False`: the search takes `scores`, then its own
log-softmax and top-k). Best of 15 on one thread of an AMX/VNNI Xeon vCPU, vocab 54,944 x 512,
rows = hypotheses (ms): int8 full scores + log-softmax + top-k 4.0 / 7.0 / 10.9 / 58.9 at 1 / 8
/ 10 / 80 rows, fused in 16,384-word slices 5.1 / 7.8 / 15.4 / 62.7 (8,192: 9.7 / 9.9 / 19.9 /
65.8); fp32 fused 22.6 / 56.7 / 79.0 / 172.0 against ParlAI's 15.1 / 50.0 / 65.9 / 136.7. The
product dominates; what fusing saves (one pass over the scores) is less than the per-slice
calls cost. A compiled kernel (one pass, in registers) might change that.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

import torch
import torch.nn.functional as F
from parlai.utils.torch import neginf

from bot.inference import hardware
from bot.inference.fastgen.kernels import NEG, row_topk

Kind = Literal["int8", "fused"]

# Vocabulary slice of the fused top-k: 16,384 rows of int8 weights (8 MiB) and, at 80 rows of
# hypotheses, 5 MiB of scores per slice (the fastest of 8,192 / 16,384 / whole, measured).
SLICE = 16384

_ATTR = "_fastgen_projection"

# int8 scores of at least BLOCK_FROM rows go through the search in blocks of about BLOCK_ROWS
# rows (whole chats), each while in cache (the module's note); 0 turns the blocks off.
BLOCK_ROWS = 40
BLOCK_FROM = 160


class Projection:
    """The output projection of one model (shared by every clone of it)."""

    def __init__(
        self,
        weight: torch.Tensor,
        kind: Kind,
        slice_rows: int = SLICE,
        start: int | None = None,
        fuse: bool = False,
    ) -> None:
        self.kind = kind
        # whether the search takes `topk` (fused) rather than `scores` (see the module's note)
        self.fuse = fuse
        # ParlAI's `output` never lets the start token be generated: its score is set to
        # neginf before anything else (so it counts for nothing in the normaliser)
        self.start = start
        self.vocab = weight.size(0)
        self.bounds = [
            (lo, min(lo + slice_rows, self.vocab)) for lo in range(0, self.vocab, slice_rows)
        ]
        w = weight.detach()
        self.weight = w
        # 7-bit activations (quantize_dynamic's default for fbgemm) where the kernels sum
        # pairs of products in 16 bits; the full 8 bits (half the error) on VNNI/AMX
        self.reduce_range = not hardware.has_int8_dot()
        if kind == "int8":
            self.full = _prepack_int8(w)
            # the sliced copy (another 28 MB at 54,944 x 512) only where `topk` is used
            self.slices: list[Any] = (
                [_prepack_int8(w[lo:hi]) for lo, hi in self.bounds] if fuse else []
            )
        else:
            self.full = w
            self.slices = [w[lo:hi] for lo, hi in self.bounds]
        # rows per block of `blocks` (int8 only: a float product's rounding may depend on how
        # many rows it has, and the default must stay ParlAI's to the bit)
        self.block_rows = BLOCK_ROWS if kind == "int8" else 0

    def _linear(self, x: torch.Tensor, weight: Any) -> torch.Tensor:
        if self.kind == "int8":
            out = torch.ops.quantized.linear_dynamic(x.float(), weight, self.reduce_range)
            return out  # type: ignore[no-any-return]
        return F.linear(x, weight)

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        """Scores over the whole vocabulary, (rows, vocab), like ParlAI's `output`."""
        out = self._linear(x, self.full)
        if self.start is not None:
            out[:, self.start] = neginf(out.dtype)
        return out

    def blocks(self, rows: int, group: int) -> list[tuple[int, int]]:
        """The row ranges (of whole groups of `group` rows: a chat's beam) in which the search
        takes scores for `rows` rows: one range unless the blocks pay (the module's note)."""
        if not self.block_rows or rows < BLOCK_FROM:
            return [(0, rows)]
        step = max(1, self.block_rows // group) * group
        return [(lo, min(lo + step, rows)) for lo in range(0, rows, step)]

    def block_scores(
        self, x: torch.Tensor, bounds: list[tuple[int, int]]
    ) -> Iterator[tuple[int, torch.Tensor]]:
        """`scores(x)` one row range of `bounds` at a time, as (first row, its scores); each
        block equal to the bit to the same rows of `scores(x)`.

        int8 activations are quantized per call over the input's range (its min and max,
        widened to hold 0): a row holding the whole input's min and max goes with each block,
        so every block is quantized as the whole input would be, and its output is dropped."""
        if len(bounds) == 1 or self.kind != "int8" or x.size(1) < 2:
            yield 0, self.scores(x)
            return
        x = x.float()
        span = torch.zeros(1, x.size(1), dtype=x.dtype, device=x.device)
        span[0, 0], span[0, 1] = x.min(), x.max()
        for lo, hi in bounds:
            out = self._linear(torch.cat([x[lo:hi], span]), self.full)[:-1]
            if self.start is not None:
                out[:, self.start] = neginf(out.dtype)
            yield lo, out

    def topk(
        self,
        x: torch.Tensor,
        k: int,
        temperature: float = 1.0,
        blocked: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k log-probabilities per row and their tokens, values sorted descending.

        `x` is (rows, dim); `blocked` (row indices, token indices) are the tokens the search
        masks (min length, n-gram blocking): they count in the normaliser (ParlAI masks after
        the log-softmax) and come out as NEG if they are ever among the top k.
        """
        lses, cand_v, cand_i = [], [], []
        if blocked is not None and blocked[0].numel() == 0:
            blocked = None
        if len(self.slices) != len(self.bounds):
            self.slices = [_prepack_int8(self.weight[lo:hi]) for lo, hi in self.bounds]
        for (lo, hi), weight in zip(self.bounds, self.slices, strict=True):
            z = self._linear(x, weight).float()
            if self.start is not None and lo <= self.start < hi:
                z[:, self.start - lo] = neginf(z.dtype)
            if temperature != 1.0:
                z.div_(temperature)
            lses.append(torch.logsumexp(z, dim=1))
            if blocked is not None:
                inside = (blocked[1] >= lo) & (blocked[1] < hi)
                if bool(inside.any()):
                    z[blocked[0][inside], blocked[1][inside] - lo] = float("-inf")
            v, i = row_topk(z, min(k, hi - lo))
            cand_v.append(v)
            cand_i.append(i + lo)
        lse = torch.logsumexp(torch.stack(lses, dim=1), dim=1)
        values = torch.cat(cand_v, dim=1) - lse.unsqueeze(1)
        values, pos = values.topk(k, dim=1)
        tokens = torch.cat(cand_i, dim=1).gather(1, pos)
        return values.masked_fill_(values == float("-inf"), NEG), tokens


def _prepack_int8(w: torch.Tensor) -> Any:
    w = w.float()
    scales = (w.abs().amax(dim=1) / 127.0).clamp_min(1e-12).double()
    zeros = torch.zeros(w.size(0), dtype=torch.long)
    q = torch.quantize_per_channel(w, scales, zeros, 0, torch.qint8)
    return torch.ops.quantized.linear_prepack(q, None)


def prepare(
    model: Any, kind: Kind | None, slice_rows: int = SLICE, fuse: bool = False
) -> Projection | None:
    """Give `model` (a TransformerGeneratorModel) a faster output projection of `kind`, used by
    the fast search from now on (clones share the model, so they share it too); None gives it
    back ParlAI's own."""
    if kind is None:
        model.__dict__.pop(_ATTR, None)
        return None
    projection = Projection(model.embeddings.weight, kind, slice_rows, model.start_idx, fuse)
    object.__setattr__(model, _ATTR, projection)
    return projection


def step_scores(model: Any, x: torch.Tensor, group: int) -> Iterator[tuple[int, torch.Tensor]]:
    """Next-token scores for the decoder output `x` (rows, 1, dim) as (first row, scores of
    whole groups of `group` rows): all rows at once (`scores`), or the int8 projection's row
    blocks where they pay (the module's note)."""
    projection = of(model)
    bounds = projection.blocks(x.size(0), group) if projection is not None else []
    if projection is None or len(bounds) == 1:
        yield 0, scores(model, x).squeeze(1)
        return
    yield from projection.block_scores(x.squeeze(1), bounds)


def of(model: Any) -> Projection | None:
    """The model's faster output projection, None where it keeps ParlAI's own."""
    return getattr(model, _ATTR, None)  # type: ignore[no-any-return]


def scores(model: Any, x: torch.Tensor) -> torch.Tensor:
    """Next-token scores (rows, 1, vocab) for the decoder output `x` (rows, 1, dim): the
    model's faster projection where it has one, else ParlAI's `model.output`."""
    projection = of(model)
    if projection is None:
        return model.output(x)  # type: ignore[no-any-return]
    return projection.scores(x.squeeze(1)).unsqueeze(1)
