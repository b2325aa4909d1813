"""`python -m bench.modelserver` (`make bench-modelserver`): front-ends sharing one Ray model
deployment, against front-ends that each carry their own model worker.

Two runs of the same load on the same machine, each on a private PostgreSQL database (the
machine's server, TEST_DATABASE_URL) with 3 front-ends (`python -m bot run`, started as
bench.scaleout starts its replicas, from the systemd unit) talking to the loopback Bot API
(polling by default: no nginx needed; `--mode webhook` puts bench.scaleout's nginx in front):

- **local**: MODEL_BACKEND=local, each front-end with its own model worker process;
- **shared**: MODEL_BACKEND=ray, the front-ends joining (RAY_ADDRESS) one Ray instance that this
  bench starts in a holder process (`ray.init(num_cpus=2)`, its GCS, raylet and workers
  are the holder's process tree), where the first front-end deploys the variant's Serve
  application (`--ray-replicas` replicas) and the others join it. Mid-load one Ray replica
  (a `ray::ServeReplica` process) is SIGKILLed: its turns are sent again to the other replica.

`--chats` chats send their next message as soon as the last one is answered, for `--phase`
seconds after a warm-up: replies/s, and the p50/p95 of a message's wait for its answer. Total
RSS is summed over the front-ends' process trees (their model workers included), plus, for
shared, the holder's tree (Ray's own processes, the replicas included; the holder is a Python
process with Ray imported, which a `ray start --head` would not need: counted all the same).
The model is the tiny test model, so generation is cheap: the RSS difference is what each
model process costs beyond its weights, and what Ray costs.

Prints `RESULT lost=0 duplicated=0` (the shared run, with the kill), `RESULT rss_mb_shared=...
rss_mb_local=...`, `RESULT replies_per_s_shared=... replies_per_s_local=...` and the
latencies; exits 1 when anything was lost or duplicated. `--quick` for a smoke run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.common import percentile, print_table, write_json
from bench.scaleout import (
    FIRST_CHAT,
    PG_URL,
    ROOT,
    Books,
    Nginx,
    Replica,
    Run,
    create_database,
    drop_database,
    unit_command,
)
from tests.support.botprocess import free_port
from tests.support.tinymodel import build_tiny_model

VARIANT = "shared"
# The holder: a new local Ray instance ("local": never one that `ray start` left on this host),
# stopped when its stdin closes.
HOLDER = """
import sys, ray
ray.init(address="local", num_cpus=int(sys.argv[1]), include_dashboard=False)
print(ray.get_runtime_context().gcs_address, flush=True)
sys.stdin.read()
ray.shutdown()
"""


@dataclass
class Figures:
    """One run's measurements."""

    mode: str
    replies_per_s: float
    p50_ms: float
    p95_ms: float
    rss_mb: float
    front_end_mb: float = 0.0  # one front-end process alone (its children not counted)
    sent: int = 0
    lost: int = 0
    duplicated: int = 0
    lost_turns_retried: int = 0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--mode", choices=["polling", "webhook"], default="polling")
    parser.add_argument("--chats", type=int, default=30)
    parser.add_argument("--phase", type=float, default=30.0, help="seconds of measured load")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds of load before it")
    parser.add_argument(
        "--settle", type=float, default=15.0, help="seconds of load after the replica kill"
    )
    parser.add_argument("--ray-replicas", type=int, default=2)
    parser.add_argument("--ray-cpus", type=int, default=2, help="the Ray instance's CPUs")
    parser.add_argument("--drain-s", type=float, default=90.0)
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="a smoke run (about 4 minutes)")
    parser.add_argument("--keep", action="store_true", help="keep the logs folder")
    args = parser.parse_args(argv)
    if args.ray_replicas < 2:
        parser.error("--ray-replicas must be at least 2 (one is killed mid-load)")
    if args.quick:
        args.chats, args.phase, args.warmup, args.settle = 12, 12.0, 3.0, 8.0
    return args


def latencies_ms(books: Books, since: float, until: float) -> list[float]:
    """Each message sent in [since, until) and answered: how long it waited, in ms."""
    out = []
    for chat, messages in books.sent.items():
        for n, (_, sent_at) in enumerate(messages, start=1):
            answered = books.answered_at.get((chat, n))
            if answered is not None and since <= sent_at < until:
                out.append((answered - sent_at) * 1000.0)
    return out


