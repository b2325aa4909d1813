"""Model variants side by side: does a saturated variant slow another one down, and what does
running the model in a worker process cost the service?

    python -m bench.variants [--quick]

Both parts run the real `python -m bot run` against the loopback Bot API with an SQLite
database, through bench/e2e.py's machinery; latency is measured the same way (the update queued
on the server -> the server receiving the bot's sendMessage).

1. Interference. One bot serves a variants file with two variants, each in its own worker
   process (MODEL_WORKERS=process, WORKER_THREADS=1): A, the BlenderBot-90M-architecture model
   with its file's beam search (beam 10, 20-token replies), and B, the tests' tiny model. Chat
   ids are picked with bot.engine.assign.choose, so each chat lands on the variant meant for
   it (every reply's stored variant is checked). Phase "B alone": B's users talk, closed loop
   (each message `--think-ms` after the previous reply), A idle. Phase "B while A saturated":
   more A users than a batch holds (BATCH_MAX_SIZE + 4) talk without pause, so A's worker always
   has a queue, while fresh B chats say the same messages as in the first phase. B's latency in
   the two phases shows whether A's load reaches B; A's throughput and the share of the phase
   its worker spent inside batches show that it was saturated, and the cores each process used
   in each phase (psutil: the service, its workers, this harness, the rest of the machine) show
   where the time went. With `--modes process,inline` (the default) the same again with
   MODEL_WORKERS=inline, both models in the service process. Each B user sends at most
   FLOOD_MAX_MESSAGES - 1 messages per flood window (the gate would drop the rest).
2. Service overhead. bench/e2e.py's load (`--users` users x `--messages` messages, the
   BlenderBot-90M-architecture model, greedy) once with MODEL_WORKERS=inline and once with
   MODEL_WORKERS=process. Overhead = latency - messages.model_ms (the batch's time), split into
   the time in the engine outside the model (messages.latency_ms - model_ms: waiting for a
   batch and the batches ahead, the pipe to the worker) and outside the engine (latency -
   messages.latency_ms: polling, inbox, database, outbox, delivery).

`--quick` is a smoke run (the tiny model everywhere, a few users, process mode only, ~30 s).
Output: markdown tables, `RESULT name=value` lines, bench/results/variants.json and .png
(variants-quick.* for `--quick`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import common, e2e
from bench.e2e import Run
from bot.tasks import cancel_and_wait

EXPERIMENT = "bench-variants"
A, B = "A", "B"
MODES = ("process", "inline")
TINY_MODEL_DIR = Path(tempfile.gettempdir()) / "bot-bench-tiny"
PHASES = ("B alone", "B while A saturated")


@dataclass
class CpuShare:
    """Cores busy on average over a span (CPU seconds per second), by whom."""

    service: float  # the `python -m bot run` process (with the models when inline)
    workers: float  # its model worker processes
    harness: float  # this process: the loopback Bot API server and the users
    others: float  # the rest of the machine (other jobs)


class CpuMeter:
    """CPU time of the bot, its workers, this process and the whole machine (psutil)."""

    def __init__(self, bot_pid: int) -> None:
        import psutil

        self._psutil = psutil
        self.bot = psutil.Process(bot_pid)
        self.me = psutil.Process()

    def _seconds(self, proc: Any) -> float:
        try:
            times = proc.cpu_times()
        except self._psutil.Error:  # gone since it was listed
            return 0.0
        return float(times.user + times.system)

    def read(self) -> dict[str, float]:
        """Cumulative CPU seconds now (workers by pid, so a restarted one is not subtracted)."""
        machine = self._psutil.cpu_times()
        idle = machine.idle + getattr(machine, "iowait", 0.0)
        busy = (
            sum(machine)
            - idle
            - getattr(machine, "guest", 0.0)
            - getattr(machine, "guest_nice", 0.0)
        )
        out = {
            "at": time.monotonic(),
            "service": self._seconds(self.bot),
            "harness": self._seconds(self.me),
            "machine": float(busy),
        }
        for child in self.bot.children(recursive=True):
            out[f"worker:{child.pid}"] = self._seconds(child)
        return out

    @staticmethod
    def share(start: dict[str, float], end: dict[str, float]) -> CpuShare:
        """Average cores busy between two readings."""
        span = end["at"] - start["at"]
        if span <= 0:
            return CpuShare(math.nan, math.nan, math.nan, math.nan)
        workers = sum(v - start.get(k, 0.0) for k, v in end.items() if k.startswith("worker:"))
        service, harness = end["service"] - start["service"], end["harness"] - start["harness"]
        others = end["machine"] - start["machine"] - service - harness - workers
        return CpuShare(service / span, workers / span, harness / span, max(0.0, others) / span)


@dataclass
class Interference:
    """Part 1 in one MODEL_WORKERS mode."""

    mode: str
    b_alone: Run = field(default_factory=Run)
    b_with_a: Run = field(default_factory=Run)
    a: Run = field(default_factory=Run)  # A's users, from its first turn to the last reply
    window: tuple[float, float] = (0.0, 0.0)  # time.time() span of the "B while A" phase
    misrouted: int = 0  # replies whose stored variant is not the chat's intended one
    cpu: dict[str, CpuShare] = field(default_factory=dict)  # by phase

    def a_batches(self) -> list[tuple[float, float, int]]:
        """A's batches as (start, end, size) in time.time(): a batch's replies share its
        model_ms, and it ended about when its first reply was delivered."""
        ends: dict[float, float] = {}
        sizes: dict[float, int] = {}
        for t in self.a.turns:
            if t.model_ms is not None and t.replied_at is not None:
                ends[t.model_ms] = min(t.replied_at, ends.get(t.model_ms, t.replied_at))
                sizes[t.model_ms] = sizes.get(t.model_ms, 0) + 1
        return [(end - ms / 1000.0, end, sizes[ms]) for ms, end in ends.items()]

    def _in_window(self) -> list[tuple[float, int]]:
        """(share of the batch inside the window, its seconds inside) per batch of A."""
        start, end = self.window
        out = []
        for b_start, b_end, size in self.a_batches():
            inside = max(0.0, min(end, b_end) - max(start, b_start))
            if inside > 0:
                out.append((inside, size * inside / (b_end - b_start)))
        return out

    def a_replies_per_s(self) -> float:
        """A's throughput during the "B while A saturated" phase: each batch's replies counted
        in proportion to the part of it inside the phase (a batch can outlast a short phase)."""
        start, end = self.window
        produced = sum(replies for _, replies in self._in_window())
        return produced / (end - start) if end > start else 0.0

    def a_busy(self) -> float:
        """Share of the "B while A saturated" phase that A's engine spent inside batches."""
        start, end = self.window
        busy = sum(seconds for seconds, _ in self._in_window())
        return busy / (end - start) if end > start else 0.0


