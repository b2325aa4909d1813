"""Parts of the batched beam search (bot/inference/fastgen/) that need no model: which agents it
accelerates, and its top-k kernel. The search itself is compared with ParlAI's in
tests/integration/inference/test_fastgen.py."""

from __future__ import annotations

from typing import Any

from bot.inference import fastgen
from bot.inference.fastgen.kernels import row_topk


def test_accelerate_leaves_other_agents_alone() -> None:
    from parlai.agents.transformer.transformer import TransformerGeneratorAgent

    class Custom(TransformerGeneratorAgent):  # type: ignore[misc]
        def _generate(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

    not_a_generator = object()
    assert fastgen.accelerate(not_a_generator) is not_a_generator
    custom = Custom.__new__(Custom)
    assert type(fastgen.accelerate(custom)) is Custom


def test_row_topk_matches_torch_topk_over_a_large_vocabulary() -> None:
    import torch

    generator = torch.Generator().manual_seed(5)
    for vocab in (54_944, 54_945, 4_096, 190):
        x = torch.log_softmax(torch.randn(33, vocab, generator=generator) * 3, dim=-1)
        x[:, torch.randint(0, vocab, (40,), generator=generator)] = fastgen.NEG
        for k in (1, 5, 10):
            values, indices = row_topk(x, k)
            expected = torch.topk(x, k, dim=1)
            assert torch.equal(values, expected.values), (vocab, k)
            assert torch.equal(indices, expected.indices), (vocab, k)


def test_slot_products_pair_every_beam_slot_with_its_own_chats_operand() -> None:
    import torch

    from bot.inference.fastgen.steppers import slot_products

    generator = torch.Generator().manual_seed(3)
    chats, beam, heads, inner, outer = 3, 4, 2, 5, 7
    lhs = torch.randn(chats * beam * heads, 1, inner, generator=generator)
    shared = torch.randn(chats * heads, inner, outer, generator=generator)
    # the reference: row (chat, slot, head) of lhs times its chat's and head's operand
    expected = torch.empty(chats, beam, heads, 1, outer)
    for c in range(chats):
        for j in range(beam):
            for h in range(heads):
                row = (c * beam + j) * heads + h
                expected[c, j, h] = lhs[row] @ shared[c * heads + h]
    exact = slot_products(lhs, shared, chats, beam, heads, outer, exact=True)
    merged = slot_products(lhs, shared, chats, beam, heads, outer, exact=False)
    assert exact.shape == merged.shape == expected.shape
    assert torch.allclose(exact, expected, atol=1e-5)
    assert torch.allclose(merged, expected, atol=1e-5)
    # a view of it is what the cross-attention reads next
    assert merged.view(chats * beam * heads, 1, outer).shape[0] == lhs.size(0)
