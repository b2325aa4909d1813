"""An int8 self-attention's q / k / v as one product (bot/inference/fastgen/qkv.py) against the
three dynamic int8 linears `quantize_dynamic` makes: the same values to the bit, one copy of
the weights."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from parlai.agents.transformer.modules import MultiHeadAttention
from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

from bot.inference.fastgen import qkv


def quantized_attention(dim: int = 64, heads: int = 4, seed: int = 3) -> MultiHeadAttention:
    """ParlAI's attention with its linears made dynamic int8, as QUANTIZE=int8 makes them;
    the three projections with different weight ranges (so different scales)."""
    torch.manual_seed(seed)
    attn = MultiHeadAttention({"n_heads": heads, "embedding_size": dim})
    with torch.no_grad():
        for i, lin in enumerate((attn.q_lin, attn.k_lin, attn.v_lin)):
            lin.weight.mul_(0.5 + i)
            lin.bias.normal_()
    attn.eval()
    torch.ao.quantization.quantize_dynamic(attn, {torch.nn.Linear}, dtype=torch.qint8, inplace=True)
    return attn


@pytest.mark.parametrize("rows", [1, 10, 320])
def test_the_merged_product_is_the_three_products_to_the_bit(rows: int) -> None:
    attn = quantized_attention()
    lins = [attn.q_lin, attn.k_lin, attn.v_lin]
    scales = {lin._packed_params._weight_bias()[0].q_scale() for lin in lins}
    assert len(scales) == 3  # three different scales, each kept for its own rows
    merged = qkv.merged_linear(lins)
    x = torch.randn(rows, 64) * 3
    with torch.no_grad():
        expected = torch.cat([lin(x) for lin in lins], dim=-1)
        got = merged(x)
    assert torch.equal(got, expected)


def test_a_merged_attention_gives_parlais_outputs_to_the_bit_with_one_copy_of_the_weights() -> None:
    attn = quantized_attention()
    x = torch.randn(2, 7, 64)
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[1, 5:] = False
    with torch.no_grad():
        before = attn(x, mask=mask)[0]
        q, k, v = (attn.q_lin(x), attn.k_lin(x), attn.v_lin(x))
    gone = [weakref.ref(attn.q_lin), weakref.ref(attn.k_lin), weakref.ref(attn.v_lin)]
    assert qkv.merge(attn)
    assert not qkv.merge(attn)  # once
    gc.collect()
    assert all(ref() is None for ref in gone)  # the three modules, and their weights, are freed
    assert isinstance(attn.q_lin, qkv.Part)
    assert {k.split(".")[0] for k in attn.state_dict()} == {"qkv_lin", "out_lin"}
    with torch.no_grad():
        # ParlAI's own forward (its search, teacher-forced scoring) through the Parts
        assert torch.equal(attn(x, mask=mask)[0], before)
        # the fast paths' one product
        got = qkv.project(attn, x)
    for a, b in zip(got, (q, k, v), strict=True):
        assert torch.equal(a, b)


def test_only_dynamic_int8_linears_are_merged() -> None:
    fp32 = MultiHeadAttention({"n_heads": 4, "embedding_size": 64})
    assert not qkv.mergeable(fp32)
    assert not qkv.merge(fp32)
    assert type(fp32.q_lin) is torch.nn.Linear
    q, _, _ = qkv.project(fp32, torch.ones(1, 1, 64))  # three products, the module's own
    assert torch.equal(q, fp32.q_lin(torch.ones(1, 1, 64)))
    fp16 = MultiHeadAttention({"n_heads": 4, "embedding_size": 64})
    torch.ao.quantization.quantize_dynamic(
        fp16, {torch.nn.Linear}, dtype=torch.float16, inplace=True
    )
    assert type(fp16.q_lin) is DynamicLinear
    assert not qkv.mergeable(fp16)


def test_merge_can_be_turned_off_for_a_benchmarks_before_figures() -> None:
    class Stack(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleList([torch.nn.Module()])
            self.layers[0].self_attention = quantized_attention()

    class Model(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.decoder = Stack()

    qkv.use(False)
    try:
        model = Model()
        assert qkv.prepare(model) == 0
        assert type(model.decoder.layers[0].self_attention.q_lin) is DynamicLinear
    finally:
        qkv.use(True)
    assert qkv.prepare(model) == 1
    assert isinstance(model.decoder.layers[0].self_attention.q_lin, qkv.Part)
