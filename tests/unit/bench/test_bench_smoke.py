"""The benchmarks' shared helpers (the benchmarks themselves run with `make bench`; only
bench.variants' `--quick` smoke run is here, marked slow)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench import common, e2e, quality, variants


def test_percentile_is_nearest_rank() -> None:
    values = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert common.percentile(values, 50) == 3.0
    assert common.percentile(values, 95) == 5.0
    assert common.percentile(values, 1) == 1.0
    assert math.isnan(common.percentile([], 50))


def test_table_aligns_columns_and_formats_numbers() -> None:
    text = common.table("T", ["name", "value"], [("a", 1234.5), ("long name", 0.01234), ("c", 7)])
    lines = text.splitlines()
    assert lines[0] == "T"
    assert len({len(line) for line in lines[1:]}) == 1  # every row as wide as the header
    assert lines[3].endswith("1,234") and lines[4].endswith("0.0123") and lines[5].endswith("7")


def test_result_lines_are_machine_readable(capsys: pytest.CaptureFixture[str]) -> None:
    common.emit_results({"kb_per_session": 4.5032, "lost": 0.0})
    out = capsys.readouterr().out.splitlines()
    assert out == ["RESULT kb_per_session=4.5032", "RESULT lost=0"]
    name, value = out[0].removeprefix("RESULT ").split("=")
    assert name == "kb_per_session" and float(value) == pytest.approx(4.5032)


def test_json_and_png_land_in_the_results_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(common, "RESULTS_DIR", tmp_path)
    monkeypatch.setattr(common, "ROOT", tmp_path)
    path = common.write_json("demo", {"x": 1})
    body = json.loads(path.read_text())
    assert body["benchmark"] == "demo" and body["x"] == 1
    assert body["machine"]["cpus"] >= 1
    fig, axes = common.new_figure()
    axes[0][0].plot([1, 2], [3, 4])
    png = common.save_figure("demo", fig)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_conversations_are_deterministic_and_differ_per_user() -> None:
    a = common.conversation(1, 10)
    assert a == common.conversation(1, 10)
    assert a != common.conversation(2, 10)
    assert [role for role, _ in a] == ["user", "bot"] * 5
    assert common.persona(1) != common.persona(2)
    assert common.persona(1).startswith("My name is ")


MB = 2**20


def test_a_worker_process_measures_the_memory_it_holds() -> None:
    # The way bench/memory.py measures: a fresh process (run_worker), settle(), RSS in bytes.
    data = common.run_worker("tests.support.memory_worker", ["--mb", "64"], timeout=120)
    assert 60 * MB <= data["held"] - data["before"] <= 72 * MB
    assert 60 * MB <= data["uss_held"] <= data["held"]  # the block is this process's own
    assert data["after"] - data["before"] < 8 * MB  # given back: readings do not drift


def test_a_failing_worker_is_an_error_that_shows_its_output() -> None:
    with pytest.raises(RuntimeError, match=r"failed \(exit 3\)[\s\S]*failing on purpose"):
        common.run_worker("tests.support.memory_worker", ["--fail"], timeout=120)


def test_rss_and_uss_read_another_process() -> None:
    holder = "b = bytearray(96 * 2**20); b[::4096] = b'x' * len(b[::4096]); input()"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        for code in ("input()", holder)
    ]
    try:
        idle, holding = procs
        deadline = time.monotonic() + 60
        while common.rss_bytes(holding.pid) - common.rss_bytes(idle.pid) < 90 * MB:
            assert time.monotonic() < deadline, "the holder's RSS never grew"
            time.sleep(0.05)
        assert common.uss_bytes(holding.pid) - common.uss_bytes(idle.pid) >= 90 * MB
    finally:
        for proc in procs:
            proc.communicate(b"\n", timeout=30)


def test_markdown_table_right_aligns_number_columns() -> None:
    text = common.markdown_table(["mode", "p50"], [("inline", 61.52), ("process", float("nan"))])
    assert text.splitlines() == [
        "| mode | p50 |",
        "|---|---:|",
        "| inline | 61.5 |",
        "| process | - |",
    ]


def test_summary_splits_the_overhead_at_the_engine() -> None:
    turns = [
        e2e.Turn(1, 0, 0.0, latency_ms=100.0, respond_ms=70.0, model_ms=40.0),
        e2e.Turn(1, 1, 0.0, latency_ms=50.0, respond_ms=30.0, model_ms=None),  # no batch time
        e2e.Turn(2, 0, 0.0),  # never answered
    ]
    summary = e2e.summarize(turns)
    assert summary.latency == [100.0, 50.0]
    assert summary.model == [40.0] and summary.overhead == [60.0]
    assert summary.engine_wait == [30.0] and summary.outside == [30.0, 20.0]
    assert summary.percentiles()["overhead_ms"] == {"p50": 60.0, "p95": 60.0}


def test_variant_chats_are_the_ones_the_router_assigns() -> None:
    from bot.engine.assign import choose

    weights = {variants.A: 1.0, variants.B: 3.0}
    a = variants.take(variants.chats_for(variants.A, weights, 100), 5)
    b = variants.take(variants.chats_for(variants.B, weights, 100), 5)
    assert not set(a) & set(b) and a == sorted(a)
    assert all(choose(variants.EXPERIMENT, c, weights) == variants.A for c in a)
    assert all(choose(variants.EXPERIMENT, c, weights) == variants.B for c in b)


def test_a_busy_is_the_share_of_the_window_inside_batches() -> None:
    part = variants.Interference("process", window=(10.0, 20.0))
    # two batches (their replies share model_ms): 9-12 s (2 replies) and 15-17 s (1 reply);
    # 2 s of each inside the window, so 2/3 of the first batch's replies count
    for model_ms, replied_at in ((3000.0, 12.0), (3000.0, 12.1), (2000.0, 17.0)):
        turn = e2e.Turn(1, 0, 0.0, latency_ms=1.0, replied_at=replied_at, model_ms=model_ms)
        part.a.turns.append(turn)
    assert part.a_busy() == pytest.approx(0.4)
    assert part.a_replies_per_s() == pytest.approx((2 * 2 / 3 + 1) / 10)
    assert sorted(size for _, _, size in part.a_batches()) == [1, 2]


@pytest.mark.slow
def test_variants_benchmark_quick_run() -> None:
    # The whole benchmark in miniature: three `python -m bot run` processes, the tiny model.
    proc = subprocess.run(
        [sys.executable, "-m", "bench.variants", "--quick"],
        cwd=common.ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = dict(
        line.removeprefix("RESULT ").split("=", 1)
        for line in proc.stdout.splitlines()
        if line.startswith("RESULT ")
    )
    for name in (
        "variants_b_alone_p50_ms",
        "variants_b_with_a_saturated_p95_ms",
        "variants_a_saturated_replies_per_s",
        "variants_e2e_inline_overhead_p50_ms",
        "variants_e2e_process_overhead_p50_ms",
    ):
        assert float(results[name]) > 0, name
    assert float(results["variants_lost"]) == 0
    assert float(results["variants_misrouted"]) == 0
    assert "| MODEL_WORKERS |" in proc.stdout
    body = json.loads((common.RESULTS_DIR / "variants-quick.json").read_text())
    assert body["setup"]["quick"] is True and body["lost"] == 0


def test_the_quality_guard_counts_identical_replies_and_the_score_gap_of_the_others() -> None:
    ref = [{"text": t, "model_input": [i]} for i, t in enumerate(["a", "b", "c", "d"])]
    other = [{**r, "text": t} for r, t in zip(ref, ["a", "x", "c", "y"], strict=True)]
    cmp = quality.compare(ref, other, [-1.0, -2.0, -3.0, -4.0], [-1.0, -2.5, -3.0, -3.0])
    assert cmp["identical_pct"] == 50.0 and cmp["differ"] == [1, 3]
    assert cmp["gap_max"] == pytest.approx(0.5)  # the default's reply scored 0.5 better
    assert cmp["gap_p50"] == pytest.approx(-0.25)  # median of +0.5 and -1.0
    with pytest.raises(ValueError, match="different model inputs"):  # equal work is checked
        quality.compare(ref, [{**other[0], "model_input": [9]}, *other[1:]], [0] * 4, [0] * 4)


def test_e2e_takes_a_setting_for_the_bot_and_refuses_the_benchmarks_own() -> None:
    import argparse

    assert e2e.parse_setting("STREAM_REPLIES=off") == ("STREAM_REPLIES", "off")
    assert e2e.parse_setting("SAFETY_THRESHOLD=0.5=x") == ("SAFETY_THRESHOLD", "0.5=x")
    for bad in ("STREAM_REPLIES", "stream_replies=off", "=off", "A B=1"):
        with pytest.raises(argparse.ArgumentTypeError, match="NAME=VALUE"):
            e2e.parse_setting(bad)
    with pytest.raises(argparse.ArgumentTypeError, match="benchmark's own"):
        e2e.parse_setting("DATABASE_URL=sqlite://")


def test_e2e_busy_share_is_the_covered_part_of_the_windows_union() -> None:
    # Windows 0-10, 5-15 and 20-30: a union of 25 s. Busy 1-3 (2 s inside), 14-21 (1 s in
    # each window), 40-41 (outside): 4 s of 25.
    windows = [(0.0, 10.0), (5.0, 15.0), (20.0, 30.0)]
    busy = [(14.0, 7.0), (1.0, 2.0), (40.0, 1.0)]
    assert e2e.busy_share(busy, windows) == pytest.approx(4 / 25)
    assert e2e.busy_share([(0.0, 100.0)], windows) == pytest.approx(1.0)
    assert math.isnan(e2e.busy_share(busy, []))


_LOOP_PROGRAM = """
import asyncio, multiprocessing, time

