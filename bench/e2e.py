"""End to end: the real `python -m bot run` process, many users talking at once.

    python -m bench.e2e --users 50 --messages 5 [--quick] [--set STREAM_REPLIES=off ...]
        [--before DIR] [--loop-trace] [--updates-tick-ms MS]

A loopback Bot API server (tests/support/fakebotapi.py) plays Telegram; the bot polls it with
its real settings, an SQLite database of its own and the BlenderBot-90M-architecture model (20-token
replies; greedy by default so that the run stays short: the service's own overhead is the point
here, `--decoding beam` for Blender's beam settings). Every user sets a persona, then sends
`--messages` messages, each after the reply to the previous one arrived (people wait for
answers), all users at once. The server answers a waiting getUpdates as soon as a message
comes, as Telegram does; on a real network the messages that come during the bot's round trip
to Telegram go out together, in bursts, which `--updates-tick-ms` imitates (the server answers
only that often; it looked every 10 ms until 2026-12-04, docs/benchmarks.md, "seventh pass").

Latency = from queuing the update on the server to the server receiving the bot's sendMessage.
Model time = messages.model_ms of the bot's row (the batch that produced the reply).
Overhead = latency - model time, split in two:
- in the engine, outside the model = messages.latency_ms - model_ms (the whole respond call:
  routing, the clone cache, waiting for a batch and for the batches ahead of it, and with
  MODEL_WORKERS=process the pipe to the worker);
- outside the engine = latency - messages.latency_ms: polling, the inbox, the per-chat
  sequencer, the database transactions, the outbox and delivery.

`--loop-trace` times every callback of the bot's event loop (bench/looptrace/sitecustomize.py)
and prints how busy the loop was: over the run (`loop_busy_share`) and while turns were outside
the engine, in the union of the times from queuing an update to its inbox row and from a reply's
commit to its sendMessage (`loop_busy_share_outside`). Near 1, those turns wait for the loop's
CPU: other turns' work, not a timer or the database. `loop_on_cpu_share` is how much of the
callbacks' time the loop's thread was running on a core (its thread CPU time): the rest it waited
for the GIL, held by the inference thread between torch's calls, or for a core.

The machinery (the bot process against the loopback server, closed-loop users, reading the
bot's database, the summary) is shared with bench/variants.py.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import common

TOKEN = "123456789:AAbenchmarkTokenForTheLoopbackApi0001"
START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 120.0
FIRST_CHAT = 5000
LOOP_TRACE = Path(__file__).resolve().parent / "looptrace"  # --loop-trace's sitecustomize


@dataclass
class Turn:
    """One user message and its reply."""

    chat_id: int
    index: int
    sent_at: float  # time.time() when the update was queued on the server
    latency_ms: float | None = None  # queued -> the server received the bot's sendMessage
    replied_at: float | None = None  # time.time() of that sendMessage
    respond_ms: float | None = None  # messages.latency_ms: the whole respond call
    model_ms: float | None = None  # messages.model_ms: the batch that produced the reply
    variant: str | None = None  # messages.variant
    text: str | None = None
    inbox_at: float | None = None  # inbox.received_at of the update: polled and stored
    committed_at: float | None = None  # outbox.created_at of the reply: the turn's transaction


@dataclass
class Run:
    """Everything measured over one set of users."""

    turns: list[Turn] = field(default_factory=list)
    wall_s: float = 0.0
    errors: list[str] = field(default_factory=list)
    pending_inbox: int = 0
    unsent_outbox: int = 0
    # --loop-trace: the bot's event-loop callbacks, (time.time() at start, seconds)
    loop_busy: list[tuple[float, float]] | None = None
    # and the loop thread's CPU time in each (seconds), in the same order
    loop_cpu: list[float] | None = None
    # and the callbacks' (calls, seconds, CPU seconds, longest call's seconds) by what ran
    # them (a task's name)
    loop_by: dict[str, tuple[int, float, float, float]] = field(default_factory=dict)

    @property
    def answered(self) -> list[Turn]:
        """The turns that got their reply."""
        return [t for t in self.turns if t.latency_ms is not None]

    @property
    def error_replies(self) -> int:
        """Answered turns whose reply is the service's apology."""
        return sum(1 for t in self.answered if (t.text or "").startswith("Sorry"))