@dataclass
class Setup:
    """What one invocation measures (the command line, after --quick)."""

    model_a: str
    model_b: str
    model_e2e: str
    a_users: int
    b_users: int
    b_messages: int
    think_s: float
    users: int
    messages: int
    threads: int | None
    modes: list[str]
    wait_s: float
    log_level: str
    keep_logs: Path | None
    quick: bool


# --- part 1: interference -------------------------------------------------------------------


def variants_file(path: Path, setup: Setup) -> dict[str, float]:
    """Write the two-variant file; returns its weights in file order (as the router has them)."""
    quoted = json.dumps  # a JSON string is a valid TOML basic string
    path.write_text(
        f"experiment = {quoted(EXPERIMENT)}\n\n"
        f"[[variants]]\nname = {quoted(A)}\nmodel = {quoted(setup.model_a)}\n"
        "weight = 1\ncontrol = true\n\n"
        f"[[variants]]\nname = {quoted(B)}\nmodel = {quoted(setup.model_b)}\nweight = 1\n"
    )
    return {A: 1.0, B: 1.0}


def chats_for(variant: str, weights: Mapping[str, float], start: int) -> Iterator[int]:
    """Chat ids from `start` on that the router assigns to `variant`, in order."""
    from bot.engine.assign import choose

    chat = start
    while True:
        if choose(EXPERIMENT, chat, weights) == variant:
            yield chat
        chat += 1


