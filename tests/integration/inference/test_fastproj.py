"""The fast search with its faster output projections (bot/inference/fastgen/projection.py)
against ParlAI's, on the tiny real model.

fp32 fused (projection + log-softmax + masking + top-k in vocabulary slices): the same tokens as
ParlAI's `F.linear` + `log_softmax` + `topk`, every case, scores within float rounding. int8
(QUANTIZE=int8, which now covers the projection): replies identical on most chats, and where
they differ, the reply's fp32 sequence score (bench.peer.sequence_scores) at most
INT8_SCORE_GAP (relative) below the fp32 reply's. DTYPE=bf16 likewise (BF16_*), and refused
clearly where the CPU lacks AMX and AVX-512-bf16. Measured on this model: 114 of 128 identical,
gaps up to 7% of the score (every linear layer is int8 there, not only the projection).
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.peer import sequence_scores
from bot.config import ConfigError
from bot.inference import fastgen, hardware
from bot.inference.fastgen import projection
from bot.inference.model import load_shared_agent
from tests.integration.inference.test_fastgen import (
    Case,
    _settings,
    finished_lists,
    random_case,
    run_search,
)

# bf16 against fp32, the same two figures (measured: 130 of 139 identical, gaps up to 1.4%)
BF16_SAME_REPLIES = 0.75
BF16_SCORE_GAP = 0.15

# int8 against fp32: the share of chats with the identical reply, and the largest fp32
# sequence-score gap (length-penalised log-probability) where they differ, relative to the
# fp32 reply's score
INT8_SAME_REPLIES = 0.75
INT8_SCORE_GAP = 0.15


@pytest.fixture(scope="module")
def agent(tiny_model_file: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    return load_shared_agent(_settings(tiny_model_file, tmp_path_factory.mktemp("fastproj")))


@pytest.fixture(scope="module")
def int8_agent(tiny_model_file: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    settings = _settings(tiny_model_file, tmp_path_factory.mktemp("fastproj8"), quantize="int8")
    return load_shared_agent(settings)


@pytest.fixture(scope="module")
def int8_three(tiny_model_file: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """QUANTIZE=int8 with each self-attention's q / k / v as three products (fastgen/qkv.py
    off), as before they were merged."""
    from bot.inference.fastgen import qkv

    settings = _settings(tiny_model_file, tmp_path_factory.mktemp("fastproj8q"), quantize="int8")
    qkv.use(False)
    try:
        return load_shared_agent(settings)
    finally:
        qkv.use(True)


@pytest.fixture
def one_thread() -> Iterator[None]:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def cases(agent: Any, seed: int, per_config: int) -> Iterator[Case]:
    rng = random.Random(seed)
    words = [agent.dict.ind2tok[i] for i in range(4, len(agent.dict))]
    for beam in (1, 5, 10):
        for blocking in (False, True):
            for _ in range(per_config):
                yield random_case(rng, words, beam, blocking)


def test_int8_settings_prepare_the_int8_projection(int8_agent: Any, agent: Any) -> None:
    got = projection.of(int8_agent.model)
    assert got is not None and got.kind == "int8"
    assert projection.of(agent.model) is None  # the default keeps ParlAI's F.linear
    assert projection.of(int8_agent.clone().model) is got  # clones share it


def test_fused_fp32_gives_parlais_tokens(agent: Any, one_thread: None) -> None:
    # small slices: the tiny vocabulary spans several
    projection.prepare(agent.model, "fused", slice_rows=64, fuse=True)
    try:
        chats = 0
        for case in cases(agent, seed=77, per_config=10):
            ref, ref_beams, _ = run_search(agent, case, fast=False)
            got, got_beams, _ = run_search(agent, case)
            assert isinstance(got_beams[0], fastgen.BatchedBeams)
            for r, g in zip(ref, got, strict=True):
                assert g[0].tolist() == r[0].tolist(), case
                assert abs(g[1].item() - r[1].item()) <= 1e-4 * max(1.0, abs(r[1].item()))
            ref_all, got_all = finished_lists(ref_beams), finished_lists(got_beams)
            for r_list, g_list in zip(ref_all, got_all, strict=True):
                assert [t for t, _ in g_list] == [t for t, _ in r_list], case
            chats += len(ref)
        assert chats >= 150
    finally:
        projection.prepare(agent.model, None)


def agreement(agent: Any, other: Any, seed: int) -> tuple[int, int, list[float]]:
    """`other`'s replies against fp32 `agent`'s on random cases: (identical, chats, relative fp32
    sequence-score gaps where they differ; positive: the fp32 reply scores higher)."""
    same = total = 0
    gaps = []
    for case in cases(agent, seed=seed, per_config=6):
        ref, _, batch = run_search(agent, case)
        got, _, _ = run_search(other, case)
        for i, (r, g) in enumerate(zip(ref, got, strict=True)):
            total += 1
            if g[0].tolist() == r[0].tolist():
                same += 1
                continue
            replies = [r[0].tolist()[1:], g[0].tolist()[1:]]  # without the start token
            fp32, int8 = sequence_scores(
                agent.model, batch.text_vec[i : i + 1].repeat(2, 1), replies
            )
            gaps.append((fp32 - int8) / abs(fp32))
    return same, total, gaps


def assert_agrees(agent: Any, other: Any, name: str, *, seed: int, same: float, gap: float) -> None:
    """`other` (the `name` model) against fp32 `agent` on 90 or more chats: at least the
    share `same` of identical replies, and fp32 score gaps of at most `gap`."""
    identical, total, gaps = agreement(agent, other, seed=seed)
    shown = ", ".join(f"{g:+.1%}" for g in sorted(gaps))
    print(f"\n{name} vs fp32: {identical}/{total} identical replies, fp32 score gaps {shown}")
    assert total >= 90
    assert identical / total >= same
    assert max(gaps, default=0.0) <= gap


def test_int8_projection_agrees_with_fp32_within_bounds(
    agent: Any, int8_agent: Any, one_thread: None
) -> None:
    assert_agrees(agent, int8_agent, "int8", seed=5, same=INT8_SAME_REPLIES, gap=INT8_SCORE_GAP)


def test_fused_int8_gives_the_unfused_int8_tokens(int8_agent: Any, one_thread: None) -> None:
    model = int8_agent.model
    unfused = projection.of(model)
    assert unfused is not None and not unfused.fuse  # fusing is measured slower: off
    try:
        for case in cases(int8_agent, seed=31, per_config=4):
            ref, _, _ = run_search(int8_agent, case)
            projection.prepare(model, "int8", slice_rows=64, fuse=True)
            got, _, _ = run_search(int8_agent, case)
            object.__setattr__(model, "_fastgen_projection", unfused)
            assert [g[0].tolist() for g in got] == [r[0].tolist() for r in ref], case
    finally:
        object.__setattr__(model, "_fastgen_projection", unfused)


@pytest.mark.skipif(not hardware.has_bf16(), reason="this CPU has neither AMX nor AVX-512-bf16")
def test_bf16_agrees_with_fp32_within_bounds(
    agent: Any, tiny_model_file: str, tmp_path: Path, one_thread: None
) -> None:
    import torch

    bf16 = load_shared_agent(_settings(tiny_model_file, tmp_path, dtype="bf16"))
    assert next(bf16.model.parameters()).dtype == torch.bfloat16
    assert bf16.clone().model is bf16.model  # one cast copy, shared
    assert_agrees(agent, bf16, "bf16", seed=8, same=BF16_SAME_REPLIES, gap=BF16_SCORE_GAP)


def test_bf16_refused_clearly_without_amx_or_avx512_bf16(
    tiny_model_file: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hardware, "read_cpuinfo", lambda: "flags\t: fpu sse2 avx2 avx512f\n")
    with pytest.raises(ConfigError, match="needs AMX or AVX-512-bf16") as err:
        load_shared_agent(_settings(tiny_model_file, tmp_path, dtype="bf16"))
    assert "Set DTYPE=fp32" in str(err.value)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"dtype": "fp16"}, "DTYPE=fp16 needs a GPU"),
        ({"dtype": "bf16", "quantize": "int8"}, "exclude each other"),
    ],
)
def test_dtype_combinations_refused(
    tiny_model_file: str, tmp_path: Path, kw: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_shared_agent(_settings(tiny_model_file, tmp_path, model_device="cpu", **kw))


def test_only_a_quantized_or_cast_model_takes_the_merged_cross_attention(
    agent: Any, int8_agent: Any, one_thread: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default keeps ParlAI's per-hypothesis products (bit for bit, test_fastgen.py); int8
    runs one product per chat and head (steppers.slot_products), which rounds differently but
    must pick the same replies, scores within float rounding."""
    from bot.inference.fastgen import steppers

    assert steppers.bit_exact(agent.model)
    assert not steppers.bit_exact(int8_agent.model)
    merged = []
    products = steppers.slot_products

    def counted(*args: Any, exact: bool) -> Any:
        merged.append(not exact)
        return products(*args, exact=exact)

    monkeypatch.setattr(steppers, "slot_products", counted)
    got = [run_search(int8_agent, case)[0] for case in cases(int8_agent, seed=41, per_config=4)]
    assert merged and all(merged)
    merged.clear()
    monkeypatch.setattr(steppers, "MERGE_SLOTS", False)
    ref = [run_search(int8_agent, case)[0] for case in cases(int8_agent, seed=41, per_config=4)]
    assert merged and not any(merged)
    same = total = 0
    for ref_preds, got_preds in zip(ref, got, strict=True):
        for r, g in zip(ref_preds, got_preds, strict=True):
            total += 1
            if g[0].tolist() == r[0].tolist():
                same += 1
                assert abs(g[1].item() - r[1].item()) <= 1e-3 * max(1.0, abs(r[1].item()))
    print(f"\nint8, merged against per-slot products: {same}/{total} identical replies")
    assert total >= 60
    assert same / total >= 0.9