@dataclass
class Summary:
    """Per-reply figures of a set of turns, in ms (see the module docstring)."""

    latency: list[float] = field(default_factory=list)
    model: list[float] = field(default_factory=list)
    overhead: list[float] = field(default_factory=list)  # latency - model_ms
    engine_wait: list[float] = field(default_factory=list)  # respond_ms - model_ms
    outside: list[float] = field(default_factory=list)  # latency - respond_ms
    # outside, split (ms): queued -> inbox row; inbox row -> reply's transaction, less the
    # respond call; that transaction -> the server has the sendMessage
    to_inbox: list[float] = field(default_factory=list)
    inbox_to_commit: list[float] = field(default_factory=list)
    commit_to_sent: list[float] = field(default_factory=list)

    def rows(self) -> list[tuple[str, float, float]]:
        """(label, p50, p95) for a table."""
        series = [
            ("reply latency", self.latency),
            ("model time (model_ms)", self.model),
            ("overhead (latency - model_ms)", self.overhead),
            ("  in the engine, outside the model", self.engine_wait),
            ("  outside the engine", self.outside),
            ("    polling and the inbox row", self.to_inbox),
            ("    inbox row to the reply's commit", self.inbox_to_commit),
            ("    commit to sendMessage", self.commit_to_sent),
        ]
        return [(label, common.percentile(v, 50), common.percentile(v, 95)) for label, v in series]

    def percentiles(self) -> dict[str, dict[str, float]]:
        """{"latency_ms": {"p50": .., "p95": ..}, ...} for the JSON."""
        names = [
            "latency_ms",
            "model_ms",
            "overhead_ms",
            "engine_wait_ms",
            "outside_engine_ms",
            "to_inbox_ms",
            "inbox_to_commit_ms",
            "commit_to_sent_ms",
        ]
        return {
            name: {"p50": p50, "p95": p95}
            for name, (_, p50, p95) in zip(names, self.rows(), strict=True)
        }


def summarize(turns: Sequence[Turn]) -> Summary:
    """The figures of the answered turns (overheads only where the database has the times)."""
    out = Summary()
    for t in turns:
        if t.latency_ms is None:
            continue
        out.latency.append(t.latency_ms)
        if t.model_ms is not None:
            out.model.append(t.model_ms)
            out.overhead.append(t.latency_ms - t.model_ms)
            if t.respond_ms is not None:
                out.engine_wait.append(t.respond_ms - t.model_ms)
        if t.respond_ms is not None:
            out.outside.append(t.latency_ms - t.respond_ms)
            if t.inbox_at is not None and t.committed_at is not None and t.replied_at is not None:
                out.to_inbox.append((t.inbox_at - t.sent_at) * 1000)
                out.inbox_to_commit.append((t.committed_at - t.inbox_at) * 1000 - t.respond_ms)
                out.commit_to_sent.append((t.replied_at - t.committed_at) * 1000)
    return out


def busy_share(
    busy: Sequence[tuple[float, float]], windows: Sequence[tuple[float, float]]
) -> float:
    """The share of the union of `windows` (start, end) covered by the `busy` intervals
    (start, length): how much of that time the event loop was running callbacks."""
    merged: list[list[float]] = []
    for start, end in sorted(w for w in windows if w[1] > w[0]):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    total = sum(end - start for start, end in merged)
    if not total:
        return float("nan")
    covered, k = 0.0, 0
    for start, length in sorted(busy):
        end = start + length
        while k < len(merged) and merged[k][1] <= start:
            k += 1
        j = k
        while j < len(merged) and merged[j][0] < end:
            covered += min(end, merged[j][1]) - max(start, merged[j][0])
            j += 1
    return covered / total


def outside_windows(turns: Sequence[Turn]) -> list[tuple[float, float]]:
    """Per answered turn: queued -> its inbox row, and its reply's commit -> sendMessage."""
    out = []
    for t in turns:
        if t.replied_at is None or t.inbox_at is None or t.committed_at is None:
            continue
        out += [(t.sent_at, t.inbox_at), (t.committed_at, t.replied_at)]
    return out


