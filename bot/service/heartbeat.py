"""Replica heartbeats: liveness from the database, and fencing.

Every replica (a `python -m bot run` process) writes its row in `replicas` before it takes any
lease, and pushes its `heartbeat_at` forward every `interval_s`. Another replica treats a
heartbeat older than `dead_after_s` as a dead process, wherever it ran (kill -9, a lost
machine, a container restarted with the same host name and PID) and takes over its leases at
once, instead of waiting for their TTL (bot/service/leases.py).

Heartbeats are written with the database's clock and their age is judged by it too
(bot/db/replicas.py), so the replicas' own clocks never meet: a replica whose clock is off
neither looks dead nor judges the others dead early.

Fencing: a replica that has not written a heartbeat for `fence_after_s` (< `dead_after_s`)
stops working on its chats: its leases read as lost (`alive` is False), so it takes no new row,
sends nothing more, and asks the database again before it goes on. Others may only start after
`dead_after_s`, by the database's clock from a heartbeat written after the moment our fence
counts from, so the two never overlap (clocks may disagree; they only need to tick alike). On
top of that, a turn's commit re-checks the inbox lease in its own transaction
(bot/db/inbox.finish), so a replica that was paused (SIGSTOP, a long GC) cannot commit a turn
for a chat that was taken over meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bot.db import replicas
from bot.tasks import cancel_and_wait

log = logging.getLogger(__name__)

# Who this process is, for its heartbeat row and its leases' owner names.
HOST = socket.gethostname()


def _pid_namespace() -> str:
    """This process's PID namespace (its inode), or "-" where there is no /proc (one
    namespace per machine, as on macOS)."""
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return "-"


PID_NAMESPACE = _pid_namespace()


def new_owner() -> str:
    """A process-unique owner name: host, PID namespace, pid and a random part (several
    services per process in tests).

    A PID means a process only within its PID namespace: containers that share a host name
    (host networking) each number their processes from 1.
    """
    return f"{HOST}:{PID_NAMESPACE}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


# A peer is taken over this long after its last heartbeat (TAKEOVER_AFTER_S); it beats five
# times in that time and fences itself after three missed fifths.
DEFAULT_DEAD_AFTER_S = 5.0
# Rows of replicas silent this long are deleted by whichever replica notices.
PRUNE_AFTER_S = 3600.0

InfoSource = Callable[[], Awaitable[dict[str, Any]]]
AliveSink = Callable[[int], None]


class Heartbeat:
    """This replica's row in `replicas`: written at start, beaten, removed at a clean stop."""

    def __init__(
        self,
        sessionmaker: async_sessionmaker[AsyncSession],
        owner: str,
        *,
        dead_after_s: float = DEFAULT_DEAD_AFTER_S,
        info: InfoSource | None = None,
        info_every_s: float = 5.0,
        on_alive: AliveSink | None = None,
    ) -> None:
        self.sessionmaker = sessionmaker
        self.owner = owner
        self.dead_after_s = dead_after_s
        self.interval_s = dead_after_s / 5
        self.fence_after_s = dead_after_s * 0.6
        self._info_source = info
        self._info_every_s = info_every_s
        self._info_text: str | None = None  # the newest status, until a heartbeat writes it
        self._info_task: asyncio.Task[None] | None = None
        # Told the number of live replicas after every heartbeat (the send budget's share).
        self.on_alive = on_alive
        self._last_ok: float | None = None  # monotonic start of the last heartbeat that landed
        self._fenced = False
        # Bumped at every fence: a lease won in an older epoch is not to be trusted any more
        # (bot/service/leases.py), whichever way the fence was noticed.
        self.epoch = 0
        self._task: asyncio.Task[None] | None = None

    @property
    def alive(self) -> bool:
        """Whether this replica may work: its last heartbeat landed less than fence_after_s ago
        (measured from before that write began)."""
        if self._last_ok is None:
            return False
        alive = time.monotonic() - self._last_ok < self.fence_after_s
        if not alive and not self._fenced:
            self._fence()
        return alive

    def _fence(self) -> None:
        self._fenced = True
        self.epoch += 1
        log.error(
            "no heartbeat reached the database for %.1fs: stopping work on every chat until it "
            "does (other replicas take them over after %.1fs)",
            self.fence_after_s,
            self.dead_after_s,
        )

    async def start(self) -> None:
        """Write this replica's row (retried by the caller's start-up if the database is down),
        then beat in the background."""
        started = time.monotonic()
        async with self.sessionmaker.begin() as db:
            await replicas.register(db, self.owner, HOST, os.getpid(), "{}")
        self._last_ok = started
        self._task = asyncio.create_task(self._run(), name="heartbeat")
        if self._info_source is not None:
            self._info_task = asyncio.create_task(self._refresh_info(), name="replica-status")

    async def stop(self) -> None:
        """Stop beating and remove the row (call after the leases were given back)."""
        await cancel_and_wait(self._task, self._info_task)
        self._task = self._info_task = None
        try:
            async with self.sessionmaker.begin() as db:
                await replicas.remove(db, self.owner)
        except Exception as err:  # noqa: BLE001 - the row just goes stale, as after a crash
            log.warning("removing this replica's heartbeat row failed: %s", err)

    def pause(self) -> None:
        """Stop beating, keeping the row and the time of the last beat that landed, as when no
        heartbeat reaches the database: this replica fences itself after fence_after_s and the
        others judge it dead after dead_after_s (a drill of a database partition). `beat()`
        lands one again; `stop()` still removes the row."""
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def beat(self) -> None:
        """One heartbeat now (the background loop calls this every interval_s)."""
        started = time.monotonic()
        if self._last_ok is not None and started - self._last_ok >= self.fence_after_s:
            # Nothing looked at `alive` while we were away (the event loop stalled: SIGSTOP, a
            # paused VM, a long GC): the fence is due before this heartbeat may lift it.
            _ = self.alive
        info, self._info_text = self._info_text, None
        async with self.sessionmaker.begin() as db:
            if not await replicas.beat(db, self.owner, info):
                # Pruned by a peer while we were away far too long: write it again.
                await replicas.register(db, self.owner, HOST, os.getpid(), info or "{}")
            alive = await replicas.alive(db, self.dead_after_s) if self.on_alive else None
        self._last_ok = started
        if self._fenced:
            self._fenced = False
            log.warning("heartbeats reach the database again: back to work")
        if self.on_alive is not None and alive is not None:
            self.on_alive(alive)

    async def prune(self) -> None:
        """Delete rows of replicas silent for PRUNE_AFTER_S."""
        async with self.sessionmaker.begin() as db:
            gone = await replicas.prune(db, PRUNE_AFTER_S)
        if gone:
            log.info("forgot %d replicas silent for over %.0fs", gone, PRUNE_AFTER_S)

    async def _refresh_info(self) -> None:
        """Collect this replica's status every info_every_s for the next heartbeat to write
        (apart from the heartbeat, which must never wait for a slow model worker)."""
        assert self._info_source is not None
        while True:
            try:
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for returned a result that
                # came back as the task was cancelled and dropped the cancellation, and stop()
                # then waited for this loop forever.
                async with asyncio.timeout(self._info_every_s):
                    status = await self._info_source()
                self._info_text = json.dumps(status, default=str)
            except Exception as err:  # noqa: BLE001 - the heartbeat matters more than the report
                log.warning("collecting this replica's status failed: %s", err)
            await asyncio.sleep(self._info_every_s)

    async def _run(self) -> None:
        beats = 0
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                # A database that hangs is as bad as one that is down: fence in time anyway.
                async with asyncio.timeout(self.fence_after_s):
                    await self.beat()
            except Exception as err:  # noqa: BLE001 - retried at the next interval
                log.warning("heartbeat failed: %s", err)
                _ = self.alive  # fences once fence_after_s has passed
            beats += 1
            if beats % 600 == 1:
                with contextlib.suppress(Exception):
                    await self.prune()