def test_the_fused_encoder_attention_is_parlais_within_rounding(
    agent: Any, int8_agent: Any, one_thread: None
) -> None:
    """QUANTIZE=int8 runs the encoder's self-attention through one fused kernel
    (fastgen/encoder.py); the default keeps ParlAI's module. On the same projections and a
    padded batch the two give the same outputs at every real token, within float rounding."""
    import torch
    from parlai.agents.transformer.modules import MultiHeadAttention

    from bot.inference.fastgen.encoder import FusedSelfAttention

    assert all(type(la.attention) is MultiHeadAttention for la in agent.model.encoder.layers)
    assert all(type(la.attention) is FusedSelfAttention for la in int8_agent.model.encoder.layers)
    ours = agent.model.encoder.layers[0].attention  # fp32 projections, ParlAI's module
    fused = FusedSelfAttention(ours)
    generator = torch.Generator().manual_seed(9)
    x = torch.randn(3, 7, ours.dim, generator=generator)
    mask = torch.ones(3, 7, dtype=torch.bool)
    mask[1, 4:] = False
    mask[2, 1:] = False
    with torch.no_grad():
        expected = ours(x, mask=mask)[0]
        got = fused(x, mask=mask)[0]
    assert torch.allclose(got[mask], expected[mask], atol=1e-5)
    with pytest.raises(ValueError, match="self-attention only"):
        fused(x, mask=mask, key=x)
    assert fused.replaced == (ours,)  # what `encoder.restore` puts back
    # ParlAI's module stays out of the state_dict: one key per weight, under ParlAI's names
    prefix = "encoder.layers.0.attention."
    held = {
        k[len(prefix) :].split(".")[0]
        for k in int8_agent.model.state_dict()
        if k.startswith(prefix)
    }
    # (q / k / v are one merged product's Parts there, fastgen/qkv.py: no weights of their own)
    assert held == {"qkv_lin", "out_lin"}