def loop_shares(run: Run) -> dict[str, float]:
    """loop_busy_share (from the first update to the last reply) and loop_busy_share_outside;
    empty without --loop-trace."""
    if not run.loop_busy or not run.answered:
        return {}
    first = min(t.sent_at for t in run.answered)
    last = max(t.replied_at or first for t in run.answered)
    return {
        "loop_busy_share": busy_share(run.loop_busy, [(first, last)]),
        "loop_busy_share_outside": busy_share(run.loop_busy, outside_windows(run.turns)),
        **(
            {"loop_on_cpu_share": sum(run.loop_cpu) / sum(took for _, took in run.loop_busy)}
            if run.loop_cpu
            else {}
        ),
    }


def missing_parts() -> str | None:
    """Why the end-to-end benchmark cannot run yet, or None."""
    if not (common.ROOT / "tests" / "support" / "fakebotapi.py").exists():
        return "tests/support/fakebotapi.py (the loopback Bot API server) does not exist yet"
    if not (common.ROOT / "bot" / "app.py").exists():
        return "bot/app.py (`python -m bot run`) does not exist yet"
    return None


def bot_env(
    tmp: Path,
    model_file: str,
    *,
    decoding: str | None = None,
    threads: int | None = None,
    log_level: str = "WARNING",
    extra: Mapping[str, str] | None = None,
    root: Path = common.ROOT,
) -> dict[str, str]:
    """The bot's environment: only what a deployment would set (loopback_bot adds the server's
    URL). `decoding` None keeps the model file's own generation settings; `root` is the tree
    whose code runs (another checkout for a before/after comparison)."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", str(tmp)),
        "PYTHONPATH": str(root),
        "TELEGRAM_BOT_TOKEN": TOKEN,
        "DATABASE_URL": f"sqlite+aiosqlite:///{tmp / 'bot.sqlite3'}",
        "BOT_MODEL": model_file,
        "DATA_DIR": str(tmp / "data"),
        "MODEL_DEVICE": "cpu",
        "LOG_LEVEL": log_level,
        "SHUTDOWN_GRACE_S": "30",
    }
    if decoding is not None:
        env["INFERENCE"] = decoding
        if decoding == "greedy":
            env["BEAM_SIZE"] = "1"
    if threads:
        env["TORCH_THREADS"] = str(threads)
    env.update(extra or {})
    return env


class Replies:
    """Counts what the server receives per chat and wakes the waiting user: no busy polling,
    which would steal CPU from the bot on a small machine."""

    def __init__(self, api: Any) -> None:
        self.api = api
        self.bot_pid: int | None = None  # the bot's process, once loopback_bot started it
        self.counts: dict[int, int] = {}
        self.sent_at: dict[int, list[float]] = {}
        self.texts: dict[int, list[str]] = {}
        self._events: dict[int, asyncio.Event] = {}
        original = api._m_sendmessage

        async def send_message(params: Any) -> Any:
            result = await original(params)
            sent = api.sent[-1]
            self.counts[sent.chat_id] = self.counts.get(sent.chat_id, 0) + 1
            self.sent_at.setdefault(sent.chat_id, []).append(sent.at)
            self.texts.setdefault(sent.chat_id, []).append(sent.text)
            event = self._events.get(sent.chat_id)
            if event is not None:
                event.set()
            return result

        api._m_sendmessage = send_message

    async def wait(self, chat_id: int, count: int, wait_s: float) -> bool:
        """Until `chat_id` received `count` messages; False after `wait_s` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        event = self._events.setdefault(chat_id, asyncio.Event())
        while self.counts.get(chat_id, 0) < count:
            event.clear()
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            try:
                async with asyncio.timeout(remaining):
                    await event.wait()
            except TimeoutError:
                return False
        return True


