"""bot_model_process_*{variant}: a real child process measured by pid, against /proc; a pid
that is gone by the scrape leaves no series and no error; two services in one process each
have their own process collector."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from bot.service.metrics import Metrics


def samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(metrics.registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_a_child_is_measured_and_a_vanished_pid_leaves_no_series() -> None:
    # A child that holds 40 MB resident and 3 extra descriptors, then waits.
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, sys; b = bytearray(40 << 20); fds = [os.open('/dev/null', 0) for _ in"
            " range(3)]; print('ready', flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    gone = subprocess.Popen(["true"])
    gone.wait()
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        metrics = Metrics()
        metrics.watch_model_processes(lambda: {"a": child.pid, "b": gone.pid})
        got = samples(metrics)
        rss = got[("bot_model_process_resident_memory_bytes", (("variant", "a"),))]
        statm = Path(f"/proc/{child.pid}/statm").read_text().split()
        assert abs(rss - int(statm[1]) * os.sysconf("SC_PAGE_SIZE")) < 1 << 20
        assert rss > 40 << 20
        fds = got[("bot_model_process_open_fds", (("variant", "a"),))]
        assert fds == len(os.listdir(f"/proc/{child.pid}/fd"))
        assert got[("bot_model_process_cpu_seconds_total", (("variant", "a"),))] > 0
        assert not [key for key in got if ("variant", "b") in key[1]]
    finally:
        child.kill()
        child.wait()


def test_each_service_has_its_own_process_and_build_series() -> None:
    one, two = Metrics(), Metrics()
    one.set_build_info(version="1.0", model="m")
    for metrics in (one, two):
        assert samples(metrics)[("process_open_fds", ())] > 0
    build = [(k, v) for k, v in samples(one).items() if k[0] == "bot_build_info"]
    assert build == [
        (
            (
                "bot_build_info",
                (
                    ("model", "m"),
                    ("model_backend", "unknown"),
                    ("parlai", "unknown"),
                    ("python", "unknown"),
                    ("torch", "unknown"),
                    ("version", "1.0"),
                ),
            ),
            1.0,
        )
    ]
    assert not [k for k in samples(two) if k[0] == "bot_build_info"]
