"""`python -m bench.scaleout` (`make scaleout`): replicas on PostgreSQL behind nginx, with kills.

A private database on the machine's PostgreSQL (TEST_DATABASE_URL's server), nginx with
deploy/nginx/telegram-bot.conf, and replicas started from deploy/systemd/telegram-bot@.service
(its Environment=, per-replica EnvironmentFile= and ExecStart= lines; paths point at this
checkout, and DATA_DIR at a temporary folder) in webhook mode. The loopback Bot API
(tests/support/fakebotapi.py) posts every update to nginx, as Telegram would post to the
public URL. The model is the tiny test model: this measures the service around it, not
generation.

1. Throughput with 1, 2 and 3 replicas: `--chats` chats that send their next message as soon
   as the last one is answered, `--phase` seconds per replica count: replies/s.
2. Faults with 3 replicas: the chats talk like people (1-3 s between messages), one replica
   is killed with SIGKILL mid-load and restarted `--down` seconds later, then another one is
   stopped with SIGTERM and restarted.

Ends with `RESULT sent=N answered=N lost=0 duplicated=0 order_violations=0 takeover_s=...`:
takeover_s is the longest a chat whose lease the killed replica held waited for its answer,
counted from the kill (or from its message, if that came later); `others_s` is the same for
the chats the survivors held, the wait that is not the takeover's (a saturated machine's queue),
and `fences` counts the times a replica fenced itself (its heartbeats did not land for
0.6 x TAKEOVER_AFTER_S). `--background-load N` keeps N busy processes at normal priority
running all along, as other jobs on the same cores would. `--mode polling` runs the
same kill test without nginx: every replica polls for the lease of getUpdates, and the elected
poller is the one killed (`poll_gap_s`: from the kill to the next getUpdates by a survivor).
Exits 1 when anything was lost, duplicated or out of order.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy.engine import make_url

from bench.common import emit_results, markdown_table, print_table, write_json
from tests.support.botprocess import SECRET, TOKEN, free_port
from tests.support.fakebotapi import FakeBotAPI
from tests.support.tinymodel import build_tiny_model

ROOT = Path(__file__).resolve().parents[1]
UNIT = ROOT / "deploy" / "systemd" / "telegram-bot@.service"
REPLICA_ENV = ROOT / "deploy" / "systemd" / "replica-env"
NGINX_SITE = ROOT / "deploy" / "nginx" / "telegram-bot.conf"
PG_URL = os.environ.get("TEST_DATABASE_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/test")
WEBHOOK_PATH = "/telegram/webhook"
FIRST_CHAT = 20_001


# --- the deployment files, really used ------------------------------------------------------


def unit_command(index: int) -> tuple[list[str], dict[str, str]]:
    """The replica's command line and settings from the systemd unit, with %i: its
    Environment= lines, and its per-replica EnvironmentFile= (the ports) as
    deploy/systemd/replica-env writes it. The shared bot.env is the caller's (`base_env`)."""
    env: dict[str, str] = {}
    command: list[str] = []
    for line in UNIT.read_text().splitlines():
        line = line.strip().replace("%i", str(index))
        if line.startswith("Environment="):
            key, _, value = line.removeprefix("Environment=").partition("=")
            env[key] = value
        elif line.startswith("EnvironmentFile=") and line.endswith(f"replica-{index}.env"):
            written = subprocess.run(
                [str(REPLICA_ENV), str(index)], capture_output=True, text=True, check=True
            ).stdout
            for setting in written.splitlines():
                key, _, value = setting.partition("=")
                env[key] = value
        elif line.startswith("ExecStart="):
            command = line.removeprefix("ExecStart=").split()
    if not command:
        raise SystemExit(f"{UNIT} has no ExecStart= line")
    # /opt/telegram-bot/.venv/bin/python -> this interpreter (the checkout's venv).
    command[0] = sys.executable
    return command, env


def nginx_site(listen: int, replica_ports: list[int]) -> str:
    """deploy/nginx/telegram-bot.conf with our listen port and replica ports."""
    text = NGINX_SITE.read_text()
    servers = re.findall(r"^\s*server 127\.0\.0\.1:\d+ (.*);$", text, flags=re.M)
    if not servers:
        raise SystemExit(f"{NGINX_SITE}: no `server 127.0.0.1:PORT ...;` lines in the upstream")
    options = servers[0]
    lines = "".join(f"    server 127.0.0.1:{p} {options};\n" for p in replica_ports)
    text = re.sub(r"(?:^\s*server 127\.0\.0\.1:\d+ .*;\n)+", lines, text, flags=re.M)
    return re.sub(r"listen \d+;", f"listen 127.0.0.1:{listen};", text)