def continuous_replies(agent: Any, case: Any) -> dict[int, list[tuple[list[int], float]]]:
    """The continuous scheduler's search over a test_continuous case, chats joining at their
    arrival step (or earlier, where the batch ran empty: the case then keeps that step, so the
    next run joins them alike): each chat's finished hypotheses."""
    from bot.inference.fastgen import continuous
    from tests.integration.inference.test_fastgen import observe

    batches = [agent.batchify([observe(agent, c.turns)]) for c in case.chats]
    search = continuous.ContinuousSearch(agent)
    got: dict[int, list[tuple[list[int], float]]] = {}
    step = 0
    while len(got) < len(batches):
        for i, chat in enumerate(case.chats):
            if chat.arrival == step or (chat.arrival > step and len(search) == 0):
                chat.arrival = step
                search.join(i, batches[i])
        for done in search.step():
            [got[done.key]] = finished_lists([done.result()])
        step += 1
    return got


@contextlib.contextmanager
def row_blocks(model: Any, block_rows: int) -> Iterator[None]:
    """The int8 projection's row blocks of `block_rows` rows from the first row on (0: off)."""
    proj = projection.of(model)
    assert proj is not None and proj.kind == "int8"
    kept, kept_from = proj.block_rows, projection.BLOCK_FROM
    proj.block_rows, projection.BLOCK_FROM = block_rows, 1
    try:
        yield
    finally:
        proj.block_rows, projection.BLOCK_FROM = kept, kept_from


