"""The real `python -m bot run` with two variants in model worker processes, scraped on
METRICS_PORT: the service's process_* figures and each worker's bot_model_process_*{variant}
against what /proc says of the same processes, bot_build_info, and every metric name the
alert rules (deploy/prometheus/alerts.yml and its promtool tests) and the Grafana dashboard
(deploy/grafana/) use, with the labels the rule tests give it."""

from __future__ import annotations

import asyncio
import os
import re
import signal
from importlib import metadata
from pathlib import Path

from tests.support.botprocess import TOKEN, bot_process, free_port
from tests.support.deployfiles import (
    SCRAPE_SERIES,
    alert_exprs,
    alert_test_series,
    dashboard_exprs,
    metric_names,
)
from tests.support.fakebotapi import FakeBotAPI
from tests.support.ops import Samples, scrape, value, wait_scraped
from tests.support.workers import chats_of, two_variant_env, worker_pid

TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
# Labels Prometheus adds to every scraped series.
TARGET_LABELS = {"instance", "job"}


def proc_rss(pid: int) -> int:
    """Resident bytes, from /proc/PID/statm (pages), as the kernel counts them."""
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE


def proc_cpu_s(pid: int) -> float:
    """utime + stime of /proc/PID/stat, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def proc_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def assert_figures_of(
    samples: Samples, pid: int, prefix: str, cpu_window: tuple[float, float], **labels: str
) -> None:
    """The scraped process figures are those of `pid`: RSS within 15% of /proc's read just
    after, CPU seconds between /proc's reads before and after the scrape, open descriptors
    within 3 (the scrape's own connection comes and goes)."""
    rss = value(samples, f"{prefix}resident_memory_bytes", **labels)
    cpu = value(samples, f"{prefix}cpu_seconds_total", **labels)
    fds = value(samples, f"{prefix}open_fds", **labels)
    assert rss is not None and cpu is not None and fds is not None, (prefix, labels)
    assert abs(rss - proc_rss(pid)) <= 0.15 * proc_rss(pid), (prefix, labels, rss, proc_rss(pid))
    assert cpu_window[0] - 0.02 <= cpu <= cpu_window[1] + 0.02, (prefix, labels, cpu, cpu_window)
    assert abs(fds - proc_fds(pid)) <= 3, (prefix, labels, fds, proc_fds(pid))


async def test_a_running_service_exports_its_processes_and_every_series_ops_files_use(
    tmp_path: Path, tiny_model_file: str
) -> None:
    port = free_port()
    a_chat, b_chat = chats_of("a", 1, 900)[0], chats_of("b", 1, 900)[0]
    async with FakeBotAPI(TOKEN) as api:
        env = two_variant_env(tmp_path, api, tiny_model_file, METRICS_PORT=str(port))
        async with bot_process(env, tmp_path, api) as bot:
            api.user_message(a_chat, "hello there")
            api.user_message(b_chat, "hello there")
            await api.wait_for_texts(a_chat, 1, timeout_s=60)
            await api.wait_for_texts(b_chat, 1, timeout_s=60)
            pids = {"a": worker_pid(bot.output(), "a"), "b": worker_pid(bot.output(), "b")}
            service = bot.proc.pid
            watched = {"": service, **pids}
            before = {name: proc_cpu_s(pid) for name, pid in watched.items()}
            samples = await wait_scraped(
                port,
                lambda s: value(s, "bot_turns_total", outcome="replied", variant="b") == 1,
                "both replies counted",
            )
            after = {name: proc_cpu_s(pid) for name, pid in watched.items()}
            assert_figures_of(samples, service, "process_", (before[""], after[""]))
            for variant, pid in pids.items():
                window = (before[variant], after[variant])
                assert_figures_of(samples, pid, "bot_model_process_", window, variant=variant)
            assert len({service, *pids.values()}) == 3  # three processes, three figures

            # A killed worker's series follow its replacement.
            os.kill(pids["b"], signal.SIGKILL)
            await wait_scraped(
                port,
                lambda s: value(s, "bot_worker_restarts_total", variant="b", reason="exited") == 1,
                "b's restart counted",
                timeout_s=60,
            )

            def restarted() -> int | None:
                found = re.findall(r"variant b: worker (\d+) ready", bot.output())
                return int(found[-1]) if found and int(found[-1]) != pids["b"] else None

            for _ in range(1200):
                if restarted() is not None and value(await scrape(port), "bot_ready") == 1:
                    break
                await asyncio.sleep(0.05)
            new_b = restarted()
            assert new_b is not None, bot.output()[-3000:]
            before_b = proc_cpu_s(new_b)
            again = await scrape(port)
            assert_figures_of(
                again, new_b, "bot_model_process_", (before_b, proc_cpu_s(new_b)), variant="b"
            )
            assert await bot.stop() == 0

    [(labels, one)] = [(dict(k[1]), v) for k, v in samples.items() if k[0] == "bot_build_info"]
    assert one == 1
    assert labels == {
        "version": metadata.version("bot"),
        "python": labels["python"],
        "torch": metadata.version("torch"),
        "parlai": metadata.version("parlai"),
        "model": tiny_model_file,
        "model_backend": "local",
    }
    assert value(samples, "bot_ready") == 1

    # Every metric the alert rules, their promtool tests and the dashboard name is exported,
    # with at least one series, and the rule tests' series carry only labels it has.
    exported: dict[str, set[str]] = {}
    for name, label_set in samples:
        exported.setdefault(name, set()).update(k for k, _ in label_set)
    used = {n for e in alert_exprs().values() for n in metric_names(e)}
    used |= {n for e in dashboard_exprs() for n in metric_names(e)}
    series = {}
    for written in alert_test_series():
        name, _, rest = written.partition("{")
        series[name] = {k for k in re.findall(r"(\w+)=", rest)}
    used |= set(series)
    missing = sorted(n for n in used - SCRAPE_SERIES if n not in exported)
    assert not missing, f"named in deploy/ but not exported: {missing}"
    for name, label_names in series.items():
        if name not in SCRAPE_SERIES:
            assert label_names <= exported[name] | TARGET_LABELS, (name, label_names)