def own_rss_mb(pids: Iterable[int]) -> float:
    """The mean RSS of the processes `pids` themselves (MiB)."""
    import psutil

    sizes = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            sizes.append(psutil.Process(pid).memory_info().rss)
    return sum(sizes) / len(sizes) / 2**20 if sizes else 0.0


def tree_rss_mb(pids: Iterable[int]) -> float:
    """The RSS of the processes `pids` and all their descendants, each counted once (MiB)."""
    import psutil

    seen: dict[int, int] = {}
    for pid in pids:
        try:
            root = psutil.Process(pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        for proc in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                seen.setdefault(proc.pid, proc.memory_info().rss)
    return sum(seen.values()) / 2**20


def serve_replicas(holder_pid: int) -> list[int]:
    """The pids of the Serve replicas in the holder's tree."""
    import psutil

    found = []
    for proc in psutil.Process(holder_pid).children(recursive=True):
        try:
            if "ServeReplica" in " ".join(proc.cmdline()):
                found.append(proc.pid)
        except psutil.NoSuchProcess:
            pass
    return found


def counted(books: Books, received: Counter[int]) -> tuple[int, int, int]:
    """(sent, lost, duplicated): messages sent, with no reply, with more than one."""
    sent = sum(len(m) for m in books.sent.values())
    lost = sum(max(0, len(m) - received[c]) for c, m in books.sent.items())
    duplicated = sum(max(0, received[c] - len(m)) for c, m in books.sent.items())
    return sent, lost, duplicated


def result_lines(local: Figures, shared: Figures) -> list[str]:
    """The RESULT lines: the kill run's losses, then each figure for shared and local."""
    lines = [f"RESULT lost={shared.lost} duplicated={shared.duplicated}"]
    for name in ("rss_mb", "front_end_mb", "replies_per_s", "p50_ms", "p95_ms"):
        a, b = getattr(shared, name), getattr(local, name)
        lines.append(f"RESULT {name}_shared={a:.1f} {name}_local={b:.1f}")
    lines.append(f"RESULT ray_turns_retried={shared.lost_turns_retried}")
    return lines


class Holder:
    """The Ray instance the front-ends join: ray.init in a child process of this one."""

    def __init__(self, workdir: Path, cpus: int) -> None:
        # Ray's token authentication, with a token of this run's own: the front-ends get it as
        # RAY_AUTH_TOKEN_PATH (~/.ray/auth_token is shared by whoever runs Ray on this host).
        token = workdir / "ray-auth-token"
        token.write_text(secrets.token_hex(32))
        token.chmod(0o600)
        self.auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
        env = {**os.environ, **self.auth, "PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0"}
        self.log = (workdir / "ray-holder.log").open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(cpus)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            env=env,
            cwd=workdir,
        )
        assert self.proc.stdout is not None
        self.address = self.proc.stdout.readline().decode().strip()
        if not self.address:
            raise SystemExit(f"the Ray holder did not start: see {self.log.name}")

    def stop(self) -> None:
        import psutil

        try:
            tree = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            tree = []
        if self.proc.stdin is not None:
            self.proc.stdin.close()  # ray.shutdown() in the holder
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        for proc in tree:  # whatever Ray left running
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()