def spin(seconds):
    # CPU seconds, not wall ones: with the other test worker on the same cores a wall-clock
    # spin can get less CPU than it lasts
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass

async def busy_child():
    spin(0.01)

def child():
    asyncio.run(busy_child())  # a worker process's loop: timed, but it writes nothing

async def sleeper():
    time.sleep(0.03)  # 30 ms off the CPU in one callback

async def main():
    for _ in range(3):
        spin(0.01)  # 10 ms of CPU in one callback
        await asyncio.sleep(0)
    await asyncio.create_task(sleeper(), name="sleeper:1")

if __name__ == "__main__":
    process = multiprocessing.get_context("spawn").Process(target=child)
    process.start()
    process.join()
    asyncio.run(main())
"""


def test_the_loop_trace_times_the_bots_callbacks_and_only_the_main_process_writes(
    tmp_path: Path,
) -> None:
    script = tmp_path / "program.py"
    script.write_text(_LOOP_PROGRAM, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(e2e.LOOP_TRACE), "BENCH_LOOPTRACE_DIR": str(tmp_path)}
    subprocess.run([sys.executable, str(script)], env=env, check=True, timeout=60)
    busy, cpu, by = e2e._read_loop_trace(tmp_path)  # exactly one file: the main process's
    assert sum(length for _, length in busy) >= 0.06
    assert max(length for _, length in busy) >= 0.03
    assert len(cpu) == len(busy) and 0.025 <= sum(cpu) < 0.05  # the sleep is not CPU time
    calls, seconds, cpu_s, longest = by["sleeper"]  # a task's name up to ":"
    assert calls == 1 and seconds >= 0.03 and cpu_s < 0.01 and longest == seconds
    assert by["task main"][2] >= 0.025  # an unnamed task: its coroutine (asyncio.run's)
