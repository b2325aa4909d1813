"""bench.peer's pure parts: the weight-name mapping, the turn order, the equal-work and
agreement checks, the RESULT names. Neither transformers nor CTranslate2 is needed (nor
imported): running the benchmark is `make bench-peer`."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from bench import common, peer
from bench.common import ROOT


def test_importing_it_loads_no_peer_and_no_torch() -> None:
    code = (
        "import sys, bench.peer; "
        "print(sorted(m for m in ('torch', 'transformers', 'ctranslate2') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


def parlai_names(layers: int) -> list[str]:
    """Every parameter name of ParlAI's xlm transformer/generator with `layers` layers."""
    linear = ("weight", "bias")
    names = ["START", "embeddings.weight"]
    for side in ("encoder", "decoder"):
        names += [f"{side}.embeddings.weight", f"{side}.position_embeddings.weight"]
        names += [f"{side}.norm_embeddings.{p}" for p in linear]
        encoder = ["attention", "norm1", "ffn.lin1", "ffn.lin2", "norm2"]
        decoder = ["self_attention", "norm1", "encoder_attention", "norm2", "ffn.lin1", "ffn.lin2"]
        subs = encoder if side == "encoder" else [*decoder, "norm3"]
        for i in range(layers):
            for sub in subs:
                if sub.endswith("attention"):
                    for lin in ("q_lin", "k_lin", "v_lin", "out_lin"):
                        names += [f"{side}.layers.{i}.{sub}.{lin}.{p}" for p in linear]
                else:
                    names += [f"{side}.layers.{i}.{sub}.{p}" for p in linear]
    return names


def test_parlai_names_become_blenderbot_small_names() -> None:
    key = peer.parlai_to_hf_key
    assert key("START") is None
    assert key("embeddings.weight") == "model.shared.weight"
    assert key("decoder.position_embeddings.weight") == "model.decoder.embed_positions.weight"
    assert key("encoder.norm_embeddings.bias") == "model.encoder.layernorm_embedding.bias"
    assert key("encoder.layers.3.attention.q_lin.weight") == (
        "model.encoder.layers.3.self_attn.q_proj.weight"
    )
    assert key("encoder.layers.0.norm2.weight") == "model.encoder.layers.0.final_layer_norm.weight"
    assert key("decoder.layers.7.encoder_attention.out_lin.bias") == (
        "model.decoder.layers.7.encoder_attn.out_proj.bias"
    )
    assert key("decoder.layers.1.norm2.weight") == (
        "model.decoder.layers.1.encoder_attn_layer_norm.weight"
    )
    assert key("decoder.layers.1.norm3.bias") == "model.decoder.layers.1.final_layer_norm.bias"
    assert key("decoder.layers.1.ffn.lin2.weight") == "model.decoder.layers.1.fc2.weight"
    with pytest.raises(KeyError):
        key("decoder.layers.0.something.weight")
    with pytest.raises(KeyError):
        key("classifier.weight")


def test_the_mapping_is_one_to_one_over_a_whole_model() -> None:
    names = parlai_names(layers=2)
    mapped = [peer.parlai_to_hf_key(n) for n in names]
    real = [m for m in mapped if m is not None]
    assert len(real) == len(names) - 1  # START is a buffer, not a weight
    assert len(set(real)) == len(real)
    assert all(m.startswith("model.") for m in real)
    # 2 layers: encoder 8 attention + 8 other tensors each, decoder 16 + 10 each
    assert sum(".layers." in m for m in real) == 2 * (16 + 26)


def test_turns_rotate_so_every_system_goes_first_once() -> None:
    systems = ["a", "b", "c"]
    orders = [peer.rotated(systems, k) for k in range(3)]
    assert orders == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]
    assert peer.rotated(systems, 4) == ["b", "c", "a"]
    assert peer.rotated([], 2) == []


def test_contexts_are_reproducible_ordinary_tokens() -> None:
    first = peer.make_contexts(5, 10, 20, vocab=100, seed=3)
    assert first == peer.make_contexts(5, 10, 20, vocab=100, seed=3)
    assert first != peer.make_contexts(5, 10, 20, vocab=100, seed=4)
    assert all(10 <= len(c) <= 20 for c in first)
    assert all(4 <= t < 100 for c in first for t in c)


