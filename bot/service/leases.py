"""Chat leases: which process works on a chat's inbox rows, and which one sends its outbox rows.

Several `python -m bot run` processes may share one database (a second instance started by
mistake with the same token, or docs/replicas.md). Every process scans the same inbox and
outbox, so without a claim two of them would answer one update, or send one reply, twice. A
lease is a row (chat_id, kind) -> (owner, lease_until): taking it is one INSERT whose conflict
becomes a conditional UPDATE, returning the row only to the winner, which both SQLite (writers
are serialised) and PostgreSQL (the row lock re-checks the WHERE) decide atomically. A lease per
chat, not per row, also keeps a chat's order across processes.

A holder renews its leases in the background and before each row it works on; a crashed
holder's leases expire after `ttl_s`, are taken over as soon as its replica's heartbeat is stale
(bot/service/heartbeat.py: a few seconds, wherever it ran), or at once when the owner is a
process of this machine and PID namespace that no longer runs (a restart after kill -9 need not
wait). A replica whose own heartbeats stop landing fences itself: its leases read as lost until
they do again. Lease expiry, like the heartbeats, is the database's clock: the replicas' clocks need
not agree. What this process remembers of its leases runs on its monotonic clock.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bot.db import leases, replicas
from bot.service.heartbeat import HOST, PID_NAMESPACE, Heartbeat, new_owner
from bot.tasks import cancel_and_wait

log = logging.getLogger(__name__)

# Long enough that a slow generation or a short database hiccup never loses a lease that is
# being renewed; short enough that a crashed replica's chats are taken over within a minute.
LEASE_TTL_S = 60.0
# A finished worker keeps its chat's lease this long, so a chat's next message (they come in
# bursts) costs no database write to take it again; another process waits at most this long.
LINGER_S = 1.0
# Leases due to be given back within this long of each other go in one statement: the chats
# of a model batch end together (a burst), and a statement each was a session a turn per kind.
RELEASE_GATHER_S = 0.2


def _dead_here(owner: str) -> bool:
    """Whether `owner` is a process of this machine and PID namespace that has exited.

    Anything else (another machine, another container, an owner name of an older version)
    is judged by its lease's expiry alone.
    """
    try:
        name, namespace, pid_text, _ = owner.rsplit(":", 3)
        pid = int(pid_text)
    except ValueError:
        return False
    if name != HOST or namespace != PID_NAMESPACE or pid == os.getpid():
        return False
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            # A killed but not yet reaped process is a zombie: it holds nothing any more.
            return f.read().rpartition(")")[2].split()[0] == "Z"
    except FileNotFoundError:
        return True
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


class Leases:
    """This process's leases of one kind ("inbox" or "outbox")."""

    def __init__(
        self,
        sessionmaker: async_sessionmaker[AsyncSession],
        kind: str,
        *,
        owner: str | None = None,
        ttl_s: float = LEASE_TTL_S,
        linger_s: float = LINGER_S,
        heartbeat: Heartbeat | None = None,
        on_takeover: Callable[[str], None] | None = None,
    ) -> None:
        self.sessionmaker = sessionmaker
        self.kind = kind
        self.owner = owner or new_owner()
        self.ttl_s = ttl_s
        self.linger_s = linger_s
        # This replica's heartbeat (None: a bare Leases, as in some tests): a stale peer's
        # leases are taken over, and ours read as lost while our own heartbeats fail.
        # Every fence bumps heartbeat.epoch; _trusted() then forgets what we remember.
        self.heartbeat = heartbeat
        self.on_takeover = on_takeover  # called with the kind, e.g. to count takeovers
        self._held: dict[int, float] = {}  # chat_id -> monotonic time the lease runs out
        # chat_id -> the lease_until we wrote: a late release deletes only that lease, never
        # one taken again meanwhile.
        self._written: dict[int, datetime] = {}
        self._releases: dict[int, asyncio.TimerHandle] = {}
        # Due to be given back (chat -> the lease_until we wrote) by the task gathering them.
        self._to_give_back: dict[int, datetime] = {}
        self._gathering: asyncio.Task[None] | None = None
        self._releasing: set[asyncio.Task[None]] = set()
        self._keeper: asyncio.Task[None] | None = None
        self._epoch = heartbeat.epoch if heartbeat is not None else 0  # see _trusted()

    @property
    def held(self) -> frozenset[int]:
        """Chats whose lease this process holds."""
        return frozenset(self._held)

    def holds(self, chat_id: int) -> bool:
        """Whether this process holds the chat's lease, as far as it knows (no database)."""
        return chat_id in self._held

    def _forget_all(self) -> None:
        """Fenced: trust none of our leases any more; the next acquire() asks the database."""
        self._held.clear()
        self._written.clear()

    def forget(self, chat_id: int) -> None:
        """The chat's lease turned out to be another process's (a turn's commit said so): ask
        the database next time instead of trusting what we remember."""
        self._held.pop(chat_id, None)
        self._written.pop(chat_id, None)

    def _trusted(self) -> bool:
        """Whether what we remember may be used: not fenced now, and no fence since we last
        looked (a fence forgets every lease, also one won while it happened)."""
        if self.heartbeat is None:
            return True
        alive = self.heartbeat.alive  # may fence now, which bumps the epoch
        if self.heartbeat.epoch != self._epoch:
            self._epoch = self.heartbeat.epoch
            self._forget_all()
        return alive

    async def acquire(self, chat_id: int) -> bool:
        """Take or renew the chat's lease; False if another live process holds it, or while
        this replica is fenced (its heartbeats do not reach the database)."""
        timer = self._releases.pop(chat_id, None)
        if timer is not None:
            timer.cancel()
        if not self._trusted():
            return False
        runs_out = self._held.get(chat_id)
        if runs_out is not None and runs_out - time.monotonic() > self.ttl_s / 2:
            return True
        started = time.monotonic()
        epoch = self._epoch
        async with self.sessionmaker.begin() as db:
            written = await self._take(db, chat_id)
        if not self._trusted() or self._epoch != epoch:
            return False  # fenced while we asked: what the database said may be stale already
        if written is not None:
            self._held[chat_id] = started + self.ttl_s
            self._written[chat_id] = written
        else:
            self._held.pop(chat_id, None)
            self._written.pop(chat_id, None)
        return written is not None

    async def _take(self, db: AsyncSession, chat_id: int) -> datetime | None:
        """The lease_until we wrote, if the lease is ours now."""
        written = await leases.take(db, chat_id, self.kind, self.owner, self.ttl_s)
        if written is not None:
            return written
        holder = await leases.holder(db, chat_id, self.kind)
        if holder is None:
            return None
        if _dead_here(holder):
            why = "exited"
        elif self.heartbeat is not None and await replicas.is_dead(
            db, holder, self.heartbeat.dead_after_s
        ):
            why = f"no heartbeat for {self.heartbeat.dead_after_s:.0f}s"
        else:
            return None
        written = await leases.take_from(db, chat_id, self.kind, self.owner, holder, self.ttl_s)
        if written is not None:
            log.info(
                "took over the %s lease of chat %s from %s (%s)", self.kind, chat_id, holder, why
            )
            if self.on_takeover is not None:
                self.on_takeover(self.kind)
        return written

    async def release(self, chat_id: int) -> None:
        """The chat's work is done: give its lease back after `linger_s` unless taken again."""
        if chat_id not in self._held or chat_id in self._releases:
            return
        loop = asyncio.get_running_loop()
        self._releases[chat_id] = loop.call_later(self.linger_s, self._release_soon, chat_id)

    def _release_soon(self, chat_id: int) -> None:
        self._releases.pop(chat_id, None)
        # Forget the lease now, not when it is given back: an acquire() in between must go to
        # the database (where it renews the row, so the delete then matches nothing) instead
        # of trusting a lease that is about to be deleted.
        self._held.pop(chat_id, None)
        written = self._written.pop(chat_id, None)
        if written is None:
            return
        self._to_give_back[chat_id] = written
        if self._gathering is None:
            task = asyncio.create_task(self._give_back_gathered(), name=f"release:{self.kind}")
            self._gathering = task
            self._releasing.add(task)
            task.add_done_callback(self._releasing.discard)

    async def _give_back_gathered(self) -> None:
        """After RELEASE_GATHER_S, give back in one statement every lease due by then."""
        try:
            await asyncio.sleep(RELEASE_GATHER_S)
        finally:
            self._gathering = None
        due, self._to_give_back = self._to_give_back, {}
        await self._give_back(due)

    async def _release_now(self, chat_id: int, written: datetime | None) -> None:
        """Delete the lease row we wrote (best effort: if this fails, the lease expires)."""
        if written is not None:
            await self._give_back({chat_id: written})

    async def _give_back(self, written: dict[int, datetime]) -> None:
        """Delete the lease rows we wrote (best effort: if this fails, they expire)."""
        if not written:
            return
        try:
            async with self.sessionmaker.begin() as db:
                await leases.give_back_many(db, written, self.kind, self.owner)
        except Exception as err:  # noqa: BLE001 - the lease runs out by itself
            log.warning(
                "giving back the %s leases of %d chats failed: %s", self.kind, len(written), err
            )

    async def renew_all(self) -> None:
        """Push back the expiry of every lease this process holds (one statement)."""
        if not self._held:
            return
        if not self._trusted():
            return
        started = time.monotonic()
        chats = list(self._held)
        async with self.sessionmaker.begin() as db:
            renewed = await leases.renew(db, chats, self.kind, self.owner, self.ttl_s)
        for chat_id in chats:
            if chat_id not in renewed:
                # Taken over meanwhile (our lease had run out): the next acquire() must ask
                # the database instead of trusting a lease we no longer hold.
                if chat_id in self._held:
                    log.warning(
                        "lost the %s lease of chat %s to another process", self.kind, chat_id
                    )
                self._held.pop(chat_id, None)
                self._written.pop(chat_id, None)
            elif chat_id in self._held:
                self._held[chat_id] = started + self.ttl_s
                self._written[chat_id] = renewed[chat_id]
            else:
                # Released while this renewal ran: that release deleted nothing (the row's
                # expiry had just changed), so give back the renewed row now.
                await self._release_now(chat_id, renewed[chat_id])

    def start(self) -> None:
        """Renew held leases in the background every quarter of the TTL."""
        if self._keeper is None:
            self._keeper = asyncio.create_task(self._keep(), name=f"leases:{self.kind}")

    async def stop(self) -> None:
        """Stop renewing and give back every lease now (call when no worker runs any more)."""
        await cancel_and_wait(self._keeper)
        self._keeper = None
        for timer in self._releases.values():
            timer.cancel()
        self._releases.clear()
        await asyncio.gather(*self._releasing, return_exceptions=True)  # (within 0.2 s)
        left = self._to_give_back
        left.update((c, self._written[c]) for c in self._held if c in self._written)
        self._to_give_back = {}
        self._held.clear()
        self._written.clear()
        await self._give_back(left)

    async def _keep(self) -> None:
        while True:
            await asyncio.sleep(self.ttl_s / 4)
            try:
                await self.renew_all()
            except Exception as err:  # noqa: BLE001 - acquire() renews before each row anyway
                log.warning("renewing %s leases failed: %s", self.kind, err)