def test_int8_row_blocks_give_the_whole_batchs_replies(int8_agent: Any, one_thread: None) -> None:
    """The micro-batcher's search: the same finished hypotheses, scores to the bit, with the
    projection's rows taken in blocks of one chat or of several as with all rows at once."""
    model = int8_agent.model
    blocked = 0
    for case in cases(int8_agent, seed=41, per_config=3):
        with row_blocks(model, 0):
            _, ref, _ = run_search(int8_agent, case)
        rows = len(case.texts) * case.gen["beam_size"]
        for size in (1, 12):
            with row_blocks(model, size):
                if len(projection.of(model).blocks(rows, case.gen["beam_size"])) > 1:
                    blocked += 1
                _, got, _ = run_search(int8_agent, case)
            assert finished_lists(got) == finished_lists(ref), (case, size)
    assert blocked >= 12  # many cases really ran in several blocks (17 of 36 here)


def test_int8_row_blocks_give_the_continuous_searchs_replies(
    int8_agent: Any, one_thread: None
) -> None:
    """The continuous scheduler's search likewise, chats joining at random steps."""
    import torch

    from tests.integration.inference.test_continuous import random_case as continuous_case
    from tests.integration.inference.test_fastgen import generation

    rng = random.Random(43)
    words = [int8_agent.dict.ind2tok[i] for i in range(4, len(int8_agent.dict))]
    model = int8_agent.model
    for _ in range(16):
        case = continuous_case(rng, words)
        with generation(int8_agent, **case.gen), torch.no_grad():
            with row_blocks(model, 0):
                ref = continuous_replies(int8_agent, case)
            for size in (1, 12):
                with row_blocks(model, size):
                    assert continuous_replies(int8_agent, case) == ref, (case.gen, size)


def test_int8_merged_qkv_gives_the_three_products_replies_to_the_bit(
    int8_agent: Any, int8_three: Any, one_thread: None
) -> None:
    """Each self-attention's q / k / v as one int8 product (fastgen/qkv.py): our batched search,
    ParlAI's own search (where ours falls back) and the continuous search give the finished
    hypotheses, scores to the bit, of the model with three products."""
    import torch

    from bot.inference.fastgen import qkv
    from tests.integration.inference.test_continuous import random_case as continuous_case
    from tests.integration.inference.test_fastgen import generation

    model, three = int8_agent.model, int8_three.model
    attn = [la.self_attention for la in model.decoder.layers]
    attn += [la.attention for la in model.encoder.layers]
    assert all(isinstance(a.q_lin, qkv.Part) for a in attn)
    assert not any(isinstance(la.self_attention.q_lin, qkv.Part) for la in three.decoder.layers)
    compared = 0
    for case in cases(int8_agent, seed=47, per_config=2):
        for fast in (True, False):
            _, got, _ = run_search(int8_agent, case, fast=fast)
            _, ref, _ = run_search(int8_three, case, fast=fast)
            assert finished_lists(got) == finished_lists(ref), (case, fast)
            compared += 1
    assert compared == 24

    rng = random.Random(53)
    words = [int8_agent.dict.ind2tok[i] for i in range(4, len(int8_agent.dict))]
    for _ in range(8):
        case = continuous_case(rng, words)
        with torch.no_grad():
            with generation(int8_three, **case.gen):
                ref = continuous_replies(int8_three, case)
            with generation(int8_agent, **case.gen):
                assert continuous_replies(int8_agent, case) == ref, case.gen