def take(chats: Iterator[int], count: int) -> list[int]:
    """The next `count` chat ids."""
    return [next(chats) for _ in range(count)]


@contextlib.asynccontextmanager
async def talking_meanwhile(
    replies: e2e.Replies, chats: Sequence[int], run: Run, wait_s: float
) -> AsyncIterator[None]:
    """`chats` talk without pause while the block runs; at its end they stop sending and their
    last turns are answered. An error in the block abandons them."""
    stop = asyncio.Event()
    task = asyncio.create_task(e2e.talk(replies, chats, run, wait_s, messages=None, stop=stop))
    try:
        yield
    except BaseException:
        await cancel_and_wait(task, raise_errors=False)
        raise
    stop.set()
    await task


async def interference(mode: str, setup: Setup, tmp: Path) -> Interference:
    """Part 1 in `mode`: B alone, then B while A's users saturate A."""
    result = Interference(mode)
    weights = variants_file(tmp / "variants.toml", setup)
    env = e2e.bot_env(
        tmp,
        setup.model_a,
        log_level=setup.log_level,
        extra={
            "VARIANTS_FILE": str(tmp / "variants.toml"),
            "MODEL_WORKERS": mode,
            "WORKER_THREADS": "1",
            "TORCH_THREADS": "1",  # inline: both models share the service process's threads
        },
    )
    a_chats = chats_for(A, weights, e2e.FIRST_CHAT)
    b_chats = chats_for(B, weights, e2e.FIRST_CHAT)
    warm = [next(a_chats), next(b_chats)]
    b_alone, a_users, b_with_a = (
        take(b_chats, setup.b_users),
        take(a_chats, setup.a_users),
        take(b_chats, setup.b_users),
    )
    common.corpus()
    async with e2e.loopback_bot(env, tmp) as replies:
        assert replies.bot_pid is not None
        meter = CpuMeter(replies.bot_pid)
        await e2e.warm_up(replies, warm, setup.wait_s)
        before = meter.read()
        await e2e.talk(
            replies,
            b_alone,
            result.b_alone,
            setup.wait_s,
            messages=setup.b_messages,
            think_s=setup.think_s,
        )
        result.cpu[PHASES[0]] = meter.share(before, meter.read())
        async with talking_meanwhile(replies, a_users, result.a, setup.wait_s):
            # saturated: every A user has had a reply, batches follow each other
            await e2e.wait_until(
                lambda: len(result.a.answered) >= len(a_users),
                setup.wait_s,
                "A's first replies",
            )
            started, before = time.time(), meter.read()
            await e2e.talk(
                replies,
                b_with_a,
                result.b_with_a,
                setup.wait_s,
                messages=setup.b_messages,
                think_s=setup.think_s,
            )
            result.window = (started, time.time())
            result.cpu[PHASES[1]] = meter.share(before, meter.read())
    runs = (result.b_alone, result.b_with_a, result.a)
    e2e.read_db(tmp / "bot.sqlite3", *runs)
    for run, variant in zip(runs, (B, B, A), strict=True):
        result.misrouted += sum(1 for t in run.answered if t.variant != variant)
    return result


# --- part 2: service overhead ---------------------------------------------------------------


async def overhead(mode: str, setup: Setup, tmp: Path) -> Run:
    """bench/e2e.py's load with MODEL_WORKERS=`mode`."""
    env = e2e.bot_env(
        tmp,
        setup.model_e2e,
        decoding="greedy",
        threads=setup.threads,
        log_level=setup.log_level,
        extra={"MODEL_WORKERS": mode},
    )
    return await e2e.session(
        env, tmp, users=setup.users, messages=setup.messages, wait_s=setup.wait_s
    )


# --- running and reporting ------------------------------------------------------------------


@contextlib.contextmanager
def scratch(setup: Setup, name: str) -> Iterator[Path]:
    """A temporary directory for one bot run; its log is kept in --keep-logs."""
    with tempfile.TemporaryDirectory(prefix=f"bench-variants-{name}-") as tmp_dir:
        tmp = Path(tmp_dir)
        try:
            yield tmp
        finally:
            log = tmp / "bot.log"
            if setup.keep_logs is not None and log.exists():
                setup.keep_logs.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(log, setup.keep_logs / f"{name}.log")