def find_nginx() -> str:
    """The nginx binary; installed with apt-get (Debian's package) when missing and we may."""
    for candidate in (shutil.which("nginx"), "/usr/sbin/nginx"):
        if candidate and Path(candidate).exists():
            return candidate
    if os.geteuid() == 0 and shutil.which("apt-get"):
        print("nginx is missing: installing Debian's package (apt-get install nginx)", flush=True)
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
        subprocess.run(["apt-get", "install", "-y", "-qq", "nginx"], check=True, env=env)
        return "/usr/sbin/nginx"
    raise SystemExit("nginx is not installed: `sudo apt-get install nginx`, then run this again")


class Nginx:
    """nginx in the foreground with a private prefix (no root, no system config touched)."""

    def __init__(self, workdir: Path, listen: int, replica_ports: list[int]) -> None:
        self.prefix = workdir / "nginx"
        (self.prefix / "logs").mkdir(parents=True, exist_ok=True)
        (self.prefix / "site.conf").write_text(nginx_site(listen, replica_ports))
        (self.prefix / "nginx.conf").write_text(
            "worker_processes 1;\n"
            "daemon off;\n"
            f"pid {self.prefix}/nginx.pid;\n"
            f"error_log {self.prefix}/logs/error.log warn;\n"
            "events { worker_connections 1024; }\n"
            "http {\n"
            f"  access_log {self.prefix}/logs/access.log;\n"
            f"  client_body_temp_path {self.prefix}/body;\n"
            f"  proxy_temp_path {self.prefix}/proxy;\n"
            f"  include {self.prefix}/site.conf;\n"
            "}\n"
        )
        self.proc = subprocess.Popen(
            [find_nginx(), "-p", str(self.prefix), "-c", str(self.prefix / "nginx.conf")],
            stdout=subprocess.DEVNULL,
            stderr=(self.prefix / "logs" / "stderr.log").open("wb"),
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
        if self.proc.poll() is None:
            self.proc.kill()


# --- the database ---------------------------------------------------------------------------


async def _admin(sql: str) -> None:
    import asyncpg

    url = make_url(PG_URL).set(drivername="postgresql")
    conn = await asyncpg.connect(url.render_as_string(hide_password=False))
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


async def create_database() -> str:
    """A private database on the PostgreSQL server; its SQLAlchemy URL."""
    name = f"scaleout_{uuid.uuid4().hex[:10]}"
    try:
        await _admin(f'CREATE DATABASE "{name}"')
    except Exception as err:
        shown = make_url(PG_URL).render_as_string(hide_password=True)
        raise SystemExit(
            f"no PostgreSQL at {shown} ({err}); set TEST_DATABASE_URL to a server where this "
            "user may create databases"
        ) from err
    return make_url(PG_URL).set(database=name).render_as_string(hide_password=False)


async def drop_database(url: str) -> None:
    await _admin(f'DROP DATABASE IF EXISTS "{make_url(url).database}" WITH (FORCE)')


async def query(url: str, sql: str) -> list[tuple[object, ...]]:
    import asyncpg

    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    conn = await asyncpg.connect(dsn)
    try:
        return [tuple(r) for r in await conn.fetch(sql)]
    finally:
        await conn.close()


# --- replicas -------------------------------------------------------------------------------


class Replica:
    """One `python -m bot run` started the way the systemd unit starts it."""

    def __init__(self, index: int, base_env: dict[str, str], workdir: Path) -> None:
        self.index = index
        self.command, unit_env = unit_command(index)
        self.env = {**base_env, **unit_env}
        # The unit's StateDirectory (%S/telegram-bot), its DATA_DIR and HOME.
        self.env["DATA_DIR"] = self.env["HOME"] = str(workdir / f"data{index}")
        Path(self.env["DATA_DIR"]).mkdir(parents=True, exist_ok=True)
        self.port = int(self.env.get("WEBHOOK_PORT", "0"))
        self.log = workdir / f"replica{index}.log"
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        out = self.log.open("ab")
        out.write(f"\n--- start {self.starts} ---\n".encode())
        out.flush()
        # cwd: the unit's WorkingDirectory holds no .env; neither does this folder.
        self.proc = subprocess.Popen(
            self.command, cwd=self.workdir, env=self.env, stdout=out, stderr=subprocess.STDOUT
        )

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.running:
            assert self.proc is not None
            self.proc.send_signal(sig)

    async def wait(self, timeout_s: float) -> int | None:
        deadline = time.monotonic() + timeout_s
        while self.proc is not None and self.proc.poll() is None:
            if time.monotonic() > deadline:
                return None
            await asyncio.sleep(0.05)
        return self.proc.returncode if self.proc is not None else None

    def kill(self) -> None:
        if self.running:
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait(10)


# --- the load -------------------------------------------------------------------------------


@dataclass
class Books:
    sent: dict[int, list[tuple[str, float]]] = field(default_factory=lambda: defaultdict(list))
    answered_at: dict[tuple[int, int], float] = field(default_factory=dict)  # (chat, n) -> t


class Run:
    def __init__(self, args: argparse.Namespace, workdir: Path, model: str, db_url: str) -> None:
        self.args = args
        self.workdir = workdir
        self.model = model
        self.db_url = db_url
        self.api = FakeBotAPI(TOKEN)
        self.books = Books()
        self.think = True
        self.stop_chats = asyncio.Event()
        self.replicas: list[Replica] = []
        self.nginx: Nginx | None = None
        self.rng = random.Random(args.seed)
        self.answer_count: Counter[int] = Counter()
        self.arrived: dict[int, asyncio.Event] = {}
        # name -> (chats whose leases a replica held, when it was killed or stopped)
        self.windows: dict[str, tuple[set[int], float]] = {}

    def base_env(self) -> dict[str, str]:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": os.environ.get("HOME", str(self.workdir)),
            "PYTHONPATH": str(ROOT),
            "TELEGRAM_BOT_TOKEN": TOKEN,
            "TELEGRAM_BASE_URL": self.api.base_url,
            "DATABASE_URL": self.db_url,
            "BOT_MODEL": self.model,
            "MODEL_DEVICE": "cpu",
            "TORCH_THREADS": "1",
            "LOG_LEVEL": "INFO",
            "SHUTDOWN_GRACE_S": "10",
            "FEEDBACK_BUTTONS": "false",
            # The throughput phases send each chat's next message at once: more than a person
            # may (12 per 10 s), which the flood gate would rightly hold back.
            "FLOOD_MAX_MESSAGES": "100000",
        }
        if self.args.mode == "webhook":
            env["WEBHOOK_URL"] = f"http://127.0.0.1:{self.nginx_port}{WEBHOOK_PATH}"
            env["WEBHOOK_SECRET"] = SECRET
        return env

    async def start_replica(self, replica: Replica, timeout_s: float = 120.0) -> None:
        """Start it and wait until it is serving (its heartbeat row says so)."""
        replica.start()
        assert replica.proc is not None
        deadline = time.monotonic() + timeout_s
        while True:
            rows = await query(
                self.db_url, f"SELECT count(*) FROM replicas WHERE pid = {replica.proc.pid}"
            ) if await self._has_schema() else [(0,)]  # fmt: skip
            if rows[0][0]:
                return
            if not replica.running or time.monotonic() > deadline:
                tail = replica.log.read_text(errors="replace")[-3000:]
                raise SystemExit(f"replica {replica.index} did not start:\n{tail}")
            await asyncio.sleep(0.2)

    async def _has_schema(self) -> bool:
        rows = await query(self.db_url, "SELECT to_regclass('public.replicas') IS NOT NULL")
        return bool(rows[0][0])

    def answers(self, chat_id: int) -> int:
        return self.answer_count[chat_id]

    async def ledger(self) -> None:
        """Count the bot's messages per chat as they arrive (only the new ones each tick: the
        fake Bot API shares this process, and rescanning every message for every chat would
        eat the CPU the replicas need)."""
        seen = 0
        while True:
            new = self.api.sent[seen:]
            seen += len(new)
            for sent in new:
                self.answer_count[sent.chat_id] += 1
                self.arrived.setdefault(sent.chat_id, asyncio.Event()).set()
            await asyncio.sleep(0.01)

    async def chat(self, chat_id: int) -> None:
        rng = random.Random(self.args.seed * 100_000 + chat_id)
        arrived = self.arrived.setdefault(chat_id, asyncio.Event())
        n = 0
        while not self.stop_chats.is_set():
            n += 1
            text = f"hello number {n} how are you"
            self.api.user_message(chat_id, text)
            self.books.sent[chat_id].append((text, time.monotonic()))
            while True:
                arrived.clear()  # then the check: the ledger cannot run in between
                if self.answers(chat_id) >= n:
                    break
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1.0):
                        await arrived.wait()
            self.books.answered_at[(chat_id, n)] = time.monotonic()
            if self.think:
                await asyncio.sleep(rng.uniform(1.0, 3.0))

    def waited_outside(self, chats: set[int], since: float) -> float:
        """The same as waited_after for every chat not in `chats`: what the kill did not cause."""
        return self.waited_after(set(self.books.sent) - chats, since)

    def replies(self) -> int:
        return len(self.api.sent)

    async def throughput(self, count: int) -> float:
        """Replies/s with `count` replicas running, chats without think time."""
        self.think = False
        await asyncio.sleep(3.0)  # settle after a start
        before, started = self.replies(), time.monotonic()
        await asyncio.sleep(self.args.phase)
        rate = (self.replies() - before) / (time.monotonic() - started)
        print(f"[{time.strftime('%H:%M:%S')}] {count} replicas: {rate:.1f} replies/s", flush=True)
        return rate

    async def lease_chats(self, pid: int) -> set[int]:
        rows = await query(
            self.db_url,
            "SELECT l.chat_id FROM chat_leases l JOIN replicas r ON r.owner = l.owner "
            f"WHERE r.pid = {pid} AND l.kind IN ('inbox', 'outbox')",
        )
        return {int(r[0]) for r in rows}  # type: ignore[call-overload]

    async def poller_pid(self) -> int | None:
        rows = await query(
            self.db_url,
            "SELECT r.pid FROM chat_leases l JOIN replicas r ON r.owner = l.owner "
            "WHERE l.kind = 'poller'",
        )
        return int(rows[0][0]) if rows else None  # type: ignore[call-overload]

    def waited_after(self, chats: set[int], since: float) -> float:
        """The longest any of `chats` waited for an answer after `since` (the kill)."""
        worst = 0.0
        for chat in chats:
            for n, (_, sent_at) in enumerate(self.books.sent.get(chat, []), start=1):
                answered = self.books.answered_at.get((chat, n))
                if answered is None or answered < since:
                    continue
                worst = max(worst, answered - max(sent_at, since))
                break  # the first answer after the kill is the takeover
        return worst

    async def run(self) -> int:
        await self.api.start()
        ports = []
        for i in (1, 2, 3):
            _, env = unit_command(i)
            ports.append(int(env.get("WEBHOOK_PORT", "0")))
        self.nginx_port = free_port()
        if self.args.mode == "webhook":
            self.nginx = Nginx(self.workdir, self.nginx_port, ports)
        base = self.base_env()
        self.replicas = [Replica(i, base, self.workdir) for i in (1, 2, 3)]
        results: dict[str, float] = {}
        chats: list[asyncio.Task[None]] = []
        ledger = asyncio.create_task(self.ledger())
        try:
            await self.start_replica(self.replicas[0])
            chats = [asyncio.create_task(self.chat(FIRST_CHAT + i)) for i in range(self.args.chats)]
            rates = {1: await self.throughput(1)}
            await self.start_replica(self.replicas[1])
            rates[2] = await self.throughput(2)
            await self.start_replica(self.replicas[2])
            rates[3] = await self.throughput(3)
            for count, rate in rates.items():
                results[f"replies_per_s_{count}_replicas"] = round(rate, 2)
            results.update(await self.faults())
            self.stop_chats.set()
            await self.drain()
            for task in chats:
                task.cancel()
            await asyncio.gather(*chats, return_exceptions=True)
            await self.stop_replicas()
        finally:
            await self.tear_down(ledger)
        return await self.report(results, rates)

    async def stop_replicas(self) -> None:
        """SIGTERM every replica, then kill what has not stopped within a minute."""
        for replica in self.replicas:
            replica.signal(signal.SIGTERM)
        for replica in self.replicas:
            if await replica.wait(60) is None:
                replica.kill()

    async def tear_down(self, ledger: asyncio.Task[None]) -> None:
        """Whatever happened: no replica, nginx or Bot API left running."""
        ledger.cancel()
        for replica in self.replicas:
            replica.kill()
        if self.nginx is not None:
            self.nginx.stop()
        await self.api.stop()

    async def faults(self) -> dict[str, float]:
        """SIGKILL one replica mid-load (the poller in polling mode), restart it; then SIGTERM
        another and restart it. Chats talk like people meanwhile."""
        self.think = True
        out: dict[str, float] = {}
        await asyncio.sleep(self.args.settle)
        if self.args.mode == "polling":
            pid = await self.poller_pid()
            victim = next(r for r in self.replicas if r.proc is not None and r.proc.pid == pid)
        else:
            victim = self.replicas[1]
        assert victim.proc is not None
        held = await self.lease_chats(victim.proc.pid)
        polls_before = len(self.api.calls_to("getUpdates"))
        print(f"[{time.strftime('%H:%M:%S')}] SIGKILL replica {victim.index} "
              f"(holds leases of {len(held)} chats)", flush=True)  # fmt: skip
        killed_at = time.monotonic()
        victim.signal(signal.SIGKILL)
        await victim.wait(10)
        held |= await self.lease_chats(victim.proc.pid)  # leases it took while dying
        if self.args.mode == "polling":
            out["poll_gap_s"] = round(await self.poll_gap(killed_at, polls_before), 2)
        await asyncio.sleep(self.args.down)
        self.windows["takeover_s"] = (held, killed_at)
        self.killed = (set(held), time.time() - (time.monotonic() - killed_at))
        out["killed_replica_chats"] = len(held)
        print(f"[{time.strftime('%H:%M:%S')}] restart replica {victim.index}", flush=True)
        await self.start_replica(victim)
        await asyncio.sleep(self.args.settle)
        other = self.replicas[2] if victim is not self.replicas[2] else self.replicas[0]
        assert other.proc is not None
        held = await self.lease_chats(other.proc.pid)
        print(f"[{time.strftime('%H:%M:%S')}] SIGTERM replica {other.index}", flush=True)
        stopped_at = time.monotonic()
        other.signal(signal.SIGTERM)
        status = await other.wait(60)
        out["sigterm_exit_status"] = float(-1 if status is None else status)
        out["sigterm_stop_s"] = round(time.monotonic() - stopped_at, 2)
        await asyncio.sleep(self.args.down)
        self.windows["handover_s"] = (held, stopped_at)
        await self.start_replica(other)
        await asyncio.sleep(self.args.settle)
        return out

    async def poll_gap(self, killed_at: float, before: int) -> float:
        """Seconds from the kill to the first getUpdates that came after it (a survivor's)."""
        deadline = killed_at + 60
        while time.monotonic() < deadline:
            calls = self.api.calls_to("getUpdates")[before:]
            if any(c.status == 200 for c in calls):
                return time.monotonic() - killed_at
            await asyncio.sleep(0.05)
        return float("inf")

    async def drain(self) -> None:
        deadline = time.monotonic() + max(self.args.drain_s, 0)
        while time.monotonic() < deadline:
            if all(self.answers(c) >= len(m) for c, m in self.books.sent.items()):
                break
            await asyncio.sleep(0.2)
        await asyncio.sleep(2.0)  # a duplicate would show up now

    def explain_duplicate(self, chat: int) -> None:
        """Say which chat got more replies than it sent messages, and whether it was one of the
        killed replica's: a send Telegram accepted that the killed replica had no time to record
        is re-sent by its successor (docs/guarantees.md, what no Telegram bot can promise)."""
        held, killed_at = getattr(self, "killed", (set(), 0.0))
        sends = [s.at for s in self.api.sent if s.chat_id == chat]
        whose = "one of the killed replica's chats" if chat in held else "not a killed chat"
        # Each send's time from the SIGKILL: a copy accepted just before the kill and another
        # after the takeover is the window; two copies far from the kill are a real bug.
        when = ", ".join(f"{at - killed_at:+.2f} s" for at in sends) if killed_at else "?"
        print(
            f"duplicate: chat {chat} ({whose}) got {len(sends)} replies to "
            f"{len(self.books.sent[chat])} messages, sent at {when} from the SIGKILL",
            flush=True,
        )

    async def report(self, results: dict[str, float], rates: dict[int, float]) -> int:
        sent = sum(len(m) for m in self.books.sent.values())
        received = Counter(s.chat_id for s in self.api.sent)
        answered = sum(min(received[c], len(m)) for c, m in self.books.sent.items())
        lost = sum(max(0, len(m) - received[c]) for c, m in self.books.sent.items())
        duplicated = sum(max(0, received[c] - len(m)) for c, m in self.books.sent.items())
        for chat, messages in self.books.sent.items():
            if received[chat] > len(messages):
                self.explain_duplicate(chat)
        violations = 0
        for chat, messages in self.books.sent.items():
            # The echo of each message names it: the answers must come in the order sent. The
            # tiny model's reply does not, so order is checked on the stored turns instead.
            violations += await self.order_violations(chat, [t for t, _ in messages])
        problems = []
        for replica in self.replicas:
            log = replica.log.read_text(errors="replace")
            if TOKEN.split(":")[1] in log or SECRET in log:
                problems.append(f"replica {replica.index}: a secret appears in its log")
            if "Traceback" in log:
                problems.append(f"replica {replica.index}: a traceback in its log")
        for name, (chats, since) in self.windows.items():
            results[name] = round(self.waited_after(chats, since), 2)
        if "takeover_s" in self.windows:
            results["others_s"] = round(self.waited_outside(*self.windows["takeover_s"]), 2)
        results["fences"] = sum(
            r.log.read_text(errors="replace").count("stopping work on every chat")
            for r in self.replicas
        )
        results.update(
            sent=sent,
            answered=answered,
            lost=lost,
            duplicated=duplicated,
            order_violations=violations,
        )
        print_table(
            f"Throughput by replica count ({self.args.mode}, {self.args.chats} chats, "
            f"{os.cpu_count()} cores, background load {self.args.background_load})",
            ["replicas", "replies/s"],
            [(n, f"{r:.1f}") for n, r in rates.items()],
        )
        print(
            markdown_table(["replicas", "replies/s"], [(n, f"{r:.1f}") for n, r in rates.items()])
        )
        for problem in problems:
            print(f"PROBLEM: {problem}")
        write_json(f"scaleout-{self.args.mode}", {"args": vars(self.args), "results": results})
        head = [
            "sent",
            "answered",
            "lost",
            "duplicated",
            "order_violations",
            "takeover_s",
            "others_s",
        ]
        line = " ".join(f"{k}={results[k]:g}" for k in head if k in results)
        print(f"RESULT {line}", flush=True)
        emit_results({k: v for k, v in results.items() if k not in head})
        ok = lost == 0 and duplicated == 0 and violations == 0 and not problems
        return 0 if ok else 1

    async def order_violations(self, chat_id: int, texts: list[str]) -> int:
        """User messages stored out of the order they were sent in (over every session)."""
        rows = await query(
            self.db_url,
            f"SELECT text FROM messages WHERE chat_id = {chat_id} AND role = 'user' ORDER BY id",
        )
        stored = [str(r[0]) for r in rows]
        if stored != texts[: len(stored)]:
            return sum(1 for a, b in zip(stored, texts, strict=False) if a != b) or 1
        return 0


