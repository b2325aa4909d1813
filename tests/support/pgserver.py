"""A private PostgreSQL instance for tests that stop and start the database server.

The machine's shared PostgreSQL must never be stopped, so outage tests run their own: initdb in
a temporary folder owned by the `postgres` OS user (initdb refuses to run as root), on a free
port, with its unix socket in that folder; `stop()`/`start()` simulate the outage, `close()`
removes everything. Skips with a reason when the binaries or the `postgres` user are missing
(fails instead under CI=true when the shared server answers: then the binaries should be there).
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest


def _bin_dir() -> Path | None:
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda d: int(d.split("/")[-2]))
    for d in reversed(dirs):
        if Path(d, "initdb").exists() and Path(d, "pg_ctl").exists():
            return Path(d)
    found = shutil.which("pg_ctl")
    return Path(found).parent if found and shutil.which("initdb") else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def unavailable() -> str | None:
    """Why a private server cannot run here, or None."""
    if _bin_dir() is None:
        return "PostgreSQL server binaries (initdb, pg_ctl) not found"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no `postgres` OS user for initdb"
    return None


class PrivatePostgres:
    """initdb + pg_ctl on a free port; `url` is an asyncpg SQLAlchemy URL with a password."""

    def __init__(self, password: str = "pw-Private-Pg-9f3a") -> None:
        why = unavailable()
        if why:
            from tests.support.dbutil import postgres_unavailable

            # CI that has a PostgreSQL server but not its binaries here is misconfigured.
            if os.environ.get("CI", "").lower() == "true" and postgres_unavailable() is None:
                pytest.fail(f"{why} -- required under CI=true when PostgreSQL is installed")
            pytest.skip(why)
        bindir = _bin_dir()
        assert bindir is not None
        self.bindir = bindir
        self.password = password
        self.port = _free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="pgpriv-"))
        self.data = self.dir / "data"
        self.user = "postgres" if os.geteuid() == 0 else None
        if self.user:
            shutil.chown(self.dir, self.user, self.user)
        pwfile = self.dir / "pw"
        pwfile.write_text(password + "\n")
        if self.user:
            shutil.chown(pwfile, self.user, self.user)
        self._run(
            "initdb", "-D", str(self.data), "-U", "bot", "--auth=md5",
            f"--pwfile={pwfile}", "-E", "UTF8", "--no-sync",
        )  # fmt: skip
        self.url = f"postgresql+asyncpg://bot:{password}@127.0.0.1:{self.port}/postgres"
        self.start()

    def _run(self, tool: str, *args: str) -> None:
        cmd = [str(self.bindir / tool), *args]
        if self.user:
            cmd = ["runuser", "-u", self.user, "--", *cmd]
        subprocess.run(cmd, check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        """Start (or restart) the server and wait until it accepts connections."""
        opts = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.dir / "log"), "-o", opts, "-w",
            "-t", "60", "start",
        )  # fmt: skip

    def stop(self, mode: str = "immediate") -> None:
        """Stop the server (immediate: like a crash or a lost network, no goodbye)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def close(self) -> None:
        """Stop if running and delete everything."""
        with contextlib.suppress(subprocess.CalledProcessError):
            self.stop("fast")
        shutil.rmtree(self.dir, ignore_errors=True)

    def wait_down(self, timeout_s: float = 10.0) -> None:
        """Until the port refuses connections."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) != 0:
                    return
            time.sleep(0.05)
        raise AssertionError("private PostgreSQL still answers")


@contextlib.asynccontextmanager
async def private_postgres(**kwargs: str) -> AsyncIterator[PrivatePostgres]:
    """A PrivatePostgres (its `password` if given) for an async test, closed in a thread when
    the block ends."""
    pg = PrivatePostgres(**kwargs)
    try:
        yield pg
    finally:
        await asyncio.to_thread(pg.close)
