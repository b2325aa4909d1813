"""bench.continuous's command line on a GPU: `--device cuda` stops at once without a CUDA
device, and a GPU run's outputs are named apart from a CPU run's. Running the benchmark is
`python -m bench.continuous` (bench/gpu_check.sh on a GPU)."""

from __future__ import annotations

import pytest

from bench import continuous
from tests.unit.bench.test_bench_peer import assert_cuda_refused, without_cuda


@without_cuda
def test_device_cuda_without_a_gpu_stops_at_once_and_says_why(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert_cuda_refused(continuous, "main_async", capsys, monkeypatch)


def test_the_windows_gpu_check_shortens(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []

    async def main_async(args: object) -> None:
        seen.append(args)

    monkeypatch.setattr(continuous, "main_async", main_async)
    assert continuous.main(["--quick"]) == 0
    assert continuous.main(["--quick", "--seconds", "4", "--warm-up", "2"]) == 0
    assert continuous.main(["--minutes", "0.5"]) == 0
    quick, short, minutes = seen
    assert (quick.seconds, quick.warm_up, quick.device) == (20.0, 20.0, "cpu")
    assert (short.seconds, short.warm_up) == (4.0, 2.0)
    assert minutes.seconds == 30.0


def test_a_cuda_run_is_named_apart_from_a_cpu_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert continuous.output_name("continuous", "cpu") == "continuous"
    assert continuous.output_name("continuous", "cuda") == "continuous-cuda"
    continuous.emit({"first_draft_p50_ms": 12.5}, "cuda")
    continuous.emit({"first_draft_p50_ms": 12.5}, "cpu")
    assert capsys.readouterr().out.splitlines() == [
        "RESULT cuda_first_draft_p50_ms=12.5",
        "RESULT first_draft_p50_ms=12.5",
    ]
