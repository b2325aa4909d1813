"""End to end: the real `python -m bot run` process, many users talking at once.

    python -m bench.e2e --users 50 --messages 5 [--quick]

A loopback Bot API server (tests/support/fakebotapi.py) plays Telegram; the bot polls it
with its real
settings, an SQLite database of its own and the BlenderBot-90M-architecture model (20-token
replies; greedy by default so that the run stays short: the service's own overhead is the point
here, `--decoding beam` for Blender's beam settings). Every user sets a persona, then sends
`--messages` messages, each after the reply to the previous one arrived (people wait for
answers), all users at once.

Latency = from queuing the update on the server to the server receiving the bot's sendMessage.
Model time = messages.latency_ms of the bot's row (Engine.respond: cache lookup or rebuild,
waiting for a batch, generation). Overhead = latency - model time: polling, the inbox, the
per-chat sequencer, the database transactions, the outbox and delivery.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import common

TOKEN = "123456789:AAbenchmarkTokenForTheLoopbackApi0001"
START_TIMEOUT_S = 180.0
FIRST_CHAT = 5000


@dataclass
class Turn:
    """One user message and its reply."""

    chat_id: int
    index: int
    sent_at: float
    latency_ms: float | None = None
    model_ms: float | None = None
    text: str | None = None


@dataclass
class Run:
    """Everything measured."""

    turns: list[Turn] = field(default_factory=list)
    wall_s: float = 0.0
    model_ms: dict[tuple[int, int], float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    pending_inbox: int = 0
    unsent_outbox: int = 0


def _missing() -> str | None:
    """Why the end-to-end benchmark cannot run yet, or None."""
    if not (common.ROOT / "tests" / "support" / "fakebotapi.py").exists():
        return "tests/support/fakebotapi.py (the loopback Bot API server) does not exist yet"
    if not (common.ROOT / "bot" / "tg" / "app.py").exists():
        return "bot/tg/app.py (`python -m bot run`) does not exist yet"
    return None


def bot_env(tmp: Path, base_url: str, model_file: str, args: argparse.Namespace) -> dict[str, str]:
    """The bot's environment: only what a deployment would set."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", str(tmp)),
        "PYTHONPATH": str(common.ROOT),
        "TELEGRAM_BOT_TOKEN": TOKEN,
        "TELEGRAM_BASE_URL": base_url,
        "DATABASE_URL": f"sqlite+aiosqlite:///{tmp / 'bot.sqlite3'}",
        "BOT_MODEL": model_file,
        "DATA_DIR": str(tmp / "data"),
        "MODEL_DEVICE": "cpu",
        "LOG_LEVEL": args.log_level,
        "SHUTDOWN_GRACE_S": "30",
        "INFERENCE": args.decoding,
    }
    if args.decoding == "greedy":
        env["BEAM_SIZE"] = "1"
    if args.threads:
        env["TORCH_THREADS"] = str(args.threads)
    return env


class Replies:
    """Counts what the server receives per chat and wakes the waiting user: no busy polling,
    which would steal CPU from the bot on a small machine."""

    def __init__(self, api: Any) -> None:
        self.api = api
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
                await asyncio.wait_for(event.wait(), remaining)
            except TimeoutError:
                return False
        return True


async def _user(
    replies: Replies, chat_id: int, user: int, messages: int, run: Run, wait_s: float
) -> None:
    """Persona first (not measured), then `messages` turns, each after the previous reply."""
    api = replies.api
    api.user_message(chat_id, "/persona " + common.persona(user))
    if not await replies.wait(chat_id, 1, wait_s):
        run.errors.append(f"chat {chat_id}: no answer to /persona")
        return
    for k in range(messages):
        text = common.user_message(user, k)
        turn = Turn(chat_id, k, time.time())
        run.turns.append(turn)
        api.user_message(chat_id, text)
        if not await replies.wait(chat_id, k + 2, wait_s):
            run.errors.append(f"chat {chat_id}: no reply to message {k + 1}")
            return
        turn.latency_ms = (replies.sent_at[chat_id][k + 1] - turn.sent_at) * 1000
        turn.text = replies.texts[chat_id][k + 1]


def _read_db(path: Path, run: Run, chats: set[int]) -> None:
    with sqlite3.connect(path) as conn:
        rows = conn.execute(
            "SELECT chat_id, latency_ms FROM messages WHERE role = 'bot' ORDER BY chat_id, id"
        ).fetchall()
        run.pending_inbox = conn.execute(
            "SELECT count(*) FROM inbox WHERE status = 'pending'"
        ).fetchone()[0]
        run.unsent_outbox = conn.execute(
            "SELECT count(*) FROM outbox WHERE sent_at IS NULL"
        ).fetchone()[0]
    seen: dict[int, int] = {}
    for chat_id, latency in rows:
        if chat_id in chats and latency is not None:
            k = seen.get(chat_id, 0)
            seen[chat_id] = k + 1
            run.model_ms[(chat_id, k)] = float(latency)


