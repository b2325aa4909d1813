"""The benchmarks' shared helpers (the benchmarks themselves run with `make bench`, never here)."""

from __future__ import annotations

import json
import math
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


def test_rss_grows_when_memory_is_held() -> None:
    common.settle()
    before = common.rss_bytes()
    block = bytearray(64 * 2**20)
    block[::4096] = b"x" * len(block[::4096])  # touch every page so it is resident
    assert common.rss_bytes() - before > 32 * 2**20
    del block