class ModeRun(Run):
    """bench.scaleout's load and books, with 3 front-ends of one kind."""

    def __init__(
        self,
        args: argparse.Namespace,
        workdir: Path,
        model: str,
        db_url: str,
        mode: str,
        env: dict[str, str],
    ) -> None:
        super().__init__(args, workdir / mode, model, db_url)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.mode = mode
        self.extra_env = env

    def base_env(self) -> dict[str, str]:
        return {**super().base_env(), **self.extra_env}

    async def measure(self, holder: Holder | None) -> Figures:
        await self.api.start()
        self.nginx_port = free_port()
        if self.args.mode == "webhook":
            ports = [int(unit_command(i)[1].get("WEBHOOK_PORT", "0")) for i in (1, 2, 3)]
            self.nginx = Nginx(self.workdir, self.nginx_port, ports)
        base = self.base_env()
        self.replicas = [Replica(i, base, self.workdir) for i in (1, 2, 3)]
        ledger = asyncio.create_task(self.ledger())
        chats: list[asyncio.Task[None]] = []
        try:
            for replica in self.replicas:  # the first deploys, the others join
                await self.start_replica(replica, timeout_s=600.0)
            print(f"[{time.strftime('%H:%M:%S')}] {self.mode}: 3 front-ends up", flush=True)
            self.think = False
            chats = [asyncio.create_task(self.chat(FIRST_CHAT + i)) for i in range(self.args.chats)]
            await asyncio.sleep(self.args.warmup)
            before, started = self.replies(), time.monotonic()
            await asyncio.sleep(self.args.phase)
            ended = time.monotonic()
            rate = (self.replies() - before) / (ended - started)
            pids = [r.proc.pid for r in self.replicas if r.proc is not None]
            rss = tree_rss_mb([*pids, *([holder.proc.pid] if holder else [])])
            front_end = own_rss_mb(pids)
            waits = latencies_ms(self.books, started, ended)
            print(
                f"[{time.strftime('%H:%M:%S')}] {self.mode}: {rate:.2f} replies/s, "
                f"RSS {rss:.0f} MiB (a front-end alone {front_end:.0f} MiB)",
                flush=True,
            )
            if holder is not None:
                victims = serve_replicas(holder.proc.pid)
                if not victims:
                    raise SystemExit("no ray::ServeReplica process found to kill")
                print(f"[{time.strftime('%H:%M:%S')}] SIGKILL Ray replica {victims[0]}", flush=True)
                os.kill(victims[0], signal.SIGKILL)
                await asyncio.sleep(self.args.settle)
            self.stop_chats.set()
            await self.drain()
            for task in chats:
                task.cancel()
            await asyncio.gather(*chats, return_exceptions=True)
            retried = sum(
                r.log.read_text(errors="replace").count("replica lost") for r in self.replicas
            )
            await self.stop_replicas()
        finally:
            await self.tear_down(ledger)
        sent, lost, duplicated = counted(self.books, Counter(s.chat_id for s in self.api.sent))
        return Figures(
            self.mode,
            round(rate, 2),
            round(percentile(waits, 50), 1),
            round(percentile(waits, 95), 1),
            round(rss, 1),
            round(front_end, 1),
            sent,
            lost,
            duplicated,
            retried,
        )


async def one_run(
    args: argparse.Namespace, workdir: Path, model: str, mode: str, variants: Path
) -> Figures:
    db_url = await create_database()
    holder: Holder | None = None
    env = {"VARIANTS_FILE": str(variants), "MODEL_BACKEND": "local"}
    try:
        if mode == "shared":
            holder = Holder(workdir, args.ray_cpus)
            env.update(MODEL_BACKEND="ray", RAY_ADDRESS=holder.address, **holder.auth)
            print(f"Ray instance at {holder.address}", flush=True)
        return await ModeRun(args, workdir, model, db_url, mode, env).measure(holder)
    finally:
        if holder is not None:
            holder.stop()
        await drop_database(db_url)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    os.chdir(ROOT)
    workdir = Path(tempfile.mkdtemp(prefix="modelserver-"))
    print(f"building the tiny model; logs in {workdir}; database server {PG_URL}", flush=True)
    model = build_tiny_model(workdir / "model")
    variants = workdir / "variants.toml"
    variants.write_text(
        f'[[variants]]\nname = "{VARIANT}"\nmodel = "{model}"\n'
        f"replicas = {args.ray_replicas}\nnum_cpus = {args.ray_cpus / args.ray_replicas:g}\n"
    )
    local = asyncio.run(one_run(args, workdir, model, "local", variants))
    shared = asyncio.run(one_run(args, workdir, model, "shared", variants))
    headers = ["front-ends", "replies/s", "p50 ms", "p95 ms", "RSS MiB", "front-end MiB"]
    headers += ["lost", "duplicated"]
    columns = ("mode", "replies_per_s", "p50_ms", "p95_ms", "rss_mb", "front_end_mb")
    columns += ("lost", "duplicated")
    rows = [[getattr(f, c) for c in columns] for f in (local, shared)]
    print_table(
        f"3 front-ends, {args.chats} chats, {os.cpu_count()} cores ({args.mode})", headers, rows
    )
    write_json("modelserver", {"args": vars(args), "local": vars(local), "shared": vars(shared)})
    for line in result_lines(local, shared):
        print(line, flush=True)
    ok = shared.lost == shared.duplicated == local.lost == local.duplicated == 0
    if ok and not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        print(f"logs kept in {workdir}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