def test_the_synthetic_vocabulary_keeps_parlais_special_ids() -> None:
    vocab = peer.synthetic_vocabulary(10)
    assert vocab[:4] == ["__null__", "__start__", "__end__", "__unk__"]
    assert vocab[peer.START] == "__start__" and vocab[peer.END] == "__end__"
    assert vocab[4:] == [f"w{i}" for i in range(4, 10)]


def test_agreement_counts_whole_replies_and_common_prefixes() -> None:
    ours = [[5, 6, 7, 2], [5, 6, 7, 2], [9, 9, 9, 2]]
    theirs = [[5, 6, 7, 8], [5, 1, 7, 8], [1, 9, 9, 9]]
    # the last token is ours' forced end: compared over the first 3
    got = peer.agreement(ours, theirs, upto=3)
    assert got["replies"] == pytest.approx(1 / 3)
    assert got["prefix"] == pytest.approx((3 + 1 + 0) / 9)
    assert peer.agreement(ours, ours, upto=4) == {"replies": 1.0, "prefix": 1.0}
    with pytest.raises(ValueError):
        peer.agreement(ours, theirs[:2], upto=3)


def test_equal_work_means_every_reply_is_exactly_the_length() -> None:
    assert peer.work_check([[1] * 5, [2] * 5], 5) == {"min": 5, "max": 5, "equal": True}
    assert peer.work_check([[1] * 5, [2] * 4], 5)["equal"] is False
    assert peer.work_check([], 5)["equal"] is False


def cell(decoding: str, batch: int, rps: dict[str, float]) -> dict[str, object]:
    return {"decoding": decoding, "batch": batch, "threads": 1, "rps": rps}


def test_result_names_and_the_ratio_of_our_best_to_ct2_int8() -> None:
    cells = [
        cell("greedy", 8, {"ours_batch_fp32": 4.0, "ours_cont_int8": 6.0, "ct2_int8": 12.0}),
        cell("beam10", 1, {"ours_batch_fp32": 1.0, "hf_fp32": 0.5}),
    ]
    out = peer.results(cells)
    assert out["peer_ours_cont_int8_greedy_b8_t1_rps"] == 6.0
    assert out["peer_ct2_int8_greedy_b8_t1_rps"] == 12.0
    assert out["peer_hf_fp32_beam10_b1_t1_rps"] == 0.5
    assert out["peer_ratio_greedy_b8_t1"] == pytest.approx(0.5)
    assert "peer_ratio_beam10_b1_t1" not in out  # no CTranslate2 int8 there


def test_a_before_the_change_system_is_never_our_best() -> None:
    rps = {"ours_batch_int8": 6.0, "ours_batch_int8slots": 9.0, "ct2_int8": 12.0}
    assert peer.best_ratio(rps) == pytest.approx(0.5)
    assert set(peer.BEFORE) <= set(peer.OURS)


def test_table_rows_leave_unmeasured_systems_empty() -> None:
    systems = ["ours_batch_fp32", "ct2_int8"]
    rows = peer.table_rows([cell("greedy", 1, {"ours_batch_fp32": 3.0, "ct2_int8": 2.0})], systems)
    assert rows[0][:5] == ["greedy", 1, 1, 3.0, 2.0]
    assert rows[0][5] == "x1.50"
    rows = peer.table_rows([cell("greedy", 1, {"ours_batch_fp32": 3.0})], systems)
    assert math.isnan(rows[0][4]) and rows[0][5] == "-"  # type: ignore[arg-type]
    assert len(peer.table_headers(systems)) == len(rows[0])


def test_the_command_line() -> None:
    quick = peer.plan_from_args(["--quick"])
    assert quick.quick and quick.batches == (1, 8) and quick.threads == (1,)
    assert quick.decodings == (("greedy", 1), ("beam4", 4))
    full = peer.plan_from_args(["--batches", "1,32", "--systems", "ours_cont_fp32,ct2_int8"])
    assert full.batches == (1, 32) and full.beam == 10 and full.threads == (1, 2)
    assert full.systems == ("ours_cont_fp32", "ct2_int8")
    assert len(full.cells()) == 2 * 2 * 2  # threads x decodings x batches
    with pytest.raises(SystemExit):
        peer.plan_from_args(["--systems", "onnx"])


