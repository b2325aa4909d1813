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

It does not pay on this CPU, so it is off (`fuse=False`: the search takes `scores`, then its own
log-softmax and top-k). Best of 15 on one thread of an AMX/VNNI Xeon vCPU, vocab 54,944 x 512,
rows = hypotheses (ms): int8 full scores + log-softmax + top-k 4.0 / 7.0 / 10.9 / 58.9 at 1 / 8
/ 10 / 80 rows, fused in 16,384-word slices 5.1 / 7.8 / 15.4 / 62.7 (8,192: 9.7 / 9.9 / 19.9 /
65.8); fp32 fused 22.6 / 56.7 / 79.0 / 172.0 against ParlAI's 15.1 / 50.0 / 65.9 / 136.7. The
product dominates; what fusing saves (one pass over the scores) is less than the per-slice
calls cost. A compiled kernel (one pass, in registers) might change that.
"""

from __future__ import annotations

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
