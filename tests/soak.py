"""`make soak`: a bounded mixed load on the real `python -m bot run`, with injected faults.

Loopback only: the Bot API is tests/support/fakebotapi.py, the model the tiny one from
tests/support/tinymodel.py,
the database an SQLite file in a temporary folder. Each of `--chats` chats talks in a closed loop
(a message, wait for the answer, think, the next one; within the flood limit) using texts,
commands, stickers and edits, each of which deserves exactly one answer. Every `--fault-every`
seconds one fault is injected, in turn: a 429 storm, 5xx errors, timeouts, 409 conflicts,
Forbidden from one chat, kill -9 and restart, SIGTERM and restart. At the end the load stops,
everything is given time to drain, and the books are checked against the database.

kill -9 lands while sendMessage is failing (a short 5xx window), because a kill while a send that
Telegram accepted is in flight re-sends that one reply after the restart, and no Telegram bot can
close that window (the Bot API has no idempotency key); README, Guarantees.

Ends with `RESULT sent=... answered=... lost=... duplicated=...`; exits 1 unless lost and
duplicated are 0 and the database checks pass.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import shutil
import signal
import sqlite3
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from bot.texts import ENGLISH
from tests.support.botprocess import ROOT, TOKEN, BotProcess, bot_env
from tests.support.fakebotapi import FakeBotAPI, Fault
from tests.support.tinymodel import build_tiny_model

BLOCKED_CHAT = 8999  # blocked the bot: its sends get 403 and are not expected to arrive
FIRST_CHAT = 8001


@dataclass
class Books:
    """What was sent and what came back."""

    sent: Counter[int] = field(default_factory=Counter)  # chat -> messages that need an answer
    dones: Counter[int] = field(default_factory=Counter)  # chat -> /done sent (each may add
    # a rating prompt, once)
    latencies: list[float] = field(default_factory=list)
    faults: list[str] = field(default_factory=list)
    restarts: int = 0
    rss_kb: list[int] = field(default_factory=list)


def rss_kb(pid: int) -> int:
    """Resident memory of a process (0 if unknown)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class Soak:
    """The run: one fake Bot API, one bot process (restarted by faults), many chats."""

    def __init__(self, args: argparse.Namespace, workdir: Path, model: str) -> None:
        self.args = args
        self.workdir = workdir
        self.model = model
        self.rng = random.Random(args.seed)
        self.books = Books()
        self.api = FakeBotAPI(TOKEN)
        self.bot: BotProcess | None = None
        self.stop_load = asyncio.Event()
        self.generation = 0

    def env(self) -> dict[str, str]:
        return bot_env(self.workdir, self.api, self.model, FAULT_GENERATION_DELAY_MS="30",
                       LOG_LEVEL="INFO", SHUTDOWN_GRACE_S="10")  # fmt: skip

    async def start_bot(self) -> None:
        before = len(self.api.calls_to("getUpdates"))
        self.generation += 1
        self.bot = BotProcess(self.env(), self.workdir, self.workdir / f"bot{self.generation}.log")
        deadline = time.monotonic() + 120
        while len(self.api.calls_to("getUpdates")) <= before:
            if self.bot.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"bot did not start:\n{self.bot.output()[-3000:]}")
            await asyncio.sleep(0.05)

    async def chat(self, chat_id: int) -> None:
        """One user: a message, wait for its answer, think, the next message."""
        rng = random.Random(self.args.seed * 1000 + chat_id)
        kinds = ["text"] * 6 + ["persona", "help", "sticker", "edit", "done", "unknown"]
        n = 0
        while not self.stop_load.is_set():
            kind = rng.choice(kinds)
            n += 1
            if kind == "text":
                self.api.user_message(chat_id, f"hello how are you {n}")
            elif kind == "persona":
                self.api.user_message(chat_id, f"/persona my name is sarah {n}. i love dogs.")
            elif kind == "help":
                self.api.user_message(chat_id, "/help")
            elif kind == "sticker":
                sticker = {"file_id": "x", "file_unique_id": "y", "width": 512, "height": 512,
                           "is_animated": False, "is_video": False, "type": "regular"}  # fmt: skip
                self.api.user_message(chat_id, None, extra={"sticker": sticker})
            elif kind == "edit":
                self.api.user_message(chat_id, f"edited {n}", kind="edited_message")
            elif kind == "done":
                self.api.user_message(chat_id, "/done")
                self.books.dones[chat_id] += 1
            else:
                self.api.user_message(chat_id, "/nosuchcommand")
            self.books.sent[chat_id] += 1
            asked = time.monotonic()
            want = self.books.sent[chat_id]
            while self.answers(chat_id) < want:
                if self.stop_load.is_set() and time.monotonic() - asked > 5:
                    return  # drained at the end
                await asyncio.sleep(0.05)
            self.books.latencies.append(time.monotonic() - asked)
            # Think: keeps every chat well inside the flood limit (12 per 10 s by default).
            await asyncio.sleep(rng.uniform(1.0, 3.0))

    async def inject(self) -> None:
        """One fault every `fault_every` seconds, in turn."""
        cycle = ["429", "kill9", "5xx", "timeout", "sigterm", "409", "forbidden"]
        i = 0
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop_load.wait(), self.args.fault_every)
                return  # a fault in progress (a restart) is always finished first
            fault = cycle[i % len(cycle)]
            i += 1
            self.books.faults.append(fault)
            print(f"[{time.strftime('%H:%M:%S')}] fault: {fault}", flush=True)
            if fault == "429":
                self.api.inject(Fault("sendMessage", status=429, retry_after=2, times=15))
            elif fault == "5xx":
                self.api.inject(Fault("sendMessage", status=502, times=8),
                                Fault("getUpdates", status=500, times=3))  # fmt: skip
            elif fault == "timeout":
                self.api.inject(Fault("sendMessage", status=504, delay=20.0, times=3))
            elif fault == "409":
                self.api.inject(Fault("getUpdates", status=409, times=4))
            elif fault == "forbidden":
                self.api.inject(Fault("sendMessage", status=403, chat_id=BLOCKED_CHAT, times=50))
                self.api.user_message(BLOCKED_CHAT, "hello")
            elif fault in ("kill9", "sigterm"):
                await self.restart(kill=fault == "kill9")

    async def restart(self, kill: bool) -> None:
        assert self.bot is not None
        if kill:
            # Keep the kill out of the one window nobody can close (see the module docstring).
            block = Fault("sendMessage", status=503, times=10**6)
            self.api.inject(block)
            await asyncio.sleep(0.5)
            self.bot.proc.send_signal(signal.SIGKILL)
            await self.bot.wait(30)
            self.bot.kill()
            self.api.faults.remove(block)
        else:
            self.bot.proc.send_signal(signal.SIGTERM)
            status = await self.bot.wait(60)
            self.bot.kill()
            if status != 0:
                raise RuntimeError(f"SIGTERM exit status {status}")
        self.books.restarts += 1
        await self.start_bot()

    async def watch_memory(self) -> None:
        while not self.stop_load.is_set():
            if self.bot is not None and self.bot.proc.poll() is None:
                self.books.rss_kb.append(rss_kb(self.bot.proc.pid))
            await asyncio.sleep(2.0)

    async def run(self) -> int:
        await self.api.start()
        try:
            await self.start_bot()
            started = time.monotonic()
            chats = [asyncio.create_task(self.chat(FIRST_CHAT + i)) for i in range(self.args.chats)]
            side = [asyncio.create_task(self.inject()), asyncio.create_task(self.watch_memory())]
            await asyncio.sleep(self.args.duration)
            self.stop_load.set()
            print(f"[{time.strftime('%H:%M:%S')}] load stopped; draining", flush=True)
            await asyncio.gather(*side)
            self.api.faults.clear()
            await asyncio.gather(*chats)
            await self.drain()
            assert self.bot is not None
            self.bot.proc.send_signal(signal.SIGTERM)
            status = await self.bot.wait(60)
            self.bot.kill()
            elapsed = time.monotonic() - started
        finally:
            if self.bot is not None:
                self.bot.kill()
            await self.api.stop()
        return self.report(status, elapsed)

    async def drain(self) -> None:
        """Wait (bounded) until every chat got as many answers as it sent messages."""
        deadline = time.monotonic() + self.args.drain
        while time.monotonic() < deadline:
            if all(self.answers(c) >= n for c, n in self.books.sent.items()):
                break
            await asyncio.sleep(0.2)
        await asyncio.sleep(2.0)  # let a duplicate show up, if there is one

    def answers(self, chat_id: int) -> int:
        """Texts a chat got, one per message it sent: the 1-5 rating prompt that follows the
        answer to a /done is an extra, not an answer (counted apart in the report)."""
        return sum(1 for t in self.api.texts(chat_id) if t != ENGLISH.RATE_PROMPT)

    def report(self, status: int, elapsed: float) -> int:
        received = Counter(s.chat_id for s in self.api.sent if s.text != ENGLISH.RATE_PROMPT)
        prompts = sum(1 for s in self.api.sent if s.text == ENGLISH.RATE_PROMPT)
        per_chat = Counter(s.chat_id for s in self.api.sent if s.text == ENGLISH.RATE_PROMPT)
        sent = sum(self.books.sent.values())
        answered = sum(min(received[c], n) for c, n in self.books.sent.items())
        lost = sum(max(0, n - received[c]) for c, n in self.books.sent.items())
        duplicated = sum(max(0, received[c] - n) for c, n in self.books.sent.items())
        problems = self.check_database()
        if received[BLOCKED_CHAT]:
            problems.append(f"{received[BLOCKED_CHAT]} texts reached the chat that blocked us")
        if status != 0:
            problems.append(f"final SIGTERM exit status {status}")
        logs = "".join(p.read_text(errors="replace") for p in sorted(self.workdir.glob("bot*.log")))
        if TOKEN.split(":")[1] in logs:
            problems.append("the token appears in the logs")
        lat = sorted(self.books.latencies) or [0.0]
        print(f"duration {elapsed:.0f}s, chats {self.args.chats}, faults {self.books.faults}, "
              f"restarts {self.books.restarts}")  # fmt: skip
        print(f"answer latency p50={statistics.median(lat) * 1000:.0f} ms "
              f"p95={lat[int(0.95 * (len(lat) - 1))] * 1000:.0f} ms "
              f"max={lat[-1] * 1000:.0f} ms")  # fmt: skip
        if self.books.rss_kb:
            print(f"bot RSS: first {self.books.rss_kb[0] // 1024} MiB, "
                  f"max {max(self.books.rss_kb) // 1024} MiB, "
                  f"last {self.books.rss_kb[-1] // 1024} MiB")  # fmt: skip
        print(
            f"sendMessage calls {len(self.api.calls_to('sendMessage'))}, "
            f"faulted {sum(1 for c in self.api.calls_to('sendMessage') if c.status != 200)}"
        )
        print(f"rating prompts after /done: {prompts}")
        for chat, n in per_chat.items():
            if n > self.books.dones[chat]:
                problems.append(
                    f"chat {chat}: {n} rating prompts for {self.books.dones[chat]} /done"
                )
        for problem in problems:
            print(f"PROBLEM: {problem}")
        print(f"RESULT sent={sent} answered={answered} lost={lost} duplicated={duplicated}",
              flush=True)  # fmt: skip
        return 0 if lost == 0 and duplicated == 0 and not problems else 1

    def check_database(self) -> list[str]:
        problems: list[str] = []
        with sqlite3.connect(self.workdir / "bot.sqlite3") as conn:

            def one(sql: str) -> object:
                return conn.execute(sql).fetchone()[0]

            if (ok := one("PRAGMA integrity_check")) != "ok":
                problems.append(f"integrity_check: {ok}")
            checks = {
                "pending inbox rows": "SELECT count(*) FROM inbox WHERE status = 'pending'",
                "failed inbox rows": "SELECT count(*) FROM inbox WHERE status = 'failed'",
                "unsent outbox rows": "SELECT count(*) FROM outbox "
                f"WHERE sent_at IS NULL AND chat_id <> {BLOCKED_CHAT}",
                # (the rating prompt after /done answers no update: its update_id is NULL)
                "updates answered twice": "SELECT count(*) FROM (SELECT update_id FROM outbox "
                "WHERE update_id IS NOT NULL GROUP BY update_id HAVING count(*) > 1)",
                "user messages stored twice": "SELECT count(*) FROM (SELECT update_id FROM "
                "messages WHERE role = 'user' GROUP BY update_id HAVING count(*) > 1)",
                "replies without their message": "SELECT count(*) FROM outbox o LEFT JOIN "
                "messages m ON m.id = o.message_id WHERE o.kind = 'reply' AND m.id IS NULL",
            }
            for what, sql in checks.items():
                if (n := one(sql)) != 0:
                    problems.append(f"{what}: {n}")
        return problems


def main() -> int:
    """Parse arguments, build the tiny model, run the soak; the exit status is the verdict."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--duration", type=float, default=180.0, help="seconds of load")
    parser.add_argument("--chats", type=int, default=25)
    parser.add_argument("--fault-every", type=float, default=20.0, help="seconds")
    parser.add_argument("--drain", type=float, default=120.0, help="seconds to wait at the end")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    os.chdir(ROOT)
    workdir = Path(tempfile.mkdtemp(prefix="soak-"))
    print("building the tiny model ...", flush=True)
    model = build_tiny_model(workdir / "model")
    status = 1
    try:
        status = asyncio.run(Soak(args, workdir, model).run())
    finally:
        if status == 0:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"logs and database kept in {workdir}", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
