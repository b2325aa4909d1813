"""bench.modelserver's pieces without the bench (it runs with `make bench-modelserver`): its
arguments, the latency window, the process-tree RSS, the books' lost and duplicated counts, and
the RESULT lines."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter

import pytest

from bench import modelserver
from bench.scaleout import Books


def test_quick_is_a_smoke_run_and_one_ray_replica_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    full, quick = modelserver.parse_args([]), modelserver.parse_args(["--quick"])
    assert quick.phase < full.phase and quick.chats < full.chats
    assert full.mode == "polling" and full.ray_replicas == 2
    with pytest.raises(SystemExit):
        modelserver.parse_args(["--ray-replicas", "1"])
    assert "at least 2" in capsys.readouterr().err


def test_latency_counts_the_messages_sent_in_the_window_that_were_answered() -> None:
    books = Books()
    books.sent[1] = [("a", 10.0), ("b", 12.0), ("c", 14.0)]
    books.answered_at.update({(1, 1): 10.5, (1, 2): 12.25})  # c: not answered
    assert modelserver.latencies_ms(books, 11.0, 20.0) == [250.0]
    assert sorted(modelserver.latencies_ms(books, 0.0, 20.0)) == [250.0, 500.0]


def test_lost_and_duplicated_come_from_the_books() -> None:
    books = Books()
    books.sent[1] = [("a", 0.0), ("b", 1.0)]
    books.sent[2] = [("a", 0.0)]
    assert modelserver.counted(books, Counter({1: 2, 2: 1})) == (3, 0, 0)
    assert modelserver.counted(books, Counter({1: 1, 2: 2})) == (3, 1, 1)


def test_tree_rss_sums_a_process_and_its_children_once() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=-1)
    try:
        own = modelserver.tree_rss_mb([child.pid])
        both = modelserver.tree_rss_mb([os.getpid()])
        assert 0 < own < both  # the child is in this process's tree
        assert modelserver.tree_rss_mb([os.getpid(), child.pid]) == pytest.approx(both, rel=0.05)
        alone = modelserver.own_rss_mb([os.getpid()])
        assert 0 < alone < both
    finally:
        child.kill()
        child.wait()


def test_result_lines_name_shared_then_local() -> None:
    local = modelserver.Figures("local", 3.0, 800.0, 1500.0, 1200.0, 380.0)
    shared = modelserver.Figures("shared", 4.5, 500.0, 900.5, 900.0, 250.0, lost_turns_retried=2)
    assert modelserver.result_lines(local, shared) == [
        "RESULT lost=0 duplicated=0",
        "RESULT rss_mb_shared=900.0 rss_mb_local=1200.0",
        "RESULT front_end_mb_shared=250.0 front_end_mb_local=380.0",
        "RESULT replies_per_s_shared=4.5 replies_per_s_local=3.0",
        "RESULT p50_ms_shared=500.0 p50_ms_local=800.0",
        "RESULT p95_ms_shared=900.5 p95_ms_local=1500.0",
        "RESULT ray_turns_retried=2",
    ]
