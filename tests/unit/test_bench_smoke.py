"""The benchmarks' shared helpers (the benchmarks themselves run with `make bench`, never here)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench import common


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