def background_load(count: int) -> list[subprocess.Popen[bytes]]:
    """`count` processes that only burn CPU, at the priority everything else has."""
    spin = "while True: pass"
    return [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(count)]


def main() -> int:
    """Parse arguments, set everything up, run; the exit status is the verdict."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--mode", choices=["webhook", "polling"], default="webhook")
    parser.add_argument("--chats", type=int, default=60)
    parser.add_argument("--phase", type=float, default=30.0, help="seconds per replica count")
    parser.add_argument("--settle", type=float, default=20.0, help="seconds of load around faults")
    parser.add_argument(
        "--down", type=float, default=15.0, help="seconds a killed replica stays down"
    )
    parser.add_argument("--drain-s", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument(
        "--background-load",
        type=int,
        default=0,
        metavar="N",
        help="N busy processes at normal priority all along (other jobs on the same cores)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the logs folder")
    args = parser.parse_args()
    os.chdir(ROOT)
    workdir = Path(tempfile.mkdtemp(prefix="scaleout-"))
    print(f"building the tiny model; logs in {workdir}", flush=True)
    model = build_tiny_model(workdir / "model")
    db_url = asyncio.run(create_database())
    shown = make_url(db_url).render_as_string(hide_password=True)
    print(f"database {shown}; mode {args.mode}", flush=True)
    status = 1
    load = background_load(args.background_load)
    try:
        status = asyncio.run(Run(args, workdir, model, db_url).run())
    finally:
        for proc in load:
            proc.kill()
            proc.wait()
        asyncio.run(drop_database(db_url))
        if status == 0 and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"logs kept in {workdir}", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
