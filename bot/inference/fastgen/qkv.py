"""A self-attention's query, key and value projections as one int8 product (QUANTIZE=int8).

A dynamic int8 linear quantizes its input on every call (its range, then every value), packs
it, multiplies and converts back: at one row of BlenderBot-90M's 512 dims that fixed part is
most of the call. A self-attention's three projections all read the same input, so ParlAI's
module quantizes that input three times. `prepare` joins their int8 weights into one
(3 x dim, dim) matrix whose rows keep their own matrix's scale (a per-channel scale: the
three per-tensor scales, one per row), and the three products become one: the input is
quantized once, exactly as each of the three quantized it, and every output value is the
same integer sum scaled by the same two factors. The results are the three products' to the
bit (tests/unit/inference/test_qkv.py); a layer's three products at one row took 146 -> 47 µs
on an AVX2-only EPYC, one thread (docs/benchmarks.md).

The merged module (`qkv_lin`, registered on the attention) holds the only copy of the weights:
`q_lin`, `k_lin` and `v_lin` become `Part`s of it, which hold no weights, so the model's memory
stays the same. ParlAI's own code (its search where ours falls back, teacher-forced scoring)
still calls `attn.q_lin(x)` and gets the same values, at the cost of the merged product for
each of the three; the fast paths call `project` and make one product.

Only for models whose linears `quantize_dynamic` turned into dynamic int8 modules: a float
product's rounding may depend on its shape, and the default keeps ParlAI's products bit for
bit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

# The attribute the merged module is registered under, beside ParlAI's q_lin / k_lin / v_lin.
MERGED = "qkv_lin"
PARTS = ("q_lin", "k_lin", "v_lin")

# Whether `prepare` merges (the default); use(False) keeps three products: bench.peer's
# "before" systems (ours_*_int8qkv3), in their own worker process.
MERGE = True


def use(enabled: bool) -> None:
    """Set MERGE for this process (a benchmark's worker)."""
    global MERGE
    MERGE = enabled


class Part(torch.nn.Module):  # type: ignore[misc]
    """One of an attention's q / k / v projections as a share of the merged product: columns
    `lo:hi` of its output. Holds no weights (the merged module is kept in a tuple, so that the
    state_dict has one key per weight)."""

    def __init__(self, merged: DynamicLinear, lo: int, hi: int) -> None:
        super().__init__()
        self.merged = (merged,)
        self.lo, self.hi = lo, hi
        self.in_features = merged.in_features
        self.out_features = hi - lo

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.merged[0](x)[..., self.lo : self.hi].contiguous()  # type: ignore[no-any-return]


def mergeable(attn: Any) -> bool:
    """True when the attention's q / k / v are dynamic int8 linears of one input width with
    per-tensor weights (what `quantize_dynamic` makes), not merged yet."""
    if getattr(attn, MERGED, None) is not None:
        return False
    found = [getattr(attn, name, None) for name in PARTS]
    lins: list[Any] = [lin for lin in found if type(lin) is DynamicLinear]
    if len(lins) != len(PARTS):
        return False
    if len({lin.in_features for lin in lins}) != 1:
        return False
    if len({getattr(lin, "version", None) for lin in lins}) != 1:
        return False
    for lin in lins:
        if lin._packed_params.dtype != torch.qint8:
            return False
        weight, _ = lin._packed_params._weight_bias()
        if weight.qscheme() not in (torch.per_tensor_affine, torch.per_tensor_symmetric):
            return False
        if weight.q_zero_point() != 0:
            return False
    return True


def merged_linear(lins: list[DynamicLinear]) -> DynamicLinear:
    """One dynamic int8 linear whose output is the concatenation of `lins`' outputs, to the
    bit: their int8 weights stacked, each row with its own matrix's scale."""
    weights, biases = zip(*(lin._packed_params._weight_bias() for lin in lins), strict=True)
    ints = torch.cat([w.int_repr() for w in weights])
    scales = torch.cat([torch.full((w.size(0),), w.q_scale(), dtype=torch.double) for w in weights])
    zeros = torch.zeros(ints.size(0), dtype=torch.long)
    weight = torch._make_per_channel_quantized_tensor(ints, scales, zeros, 0)
    if all(b is None for b in biases):
        bias = None
    else:
        bias = torch.cat(
            [
                b if b is not None else torch.zeros(w.size(0))
                for b, w in zip(biases, weights, strict=True)
            ]
        )
    merged = DynamicLinear(lins[0].in_features, ints.size(0), dtype=torch.qint8)
    merged.set_weight_bias(weight, bias)
    merged.version = lins[0].version  # the same reduce_range as the three
    return merged


def merge(attn: Any) -> bool:
    """Replace `attn`'s q / k / v by `Part`s of one merged product (in place); False, and
    nothing changed, where they are not `mergeable`."""
    if not mergeable(attn):
        return False
    lins = [getattr(attn, name) for name in PARTS]
    merged = merged_linear(lins)
    setattr(attn, MERGED, merged)
    lo = 0
    for name, lin in zip(PARTS, lins, strict=True):
        setattr(attn, name, Part(merged, lo, lo + lin.out_features))
        lo += lin.out_features
    return True


Projected = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def projector(
    attn: Any, call: Callable[[Any], Callable[[torch.Tensor], torch.Tensor]] = lambda m: m
) -> Callable[[torch.Tensor], Projected]:
    """A function giving the query, key and value projections of its input: one product where
    `attn` was merged (views into its output), else the three modules' own. `call(module)`
    is how a module is called (the decoder step passes `steppers.direct`)."""
    merged = getattr(attn, MERGED, None)
    if merged is None:
        q_lin, k_lin, v_lin = (call(getattr(attn, name)) for name in PARTS)
        return lambda x: (q_lin(x), k_lin(x), v_lin(x))
    product = call(merged)
    (a, b), (c, d), (e, f) = ((part.lo, part.hi) for part in (attn.q_lin, attn.k_lin, attn.v_lin))

    def project(x: torch.Tensor) -> Projected:
        out = product(x)
        return out[..., a:b], out[..., c:d], out[..., e:f]

    return project


def project(attn: Any, x: torch.Tensor) -> Projected:
    """The query, key and value projections of `x` (`projector`'s, with the modules called as
    they are)."""
    return projector(attn)(x)


def prepare(model: Any) -> int:
    """Merge the q / k / v of every self-attention of `model`'s stock encoder and decoder layers
    (clones share the model, so they share the merge); returns how many were merged (0 where
    MERGE is off or nothing is a dynamic int8 linear)."""
    if not MERGE:
        return 0
    done = 0
    for stack, name in (
        (getattr(model, "encoder", None), "attention"),
        (model.decoder, "self_attention"),
    ):
        for layer in getattr(stack, "layers", ()):
            attn = getattr(layer, name, None)
            if attn is not None and merge(attn):
                done += 1
    return done