@pytest.mark.parametrize("has_bf16", [False, True])
def test_bf16_systems_are_skipped_on_a_cpu_without_avx512_bf16_or_amx(
    monkeypatch: pytest.MonkeyPatch, has_bf16: bool
) -> None:
    """Regression (issue 32.10): the default systems include bf16, which the service refuses
    on such a CPU (an AMD AVX2-only machine), so `make bench-peer` died with a ConfigError."""
    monkeypatch.setattr(peer, "cpu_has_bf16", lambda: has_bf16)
    plan = peer.fit_to_cpu(peer.plan_from_args([]))
    bf16 = {"ours_batch_bf16", "ours_cont_bf16"}
    if has_bf16:
        assert plan.systems == peer.SYSTEMS and plan.skipped == {}
    else:
        assert plan.systems == tuple(s for s in peer.SYSTEMS if s not in bf16)
        assert plan.skipped == dict.fromkeys(sorted(bf16), "skipped: CPU lacks avx512_bf16/amx")
        assert peer.skip_notes(plan.skipped) == [
            "ours_batch_bf16, ours_cont_bf16: skipped: CPU lacks avx512_bf16/amx"
        ]


def test_bench_peer_on_a_cpu_without_bf16_measures_the_rest_and_says_so(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The run itself (measuring replaced), on a CPU whose flags lack avx512_bf16 and amx_bf16:
    the bf16 systems never reach a worker, and the table's output and markdown say why they
    are missing."""
    measured: list[tuple[str, ...]] = []

    def measure(plan: peer.Plan) -> dict[str, object]:
        measured.append(plan.systems)
        rps = dict.fromkeys(plan.systems, 1.0)
        cells = [
            {"decoding": d, "beam": b, "batch": n, "threads": t, "rps": rps}
            for d, b, n, t in plan.cells()
        ]
        return {"prepare": {}, "cells": cells, "work_equal": True, "agreement": {}}

    from bot.inference import hardware

    # An AMD AVX2-only machine's /proc/cpuinfo, as far as the flags go.
    monkeypatch.setattr(hardware, "read_cpuinfo", lambda: "flags\t\t: fpu sse4_2 avx avx2 fma\n")
    monkeypatch.setattr(peer, "measure", measure)
    monkeypatch.setattr(peer, "plot", lambda *args: None)
    monkeypatch.setattr(common, "RESULTS_DIR", tmp_path)
    monkeypatch.setattr(common, "ROOT", tmp_path)
    assert peer.main(["--quick"]) == 0
    [systems] = measured
    assert "ours_batch_fp32" in systems and not {"ours_batch_bf16", "ours_cont_bf16"} & set(systems)
    note = "ours_batch_bf16, ours_cont_bf16: skipped: CPU lacks avx512_bf16/amx"
    out = capsys.readouterr().out
    assert out.index("Replies/s") < out.rindex(note)  # under the table
    saved = json.loads((tmp_path / "peer-quick.json").read_text())
    assert saved["markdown"].endswith("\n\n" + note)
    assert saved["plan"]["skipped"]["ours_cont_bf16"] == "skipped: CPU lacks avx512_bf16/amx"


def _has_cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


without_cuda = pytest.mark.skipif(_has_cuda(), reason="this machine has a CUDA device")


def assert_cuda_refused(
    bench: ModuleType,
    work: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`bench.main --quick --device cuda` on a machine without CUDA: status 2, a line that says
    why and what to use instead, and `bench.<work>` (what would run or measure) never called."""
    monkeypatch.setattr(bench, work, lambda *args: pytest.fail(f"{work} was called"))
    assert bench.main(["--quick", "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert "no CUDA device" in err and "--device cpu" in err


def test_the_device_option() -> None:
    assert peer.plan_from_args([]).device == "cpu"
    assert peer.plan_from_args(["--quick", "--device", "cuda"]).device == "cuda"
    with pytest.raises(SystemExit):
        peer.plan_from_args(["--device", "gpu"])


@pytest.mark.parametrize(("bf16", "ct2"), [(True, True), (False, False)])
def test_on_cuda_what_cannot_run_there_is_skipped_with_why(
    monkeypatch: pytest.MonkeyPatch, bf16: bool, ct2: bool
) -> None:
    """QUANTIZE=int8 is CPU-only (the service refuses it with MODEL_DEVICE=cuda): our int8
    systems never reach a GPU worker; bf16 and CTranslate2 only where the GPU and the build
    have them."""
    monkeypatch.setattr(peer, "cuda_has_bf16", lambda: bf16)
    monkeypatch.setattr(peer, "ct2_has_cuda", lambda: ct2)
    plan = peer.fit_to_device(peer.plan_from_args(["--device", "cuda"]))
    int8 = {s for s in peer.OURS if "_int8" in s}
    assert int8 and all(plan.skipped[s] == peer.LACKS_CUDA_INT8 for s in int8)
    expected = {s for s in peer.SYSTEMS if s not in int8}
    if not bf16:
        expected -= set(peer.BF16)
        assert plan.skipped["ours_cont_bf16"] == peer.LACKS_CUDA_BF16
    if not ct2:
        expected -= {"ct2_fp32", "ct2_int8"}
        assert plan.skipped["ct2_int8"] == peer.LACKS_CT2_CUDA
    assert set(plan.systems) == expected
    assert "ours_batch_fp32" in plan.systems and "hf_fp32" in plan.systems


@without_cuda
def test_device_cuda_without_a_gpu_stops_at_once_and_says_why(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert_cuda_refused(peer, "measure", capsys, monkeypatch)


def test_a_cuda_run_is_named_apart_from_a_cpu_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The run itself (measuring replaced, the GPU taken as present): its JSON is
    peer-quick-cuda.json and its RESULT lines peer_cuda_..., so it never overwrites nor
    reads as a CPU run."""
    measured: list[peer.Plan] = []

    def measure(plan: peer.Plan) -> dict[str, object]:
        measured.append(plan)
        rps = dict.fromkeys(plan.systems, 2.0)
        cells = [
            {"decoding": d, "beam": b, "batch": n, "threads": t, "rps": rps}
            for d, b, n, t in plan.cells()
        ]
        return {"prepare": {}, "cells": cells, "work_equal": True, "agreement": {}}

    monkeypatch.setattr(common, "cuda_refusal", lambda command: None)
    monkeypatch.setattr(peer, "cuda_has_bf16", lambda: True)
    monkeypatch.setattr(peer, "ct2_has_cuda", lambda: True)
    monkeypatch.setattr(peer, "measure", measure)
    monkeypatch.setattr(peer, "plot", lambda *args: None)
    monkeypatch.setattr(common, "RESULTS_DIR", tmp_path)
    monkeypatch.setattr(common, "ROOT", tmp_path)
    assert peer.main(["--quick", "--device", "cuda", "--systems", "ours_cont_fp32,ct2_int8"]) == 0
    [plan] = measured
    assert plan.device == "cuda" and plan.systems == ("ours_cont_fp32", "ct2_int8")
    out = capsys.readouterr().out
    results = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert results and all(line.startswith("RESULT peer_cuda_") for line in results)
    assert "RESULT peer_cuda_ours_cont_fp32_greedy_b1_t1_rps=2" in results
    saved = json.loads((tmp_path / "peer-quick-cuda.json").read_text())
    assert saved["plan"]["device"] == "cuda"
    assert not (tmp_path / "peer-quick.json").exists()


def test_isa_avx2_skips_bf16_names_its_results_and_refuses_a_gpu(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(peer, "cpu_has_bf16", lambda: True)
    plan = peer.fit_to_cpu(peer.plan_from_args(["--isa", "avx2"]))
    assert plan.isa == "avx2"
    assert set(plan.skipped) == {"ours_batch_bf16", "ours_cont_bf16"}
    assert set(plan.skipped.values()) == {peer.FORCED_AVX2_BF16}
    cell = {"decoding": "greedy", "batch": 1, "threads": 1, "rps": {"ct2_int8": 2.0}}
    assert peer.results([cell], "cpu", "avx2") == {"peer_avx2_ct2_int8_greedy_b1_t1_rps": 2.0}
    assert peer.ISA_ENV["avx2"]["FBGEMM_ENABLE_INSTRUCTIONS"] == "AVX2"
    with pytest.raises(SystemExit) as exit_:
        peer.plan_from_args(["--isa", "avx2", "--device", "cuda"])
    assert exit_.value.code == 2
    assert "--isa is for --device cpu" in capsys.readouterr().err