def measure(setup: Setup) -> tuple[list[Interference], dict[str, Run]]:
    """Every bot run of the invocation, one after the other."""
    parts: list[Interference] = []
    for mode in setup.modes:
        print(f"interference, MODEL_WORKERS={mode} ...", flush=True)
        with scratch(setup, f"interference-{mode}") as tmp:
            parts.append(asyncio.run(interference(mode, setup, tmp)))
    runs: dict[str, Run] = {}
    for mode in MODES[::-1]:  # inline first: the old way, then the worker process
        print(f"{setup.users} users, MODEL_WORKERS={mode} ...", flush=True)
        with scratch(setup, f"overhead-{mode}") as tmp:
            runs[mode] = asyncio.run(overhead(mode, setup, tmp))
    return parts, runs


def p50_p95(values: Sequence[float]) -> tuple[float, float]:
    """Nearest-rank p50 and p95."""
    return common.percentile(values, 50), common.percentile(values, 95)


def lost(run: Run, expected: int) -> int:
    """Turns without a reply (a user gives up after its first unanswered turn)."""
    return expected - len(run.answered)


def report(setup: Setup, parts: list[Interference], runs: dict[str, Run], wall_s: float) -> None:
    """Markdown tables, RESULT lines, JSON and PNG."""
    expected_b = setup.b_users * setup.b_messages
    rows1: list[list[object]] = []
    results: dict[str, float] = {}
    for part in parts:
        a = e2e.summarize(part.a.turns)
        for phase, run in zip(PHASES, (part.b_alone, part.b_with_a), strict=True):
            b = e2e.summarize(run.turns)
            saturated = run is part.b_with_a
            cpu = part.cpu.get(phase, CpuShare(math.nan, math.nan, math.nan, math.nan))
            rows1.append(
                [
                    part.mode,
                    phase,
                    len(run.answered),
                    *p50_p95(b.latency),
                    common.percentile(b.engine_wait, 50),
                    common.percentile(b.outside, 50),
                    part.a_replies_per_s() if saturated else math.nan,
                    part.a_busy() if saturated else math.nan,
                    common.percentile(a.latency, 50) if saturated else math.nan,
                    cpu.service,
                    cpu.workers,
                    cpu.harness,
                    cpu.others,
                ]
            )
        prefix = "variants_" if part.mode == "process" else f"variants_{part.mode}_"
        b_alone = p50_p95(e2e.summarize(part.b_alone.turns).latency)
        b_with_a = p50_p95(e2e.summarize(part.b_with_a.turns).latency)
        results |= {
            f"{prefix}b_alone_p50_ms": b_alone[0],
            f"{prefix}b_alone_p95_ms": b_alone[1],
            f"{prefix}b_with_a_saturated_p50_ms": b_with_a[0],
            f"{prefix}b_with_a_saturated_p95_ms": b_with_a[1],
            f"{prefix}a_saturated_replies_per_s": part.a_replies_per_s(),
            f"{prefix}a_busy_fraction": part.a_busy(),
        }
    print()
    print(
        f"### Interference: B (tiny model) with A ({'tiny' if setup.quick else 'BlenderBot-90M'} "
        f"beam) idle or saturated; {setup.b_users} B users x {setup.b_messages} messages, "
        f"{setup.think_s * 1000:.0f} ms think time, {setup.a_users} A users; WORKER_THREADS=1"
    )
    print()
    print(
        common.markdown_table(
            [
                "MODEL_WORKERS",
                "phase",
                "B replies",
                "B p50 ms",
                "B p95 ms",
                "B engine wait p50",
                "B outside engine p50",
                "A replies/s",
                "A busy",
                "A p50 ms",
                "cores: service",
                "workers",
                "harness",
                "others",
            ],
            rows1,
        )
    )

    rows2: list[list[object]] = []
    for mode, run in runs.items():
        s = e2e.summarize(run.turns)
        rate = len(run.answered) / run.wall_s if run.wall_s else 0.0
        rows2.append(
            [
                mode,
                len(run.answered),
                rate,
                *p50_p95(s.latency),
                *p50_p95(s.model),
                *p50_p95(s.overhead),
                *p50_p95(s.engine_wait),
                *p50_p95(s.outside),
            ]
        )
        results |= {
            f"variants_e2e_{mode}_latency_p50_ms": common.percentile(s.latency, 50),
            f"variants_e2e_{mode}_latency_p95_ms": common.percentile(s.latency, 95),
            f"variants_e2e_{mode}_overhead_p50_ms": common.percentile(s.overhead, 50),
            f"variants_e2e_{mode}_overhead_p95_ms": common.percentile(s.overhead, 95),
            f"variants_e2e_{mode}_outside_engine_p50_ms": common.percentile(s.outside, 50),
            f"variants_e2e_{mode}_replies_per_s": rate,
        }
    print()
    print(
        f"### Service overhead: {setup.users} users x {setup.messages} messages, "
        f"{'tiny model' if setup.quick else 'BlenderBot-90M-architecture'}, greedy "
        "(overhead = latency - model_ms = engine wait + outside the engine)"
    )
    print()
    print(
        common.markdown_table(
            [
                "MODEL_WORKERS",
                "replies",
                "replies/s",
                "latency p50",
                "latency p95",
                "model p50",
                "model p95",
                "overhead p50",
                "overhead p95",
                "engine wait p50",
                "engine wait p95",
                "outside engine p50",
                "outside engine p95",
            ],
            rows2,
        )
    )
    print()

    n_lost = sum(lost(p.b_alone, expected_b) + lost(p.b_with_a, expected_b) for p in parts)
    n_lost += sum(len(p.a.errors) for p in parts)
    n_lost += sum(lost(run, setup.users * setup.messages) for run in runs.values())
    misrouted = sum(p.misrouted for p in parts)
    errors = [e for p in parts for r in (p.b_alone, p.b_with_a, p.a) for e in r.errors]
    errors += [e for run in runs.values() for e in run.errors]
    print(f"lost {n_lost}, misrouted {misrouted}, wall time {wall_s:.0f} s")
    for err in errors[:10]:
        print("  " + err)

    name = "variants-quick" if setup.quick else "variants"
    common.write_json(
        name,
        {
            "setup": {k: str(v) if isinstance(v, Path) else v for k, v in setup.__dict__.items()},
            "wall_s": wall_s,
            "lost": n_lost,
            "misrouted": misrouted,
            "errors": errors,
            "results": results,
            "interference": [_interference_json(p) for p in parts],
            "overhead": {mode: _run_json(run) for mode, run in runs.items()},
        },
    )
    _figure(name, parts, runs)
    results |= {"variants_lost": float(n_lost), "variants_misrouted": float(misrouted)}
    common.emit_results(results)


