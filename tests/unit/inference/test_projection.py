"""The fused output projection (bot/inference/fastgen/projection.py) against the reference:
`F.linear` over the whole vocabulary, `log_softmax`, the search's masking, `topk`."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from bot.inference import hardware
from bot.inference.fastgen.kernels import NEG
from bot.inference.fastgen.projection import Projection

# int8 bound: the largest error of a returned log-probability against the fp32 one, on
# embeddings of BlenderBot-90M's scale (measured: 0.03-0.07 at full range, 0.1 at 7 bits)
INT8_LOGPROB_ERROR = 0.25


def reference(
    x: torch.Tensor,
    w: torch.Tensor,
    k: int,
    temperature: float = 1.0,
    blocked: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    score = F.linear(x, w)
    if temperature != 1.0:
        score.div_(temperature)
    lp = F.log_softmax(score, dim=-1, dtype=torch.float32)
    if blocked is not None:
        lp[blocked] = NEG
    return lp.topk(k, dim=1)


@pytest.fixture
def problem() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    w = torch.randn(3001, 48, generator=gen) * 0.4  # last slice partial
    x = torch.randn(24, 48, generator=gen)
    return x, w


@pytest.mark.parametrize("k", [1, 4, 10])
def test_fused_fp32_gives_the_reference_tokens(problem: tuple, k: int) -> None:
    x, w = problem
    values, tokens = Projection(w, "fused", slice_rows=512).topk(x, k)
    ref_values, ref_tokens = reference(x, w, k)
    assert torch.equal(tokens, ref_tokens)
    assert torch.allclose(values, ref_values, atol=1e-5, rtol=0)


def test_fused_masks_blocked_tokens_after_the_normaliser(problem: tuple) -> None:
    x, w = problem
    _, ref_tokens = reference(x, w, 5)
    # block every row's best two tokens, and token 0 (a first slice) in row 3
    rows = torch.arange(24).repeat_interleave(2)
    blocked = (
        torch.cat([rows, torch.tensor([3])]),
        torch.cat([ref_tokens[:, :2].reshape(-1), torch.tensor([0])]),
    )
    values, tokens = Projection(w, "fused", slice_rows=512).topk(x, 5, 0.7, blocked)
    want_values, want_tokens = reference(x, w, 5, 0.7, blocked)
    assert torch.equal(tokens, want_tokens)
    assert torch.allclose(values, want_values, atol=1e-5, rtol=0)
    assert not (tokens[:, :1] == ref_tokens[:, :1]).any()  # the blocked ones are gone


def test_a_row_with_fewer_free_tokens_than_k_gets_neg() -> None:
    w = torch.randn(20, 8)
    x = torch.randn(2, 8)
    blocked = (torch.zeros(18, dtype=torch.long), torch.arange(18))
    values, tokens = Projection(w, "fused", slice_rows=7).topk(x, 4, blocked=blocked)
    assert set(tokens[0, :2].tolist()) == {18, 19}
    assert torch.equal(values[0, 2:], torch.full((2,), NEG))
    want, _ = reference(x, w, 4, blocked=blocked)
    assert torch.allclose(values[1], want[1], atol=1e-5)


def test_scores_are_the_full_projection(problem: tuple) -> None:
    x, w = problem
    assert torch.equal(Projection(w, "fused").scores(x), F.linear(x, w))


def test_int8_within_the_stated_bound() -> None:
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(20_000, 512, generator=gen) * 0.05
    x = torch.randn(64, 512, generator=gen) * 2
    lp = F.log_softmax(F.linear(x, w), dim=-1)
    values, tokens = Projection(w, "int8").topk(x, 10)
    ref_values, ref_tokens = lp.topk(10, dim=1)
    error = (lp.gather(1, tokens) - values).abs().max().item()
    assert error < INT8_LOGPROB_ERROR
    # the best token agrees almost always; where not, the fp32 gap to the best is in the bound
    assert (tokens[:, 0] == ref_tokens[:, 0]).float().mean() >= 0.9
    assert (ref_values[:, 0] - lp.gather(1, tokens[:, :1])[:, 0]).max() < 2 * INT8_LOGPROB_ERROR
    full = Projection(w, "int8").scores(x)
    assert (full - F.linear(x, w)).abs().max() < INT8_LOGPROB_ERROR


def test_cpu_flags_are_read_from_cpuinfo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        hardware, "read_cpuinfo", lambda: "processor: 0\nflags\t: fpu avx512_vnni amx_bf16\n"
    )
    assert hardware.has_bf16() and hardware.has_int8_dot()
    # FBGEMM told to use its AVX2 kernels saturates as on a CPU without VNNI
    for isa, dot in (("avx2", False), ("AVX512_256", False), ("AVX512_E1", True), ("", True)):
        monkeypatch.setenv(hardware.FBGEMM_ISA_ENV, isa)
        assert hardware.has_int8_dot() is dot, isa
    monkeypatch.delenv(hardware.FBGEMM_ISA_ENV)
    monkeypatch.setattr(hardware, "read_cpuinfo", lambda: "flags\t: fpu avx2\n")
    assert not hardware.has_bf16() and not hardware.has_int8_dot()
    monkeypatch.setattr(hardware, "read_cpuinfo", lambda: "")
    assert hardware.cpu_flags() == frozenset()


def test_int8_row_blocks_are_the_whole_inputs_scores_to_the_bit() -> None:
    """Each block is quantized over the whole input's range, so its scores are those rows of
    one call over every row; blocks are whole groups (a chat's beam)."""
    gen = torch.Generator().manual_seed(5)
    w = torch.randn(3000, 64, generator=gen) * 0.05
    x = torch.randn(23, 64, generator=gen) * 2
    x[17, 3] = 9.0  # the largest value in one block only: the others must still use it
    proj = Projection(w, "int8", start=2)
    whole = proj.scores(x)
    proj.block_rows = 10
    assert proj.blocks(23, 5) == [(0, 23)]  # too few rows to pay (BLOCK_FROM)
    assert proj.blocks(400, 5) == [(lo, min(lo + 10, 400)) for lo in range(0, 400, 10)]
    assert proj.blocks(400, 3)[:2] == [(0, 9), (9, 18)]  # whole chats of 3 rows
    bounds = [(0, 5), (5, 15), (15, 23)]
    got = list(proj.block_scores(x, bounds))
    assert [lo for lo, _ in got] == [0, 5, 15]
    assert torch.equal(torch.cat([s for _, s in got]), whole)
    # without the whole input's range a block would be quantized otherwise
    alone = proj.scores(x[:5])
    assert not torch.equal(alone, whole[:5])
    assert Projection(w, "fused").block_rows == 0  # float products keep one call


FORCED_ISA_CASE = """
import torch, torch.nn.functional as F
from bot.inference.fastgen.projection import Projection
gen = torch.Generator().manual_seed(5)
w = torch.randn(2000, 512, generator=gen).sign() * 0.05  # every weight +-127 in int8
x = torch.rand(8, 512, generator=gen) + 1.0  # every activation in the top half of its range
print((Projection(w, "int8").scores(x) - F.linear(x, w)).abs().max().item())
"""


def test_int8_stays_in_bound_when_fbgemm_is_told_to_use_its_avx2_kernels() -> None:
    """FBGEMM_ENABLE_INSTRUCTIONS=AVX2 on a VNNI CPU (bench.peer --isa avx2 sets it) selects
    kernels that sum pairs of products in 16 bits: full-range activations would saturate
    (measured on an AVX-512-VNNI Xeon: an error of 2.2 on scores up to 6.4 before has_int8_dot
    read the variable, 0.019 after). On a CPU without VNNI both give the 7-bit range."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, hardware.FBGEMM_ISA_ENV: "AVX2", "PYTHONPATH": str(root)}
    done = subprocess.run(
        [sys.executable, "-c", FORCED_ISA_CASE],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert float(done.stdout.split()[-1]) < INT8_LOGPROB_ERROR / 5