@contextlib.asynccontextmanager
async def loopback_bot(
    env: Mapping[str, str],
    tmp: Path,
    root: Path = common.ROOT,
    updates_tick_s: float | None = None,
) -> AsyncIterator[Replies]:
    """`python -m bot run` with `env` against a fresh loopback Bot API server, until it polls.

    Its log is tmp/bot.log. Leaving the block stops the bot with SIGTERM and waits for it (so
    its database is complete); an error kills it.
    """
    from tests.support.fakebotapi import FakeBotAPI

    async with FakeBotAPI(TOKEN, updates_tick_s=updates_tick_s) as api:
        replies = Replies(api)
        log_path = tmp / "bot.log"
        with log_path.open("wb") as log:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "bot",
                "run",
                cwd=root,
                env={**env, "TELEGRAM_BASE_URL": api.base_url},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            replies.bot_pid = proc.pid
            try:
                deadline = time.monotonic() + START_TIMEOUT_S
                while not api.calls_to("getUpdates"):
                    if proc.returncode is not None or time.monotonic() > deadline:
                        raise RuntimeError(
                            "the bot did not start:\n" + log_path.read_text()[-3000:]
                        )
                    await asyncio.sleep(0.05)
                yield replies
                proc.send_signal(signal.SIGTERM)
                async with asyncio.timeout(STOP_TIMEOUT_S):
                    await proc.wait()
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()


async def warm_up(replies: Replies, chats: Sequence[int], wait_s: float) -> None:
    """One message in each chat (not measured): the first generation pays lazy initialisation."""
    for chat in chats:
        replies.api.user_message(chat, "hello there")
    for chat in chats:
        if not await replies.wait(chat, 1, wait_s):
            raise RuntimeError(f"no reply to the warm-up message in chat {chat}")


async def _user(
    replies: Replies,
    chat_id: int,
    user: int,
    run: Run,
    wait_s: float,
    *,
    messages: int | None,
    stop: asyncio.Event | None,
    think_s: float,
) -> None:
    """Persona first (not measured), then turns, each `think_s` after the previous reply: up to
    `messages` of them (None: no limit) and until `stop` is set."""
    api = replies.api
    api.user_message(chat_id, "/persona " + common.persona(user))
    if not await replies.wait(chat_id, 1, wait_s):
        run.errors.append(f"chat {chat_id}: no answer to /persona")
        return
    k = 0
    while (messages is None or k < messages) and not (stop is not None and stop.is_set()):
        if k and think_s:
            await asyncio.sleep(think_s)
        turn = Turn(chat_id, k, time.time())
        run.turns.append(turn)
        api.user_message(chat_id, common.user_message(user, k))
        if not await replies.wait(chat_id, k + 2, wait_s):
            run.errors.append(f"chat {chat_id}: no reply to message {k + 1}")
            return
        turn.replied_at = replies.sent_at[chat_id][k + 1]
        turn.latency_ms = (turn.replied_at - turn.sent_at) * 1000
        turn.text = replies.texts[chat_id][k + 1]
        k += 1


async def talk(
    replies: Replies,
    chats: Sequence[int],
    run: Run,
    wait_s: float,
    *,
    messages: int | None,
    stop: asyncio.Event | None = None,
    think_s: float = 0.0,
) -> float:
    """All `chats` at once, closed loop (user u of the list says what user u always says);
    records the turns in `run` and returns the wall time in seconds (also run.wall_s)."""
    started = time.perf_counter()
    await asyncio.gather(
        *(
            _user(replies, chat, u, run, wait_s, messages=messages, stop=stop, think_s=think_s)
            for u, chat in enumerate(chats)
        )
    )
    run.wall_s = time.perf_counter() - started
    return run.wall_s


async def wait_until(condition: Callable[[], bool], wait_s: float, what: str) -> None:
    """Poll `condition` a few times a second; RuntimeError naming `what` after `wait_s`."""
    deadline = time.monotonic() + wait_s
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