def _run_json(run: Run) -> dict[str, Any]:
    return {
        "replies": len(run.answered),
        "wall_s": run.wall_s,
        **e2e.summarize(run.turns).percentiles(),
        "errors": run.errors,
        "turns": [t.__dict__ for t in run.turns],
    }


def _interference_json(part: Interference) -> dict[str, Any]:
    return {
        "mode": part.mode,
        "window_s": part.window[1] - part.window[0],
        "a_replies_per_s": part.a_replies_per_s(),
        "a_busy_fraction": part.a_busy(),
        "a_batches": [
            {"start": start, "end": end, "size": size} for start, end, size in part.a_batches()
        ],
        "cpu_cores": {phase: share.__dict__ for phase, share in part.cpu.items()},
        "misrouted": part.misrouted,
        "b_alone": _run_json(part.b_alone),
        "b_with_a_saturated": _run_json(part.b_with_a),
        "a_saturated": _run_json(part.a),
    }


def _ecdf(ax: Any, values: Sequence[float], label: str) -> None:
    ordered = sorted(values)
    if ordered:
        ax.step(ordered, [(i + 1) / len(ordered) for i in range(len(ordered))], label=label)


def _figure(name: str, parts: list[Interference], runs: dict[str, Run]) -> None:
    fig, axes = common.new_figure(ncols=2, width=5.5)
    left, right = axes[0]
    for part in parts:
        for phase, run in (("alone", part.b_alone), ("A saturated", part.b_with_a)):
            _ecdf(left, e2e.summarize(run.turns).latency, f"{part.mode}: B, {phase}")
    left.set_xscale("log")
    left.set_xlabel("B's reply latency (ms)")
    left.set_ylabel("share of replies")
    left.set_title("interference")
    left.legend()
    for mode, run in runs.items():
        summary = e2e.summarize(run.turns)
        _ecdf(right, summary.overhead, f"{mode}: latency - model_ms")
        _ecdf(right, summary.outside, f"{mode}: outside the engine")
    right.set_xscale("log")
    right.set_xlabel("ms")
    right.set_title("service overhead")
    right.legend()
    common.save_figure(name, fig)


