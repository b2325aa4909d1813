"""bench.sqlite_driver times the same transactions through each way of calling SQLite."""

from __future__ import annotations

import pytest

from bench import sqlite_driver


def test_every_way_is_timed_on_a_transaction_and_a_read() -> None:
    results = sqlite_driver.measure(3)
    assert set(results) == {"thread", "inline", "sync"}
    for turn_ms, read_ms in results.values():
        assert turn_ms > 0 and read_ms > 0


def test_rounds_must_be_positive() -> None:
    with pytest.raises(SystemExit) as stop:
        sqlite_driver.main(["--rounds", "0"])
    assert stop.value.code == 2
