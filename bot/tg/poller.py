"""Polling with several replicas: exactly one polls getUpdates, elected through the database.

getUpdates allows one consumer per token (a second one gets 409 Conflict), so in polling mode
every replica runs an election: the holder of the `poller` lease (chat_leases, chat_id 0)
polls, and every replica processes the inbox. The lease follows the same rules as a chat's
(bot/service/leases.py): the holder renews it; when its heartbeat goes stale (kill -9, a lost
machine) another replica takes it within `takeover_after_s` plus one election interval; a
fenced holder stops polling before anyone else may start; SIGTERM gives it back at once.

Nothing is lost or acknowledged twice across a handover: the offset only ever moves past
updates already committed to the inbox (bot/tg/ingest.py), so whatever the old poller had
not confirmed is handed out again to the new one (which starts from offset None), and the
inbox's unique update_id makes a redelivery a no-op.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from bot.service.leases import Leases
from bot.service.retry import Interrupted, wait_event
from bot.tasks import cancel_and_wait
from bot.tg.ingest import PollingIngest

log = logging.getLogger(__name__)

POLLER_CHAT = 0  # the poller's lease is a row of chat_leases with this chat_id
# How often a replica that does not poll asks for the lease, and the holder checks it still
# holds it (it renews in the database every half TTL).
ELECT_EVERY_S = 1.0


class ElectedPolling:
    """Runs `make_ingest()`'s PollingIngest while this replica holds the poller lease."""

    def __init__(
        self,
        leases: Leases,
        make_ingest: Callable[[], PollingIngest],
        *,
        every_s: float = ELECT_EVERY_S,
    ) -> None:
        self.leases = leases
        self.make_ingest = make_ingest
        self.every_s = every_s
        self._ingest: PollingIngest | None = None
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def polling(self) -> bool:
        """Whether this replica is the poller now."""
        return self._ingest is not None

    @property
    def current(self) -> PollingIngest | None:
        """The running getUpdates loop while this replica is the poller."""
        return self._ingest

    @property
    def done(self) -> asyncio.Task[None] | None:
        """The election task; it ends with an exception on a fatal polling error (a bad
        token), as PollingIngest.done does."""
        return self._task

    async def start(self, stop: asyncio.Event | None = None) -> None:
        """Start the election (and polling, once elected) in the background."""
        self._task = asyncio.create_task(self._run(), name="poller-election")

    async def stop(self) -> None:
        """Stop polling and give the poller lease back at once (another replica takes over
        within one election interval)."""
        self._stop.set()
        # It may have ended with a fatal error already (reported by Service.wait): the lease
        # is given back all the same.
        await cancel_and_wait(self._task, raise_errors=False)
        try:
            await self._resign("stopping")
        finally:
            await self.leases.stop()

    async def _run(self) -> None:
        while not self._stop.is_set():
            try:
                elected = await self.leases.acquire(POLLER_CHAT)
            except Exception as err:  # noqa: BLE001 - the database is down: not the poller
                log.warning("poller election failed (%s)", err)
                elected = False
            if elected and self._ingest is None:
                await self._take_office()
            elif not elected and self._ingest is not None:
                await self._resign("another replica holds the poller lease, or we are fenced")
            polling = self._ingest.done if self._ingest is not None else None
            if polling is not None and polling.done():
                polling.result()  # a fatal error (a bad token) ends the service
            await wait_event(self._stop, self.every_s)

    async def _take_office(self) -> None:
        log.info("this replica polls getUpdates now (elected poller)")
        ingest = self.make_ingest()
        self._ingest = ingest
        try:
            await ingest.start(self._stop)  # deleteWebhook, retried until it answers
        except Interrupted:
            self._ingest = None

    async def _resign(self, why: str) -> None:
        ingest, self._ingest = self._ingest, None
        if ingest is None:
            return
        log.info("this replica stops polling: %s", why)
        await ingest.stop()