def parse_setup(argv: Sequence[str] | None = None) -> Setup:
    """The command line."""
    from bot.config import Settings

    batch = int(Settings.model_fields["batch_max_size"].default)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a-users", type=int, default=batch + 4, help="A's saturating users")
    parser.add_argument("--b-users", type=int, default=20)
    parser.add_argument("--b-messages", type=int, default=10, help="per B user and phase")
    parser.add_argument("--think-ms", type=float, default=1000.0, help="B users' pause")
    parser.add_argument("--users", type=int, default=50, help="part 2's users")
    parser.add_argument("--messages", type=int, default=5, help="part 2's messages per user")
    parser.add_argument("--threads", type=int, default=None, help="part 2's TORCH_THREADS")
    parser.add_argument(
        "--modes", default=",".join(MODES), help="MODEL_WORKERS modes of part 1, comma-separated"
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait per reply")
    parser.add_argument("--log-level", default="WARNING", help="the bot's LOG_LEVEL")
    parser.add_argument("--keep-logs", type=Path, help="copy the bots' logs to this folder")
    parser.add_argument(
        "--quick", action="store_true", help="tiny model everywhere, a few users, process only"
    )
    args = parser.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes):
        parser.error(f"--modes takes {', '.join(MODES)}")
    # The flood gate drops what a chat sends over FLOOD_MAX_MESSAGES (the /persona included) in
    # FLOOD_WINDOW_S: a dropped message would never be answered.
    limit = int(Settings.model_fields["flood_max_messages"].default)
    window_s = float(Settings.model_fields["flood_window_s"].default)
    if args.b_messages + 1 > limit and window_s / max(args.think_ms / 1000.0, 1e-3) + 2 > limit:
        parser.error(
            f"B users would hit the flood gate ({limit} messages in {window_s:g} s): "
            f"use --b-messages {limit - 1} or fewer, or a longer --think-ms"
        )
    if args.quick:
        args.a_users, args.b_users, args.b_messages, args.think_ms = 3, 2, 2, 50.0
        args.users, args.messages, args.threads = 3, 2, args.threads or 1
        modes = ["process"]
    from tests.support.tinymodel import build_tiny_model

    tiny = build_tiny_model(TINY_MODEL_DIR)
    big = tiny if args.quick else common.build_bench_model()
    return Setup(
        model_a=big,
        model_b=tiny,
        model_e2e=big,
        a_users=args.a_users,
        b_users=args.b_users,
        b_messages=args.b_messages,
        think_s=args.think_ms / 1000.0,
        users=args.users,
        messages=args.messages,
        threads=args.threads,
        modes=modes,
        wait_s=args.timeout,
        log_level=args.log_level,
        keep_logs=args.keep_logs,
        quick=args.quick,
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Measure both parts and report."""
    started = time.perf_counter()
    missing = e2e.missing_parts()
    if missing is not None:
        print(f"variants: cannot run: {missing}")
        common.emit_results({"variants_lost": float("nan")})
        sys.exit(2)
    setup = parse_setup(argv)
    parts, runs = measure(setup)
    report(setup, parts, runs, time.perf_counter() - started)


if __name__ == "__main__":
    main()