def _stamp(value: str | None) -> float | None:
    """A stored UTC time as time.time()."""
    if value is None:
        return None
    at = datetime.fromisoformat(value)
    return (at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp()


def read_db(path: Path, *runs: Run) -> None:
    """Fill the runs' turns with their rows' latency_ms, model_ms and variant (a chat's k-th
    timed bot row is its k-th turn's reply), the update's inbox time and the reply's outbox
    time; every run gets the database's leftovers (pending inbox rows, unsent outbox rows)."""
    with sqlite3.connect(path) as conn:
        rows = conn.execute(
            "SELECT m.chat_id, m.latency_ms, m.model_ms, m.variant, o.created_at, "
            "(SELECT i.received_at FROM messages u JOIN inbox i ON i.update_id = u.update_id "
            " WHERE u.chat_id = m.chat_id AND u.role = 'user' AND u.id < m.id "
            " ORDER BY u.id DESC LIMIT 1) "
            "FROM messages m LEFT JOIN outbox o ON o.message_id = m.id "
            "WHERE m.role = 'bot' AND m.latency_ms IS NOT NULL ORDER BY m.chat_id, m.id"
        ).fetchall()
        pending = conn.execute("SELECT count(*) FROM inbox WHERE status = 'pending'").fetchone()[0]
        unsent = conn.execute("SELECT count(*) FROM outbox WHERE sent_at IS NULL").fetchone()[0]
    turns = {(t.chat_id, t.index): t for run in runs for t in run.turns}
    seen: dict[int, int] = {}
    for chat_id, latency, model, variant, committed, received in rows:
        k = seen.get(chat_id, 0)
        seen[chat_id] = k + 1
        turn = turns.get((chat_id, k))
        if turn is not None:
            turn.respond_ms = float(latency)
            turn.model_ms = None if model is None else float(model)
            turn.variant = variant
            turn.committed_at = _stamp(committed)
            turn.inbox_at = _stamp(received)
    for run in runs:
        run.pending_inbox, run.unsent_outbox = int(pending), int(unsent)


async def session(
    env: Mapping[str, str],
    tmp: Path,
    *,
    users: int,
    messages: int,
    wait_s: float,
    root: Path = common.ROOT,
    updates_tick_s: float | None = None,
) -> Run:
    """Start the server and the bot (`env`, see bot_env), warm it up, run `users` users x
    `messages` messages, stop the bot, read its database."""
    run = Run()
    common.corpus()  # load the message texts before anything is timed
    async with loopback_bot(env, tmp, root, updates_tick_s) as replies:
        await warm_up(replies, [FIRST_CHAT - 1], wait_s)
        chats = [FIRST_CHAT + u for u in range(users)]
        await talk(replies, chats, run, wait_s, messages=messages)
    read_db(tmp / "bot.sqlite3", run)
    return run


def main() -> None:
    """Run, print the table, RESULT lines, JSON and PNG."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=50)
    parser.add_argument("--messages", type=int, default=5)
    parser.add_argument("--decoding", choices=["beam", "greedy"], default="greedy")
    parser.add_argument("--threads", type=int, default=None, help="TORCH_THREADS for the bot")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait per reply")
    parser.add_argument("--log-level", default="WARNING", help="the bot's LOG_LEVEL")
    parser.add_argument("--keep-log", type=Path, help="copy the bot's log here at the end")
    parser.add_argument(
        "--before",
        type=Path,
        help="first run the same session with the code of this checkout (e.g. `git worktree "
        "add /tmp/before REV`), for a before/after in one run",
    )
    parser.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        type=parse_setting,
        metavar="NAME=VALUE",
        help="a setting of the bot's for this run, e.g. STREAM_REPLIES=off or SAFETY=off, to "
        "measure what a feature costs (repeatable; both runs of --before get it)",
    )
    parser.add_argument(
        "--loop-trace",
        action="store_true",
        help="time the bot's event-loop callbacks and print how busy the loop was (see above)",
    )
    parser.add_argument(
        "--updates-tick-ms",
        type=float,
        default=None,
        help="the Bot API answers a waiting getUpdates only every this many ms, so updates "
        "that come meanwhile go out together, as a round trip to Telegram lets them pile up "
        "(default: at once, as Telegram answers; 10 was the loopback server's way until "
        "2026-12-04)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="3 users, 2 messages, greedy, 1 torch thread"
    )
    args = parser.parse_args()
    if args.quick:
        args.users, args.messages, args.decoding = 3, 2, "greedy"
        args.threads = args.threads or 1  # a smoke run must not depend on an idle machine
    missing = missing_parts()
    if missing is not None:
        print(f"e2e: cannot run: {missing}")
        common.emit_results({"lost": float("nan")})
        sys.exit(2)

    model_file = common.build_bench_model()
    print(
        f"e2e: `python -m bot run` against the loopback Bot API, {args.users} users x "
        f"{args.messages} messages, decoding {args.decoding}, {common.REPLY_TOKENS}-token replies"
        + (
            ""
            if args.updates_tick_ms is None
            else f", getUpdates answered every {args.updates_tick_ms:g} ms"
        ),
        flush=True,
    )
    before = None
    if args.before is not None:
        print(f"e2e: first the code in {args.before} (before), then this tree's", flush=True)
        before = _measure(args, model_file, args.before.resolve())
        _report("before", args, *before)
    run, summary = _measure(args, model_file, common.ROOT)
    rows = _report("after" if before else None, args, run, summary)
    shares = loop_shares(run)
    answered = run.answered
    lost = args.users * args.messages - len(answered)
    sorry = run.error_replies
    rate = _rate(run)
    common.write_json(
        "e2e",
        {
            "users": args.users,
            "messages": args.messages,
            "decoding": args.decoding,
            "replies": len(answered),
            "lost": lost,
            "error_replies": sorry,
            "wall_s": run.wall_s,
            "replies_per_s": rate,
            **summary.percentiles(),
            "pending_inbox": run.pending_inbox,
            "unsent_outbox": run.unsent_outbox,
            "errors": run.errors,
            **shares,
            "turns": [t.__dict__ for t in run.turns],
            "quick": args.quick,
            "before": None
            if before is None
            else {"tree": str(args.before), **before[1].percentiles()},
        },
    )
    overhead_p50 = rows[2][1]
    fig, axes = common.new_figure(ncols=2, width=5.0)
    axes[0][0].hist(
        [summary.latency, summary.model], bins=30, label=["reply latency", "model time"]
    )
    axes[0][0].set_xlabel("ms")
    axes[0][0].set_ylabel("replies")
    axes[0][0].set_title(f"{args.users} users x {args.messages} messages")
    axes[0][0].legend()
    axes[0][1].hist(summary.overhead, bins=30, color="tab:green")
    axes[0][1].set_xlabel("latency - model time (ms)")
    axes[0][1].set_title(f"service overhead, p50 {overhead_p50:.1f} ms")
    common.save_figure("e2e", fig)
    common.emit_results(
        {
            "latency_ms_p50": rows[0][1],
            "latency_ms_p95": rows[0][2],
            "replies_per_s": rate,
            "overhead_ms_p50": overhead_p50,
            "overhead_ms_p95": rows[2][2],
            "outside_engine_ms_p50": rows[4][1],
            "outside_engine_ms_p95": rows[4][2],
            "lost": float(lost),
            **shares,
            **(
                {}
                if before is None
                else {
                    "outside_engine_ms_p50_before": common.percentile(before[1].outside, 50),
                    "outside_engine_ms_p95_before": common.percentile(before[1].outside, 95),
                    "replies_per_s_before": _rate(before[0]),
                    **{f"{k}_before": v for k, v in loop_shares(before[0]).items()},
                }
            ),
        }
    )


def parse_setting(text: str) -> tuple[str, str]:
    """`NAME=VALUE` of --set, NAME a setting's environment variable (docs/configuration.md)."""
    name, sep, value = text.partition("=")
    if not sep or not name or name != name.upper() or not name.replace("_", "").isalnum():
        raise argparse.ArgumentTypeError(
            f"{text!r}: give a setting as NAME=VALUE, e.g. STREAM_REPLIES=off"
        )
    if name in ("TELEGRAM_BOT_TOKEN", "DATABASE_URL", "BOT_MODEL", "DATA_DIR"):
        raise argparse.ArgumentTypeError(f"{name} is the benchmark's own; it cannot be set")
    return name, value


def _rate(run: Run) -> float:
    return len(run.answered) / run.wall_s if run.wall_s else 0.0


def _measure(args: argparse.Namespace, model_file: str, root: Path) -> tuple[Run, Summary]:
    """One session with the code in `root`."""
    with tempfile.TemporaryDirectory(prefix="bench-e2e-") as tmp_dir:
        try:
            tmp = Path(tmp_dir)
            extra = dict(args.settings)
            if args.loop_trace:
                extra["PYTHONPATH"] = f"{LOOP_TRACE}{os.pathsep}{root}"
                extra["BENCH_LOOPTRACE_DIR"] = str(tmp / "looptrace")
            env = bot_env(
                tmp,
                model_file,
                decoding=args.decoding,
                threads=args.threads,
                log_level=args.log_level,
                root=root,
                extra=extra,
            )
            run = asyncio.run(
                session(
                    env,
                    tmp,
                    users=args.users,
                    messages=args.messages,
                    wait_s=args.timeout,
                    root=root,
                    updates_tick_s=(
                        None if args.updates_tick_ms is None else args.updates_tick_ms / 1000.0
                    ),
                )
            )
            if args.loop_trace:
                run.loop_busy, run.loop_cpu, run.loop_by = _read_loop_trace(tmp / "looptrace")
        finally:
            if args.keep_log is not None:
                shutil.copyfile(Path(tmp_dir) / "bot.log", args.keep_log)
    return run, summarize(run.turns)


def _read_loop_trace(
    folder: Path,
) -> tuple[list[tuple[float, float]], list[float], dict[str, tuple[int, float, float, float]]]:
    """The bot's loop trace (bench/looptrace/sitecustomize.py: one file, the bot process's):
    the callbacks (start, seconds), their CPU seconds, and the sums by what ran them."""
    files = sorted(folder.glob("*.json"))
    if len(files) != 1:
        raise RuntimeError(f"expected the bot's loop trace in {folder}, found {len(files)} files")
    trace = json.loads(files[0].read_text(encoding="utf-8"))
    entries = trace["callbacks"]
    busy = [(float(e[0]), float(e[1])) for e in entries]
    cpu = [float(e[2]) for e in entries]
    by = {
        name: (int(n), float(s), float(c), float(longest))
        for name, (n, s, c, longest) in trace["by"].items()
    }
    return busy, cpu, by


def _report(
    label: str | None, args: argparse.Namespace, run: Run, summary: Summary
) -> list[tuple[str, float, float]]:
    """The table and the counts of one session; its rows."""
    expected = args.users * args.messages
    answered = run.answered
    rows = summary.rows()
    title = f"End to end, {args.users} users x {args.messages} messages (ms)"
    common.print_table(title + (f", {label}" if label else ""), ["", "p50", "p95"], rows)
    print(
        f"{len(answered)}/{expected} replies in {run.wall_s:.1f} s = {_rate(run):.2f} replies/s; "
        f"lost {expected - len(answered)}; error replies {run.error_replies}; pending inbox "
        f"{run.pending_inbox}, unsent outbox {run.unsent_outbox}"
    )
    shares = loop_shares(run)
    if shares:
        print(
            f"event loop busy: {shares['loop_busy_share']:.0%} of the run, "
            f"{shares['loop_busy_share_outside']:.0%} of the turns' time outside the engine "
            "(queued -> inbox row, commit -> sendMessage)"
            + (
                f"; on a core {shares['loop_on_cpu_share']:.0%} of its callbacks' time"
                if "loop_on_cpu_share" in shares
                else ""
            )
        )
    if run.loop_by and answered:
        top = sorted(run.loop_by.items(), key=lambda kv: -kv[1][1])[:12]
        common.print_table(
            "The loop's time by what ran it (task name, or callback), per answered turn",
            ["", "callbacks", "ms", "CPU ms", "longest callback, ms"],
            [
                (
                    name,
                    f"{n / len(answered):.1f}",
                    f"{s * 1e3 / len(answered):.2f}",
                    f"{c * 1e3 / len(answered):.2f}",
                    f"{longest * 1e3:.1f}",
                )
                for name, (n, s, c, longest) in top
            ],
        )
    for err in run.errors[:10]:
        print("  " + err)
    return rows


if __name__ == "__main__":
    main()