async def session(args: argparse.Namespace, model_file: str, tmp: Path) -> Run:
    """Start the server and the bot, run the users, stop the bot, read its database."""
    from tests.support.fakebotapi import FakeBotAPI

    run = Run()
    common.corpus()  # load the message texts before anything is timed
    async with FakeBotAPI(TOKEN) as api:
        replies = Replies(api)
        env = bot_env(tmp, api.base_url, model_file, args)
        log = (tmp / "bot.log").open("wb")
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bot",
            "run",
            cwd=common.ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while not api.calls_to("getUpdates"):
                if proc.returncode is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        "the bot did not start:\n" + (tmp / "bot.log").read_text()[-3000:]
                    )
                await asyncio.sleep(0.05)
            # warm-up chat: the first generation pays lazy initialisation
            warm = FIRST_CHAT - 1
            api.user_message(warm, "hello there")
            if not await replies.wait(warm, 1, args.timeout):
                raise RuntimeError("no reply to the warm-up message")
            chats = [FIRST_CHAT + u for u in range(args.users)]
            started = time.perf_counter()
            await asyncio.gather(
                *(
                    _user(replies, chat, u, args.messages, run, args.timeout)
                    for u, chat in enumerate(chats)
                )
            )
            run.wall_s = time.perf_counter() - started
            proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(proc.wait(), 120)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            log.close()
    _read_db(tmp / "bot.sqlite3", run, set(chats))
    for turn in run.turns:
        turn.model_ms = run.model_ms.get((turn.chat_id, turn.index))
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
        "--quick", action="store_true", help="3 users, 2 messages, greedy, 1 torch thread"
    )
    args = parser.parse_args()
    if args.quick:
        args.users, args.messages, args.decoding = 3, 2, "greedy"
        args.threads = args.threads or 1  # a smoke run must not depend on an idle machine
    missing = _missing()
    if missing is not None:
        print(f"e2e: cannot run: {missing}")
        common.emit_results({"lost": float("nan")})
        sys.exit(2)

    model_file = common.build_bench_model()
    print(
        f"e2e: `python -m bot run` against the loopback Bot API, {args.users} users x "
        f"{args.messages} messages, decoding {args.decoding}, {common.REPLY_TOKENS}-token replies",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="bench-e2e-") as tmp_dir:
        try:
            run = asyncio.run(session(args, model_file, Path(tmp_dir)))
        finally:
            if args.keep_log is not None:
                shutil.copyfile(Path(tmp_dir) / "bot.log", args.keep_log)

    expected = args.users * args.messages
    answered = [t for t in run.turns if t.latency_ms is not None]
    latencies = [t.latency_ms for t in answered if t.latency_ms is not None]
    overheads = [
        t.latency_ms - run.model_ms[(t.chat_id, t.index)]
        for t in answered
        if t.latency_ms is not None and (t.chat_id, t.index) in run.model_ms
    ]
    model = [
        run.model_ms[(t.chat_id, t.index)] for t in answered if (t.chat_id, t.index) in run.model_ms
    ]
    lost = expected - len(answered)
    sorry = sum(1 for t in answered if (t.text or "").startswith("Sorry"))
    rows = [
        ("reply latency", common.percentile(latencies, 50), common.percentile(latencies, 95)),
        ("model time (latency_ms)", common.percentile(model, 50), common.percentile(model, 95)),
        ("service overhead", common.percentile(overheads, 50), common.percentile(overheads, 95)),
    ]
    common.print_table(
        f"End to end, {args.users} users x {args.messages} messages (ms)",
        ["", "p50", "p95"],
        rows,
    )
    rate = len(answered) / run.wall_s if run.wall_s else 0.0
    print(
        f"{len(answered)}/{expected} replies in {run.wall_s:.1f} s = {rate:.2f} replies/s; "
        f"lost {lost}; error replies {sorry}; pending inbox {run.pending_inbox}, "
        f"unsent outbox {run.unsent_outbox}"
    )
    for err in run.errors[:10]:
        print("  " + err)
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
            "latency_ms": {"p50": rows[0][1], "p95": rows[0][2]},
            "model_ms": {"p50": rows[1][1], "p95": rows[1][2]},
            "overhead_ms": {"p50": rows[2][1], "p95": rows[2][2]},
            "pending_inbox": run.pending_inbox,
            "unsent_outbox": run.unsent_outbox,
            "errors": run.errors,
            "turns": [t.__dict__ for t in run.turns],
            "quick": args.quick,
        },
    )
    fig, axes = common.new_figure(ncols=2, width=5.0)
    axes[0][0].hist([latencies, model], bins=30, label=["reply latency", "model time"])
    axes[0][0].set_xlabel("ms")
    axes[0][0].set_ylabel("replies")
    axes[0][0].set_title(f"{args.users} users x {args.messages} messages")
    axes[0][0].legend()
    axes[0][1].hist(overheads, bins=30, color="tab:green")
    axes[0][1].set_xlabel("latency - model time (ms)")
    axes[0][1].set_title(f"service overhead, p50 {rows[2][1]:.1f} ms")
    common.save_figure("e2e", fig)
    common.emit_results(
        {
            "latency_ms_p50": rows[0][1],
            "latency_ms_p95": rows[0][2],
            "replies_per_s": rate,
            "overhead_ms_p50": rows[2][1],
            "overhead_ms_p95": rows[2][2],
            "lost": float(lost),
        }
    )


if __name__ == "__main__":
    main()
