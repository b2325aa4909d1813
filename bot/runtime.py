"""The running service: its parts, started and stopped in data-flow order (bot/app.py's
build_service makes them from the settings; python-telegram-bot's Application to its
ApplicationBuilder).

ingest (polling or webhook) -> inbox -> inbox worker -> handlers -> use cases (+ responder)
-> outbox -> delivery.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol

from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from telegram.error import NetworkError, TelegramError

from bot import texts
from bot.config import Settings
from bot.conversations.store import ConversationStore
from bot.conversations.usecases import UseCases
from bot.db.engine import make_sessionmaker, safe_url
from bot.engine.protocol import ResponderProtocol
from bot.service.budget import SendBudget
from bot.service.delivery import Delivery
from bot.service.health import Health, OpsServer
from bot.service.heartbeat import Heartbeat
from bot.service.inbox import InboxWorker
from bot.service.leases import Leases
from bot.service.metrics import Metrics
from bot.service.retry import Backoff, retry
from bot.tasks import cancel_and_wait
from bot.tg.handlers import App, Handlers, command_menu
from bot.tg.ingest import WebhookIngest
from bot.tg.poller import ElectedPolling

log = logging.getLogger(__name__)


class ServingResponder(ResponderProtocol, Protocol):
    """The responder as the service runs it: the conversation API plus a clean shutdown."""

    async def close(self) -> None:
        """Stop generating (a running batch finishes first)."""
        ...


@dataclass(eq=False)
class Service:
    """All parts of the running bot (made by bot.app.build_service), started and stopped in
    data-flow order."""

    settings: Settings
    metrics: Metrics  # one registry per service (bot/service/metrics.py)
    db_engine: AsyncEngine
    sessionmaker: async_sessionmaker[AsyncSession]
    responder: ServingResponder
    application: App
    budget: SendBudget  # the application's rate limiter draws on it, and the drafts
    store: ConversationStore
    cases: UseCases
    handlers: Handlers
    # This replica's name in the leases and the heartbeat.
    owner: str
    # The heartbeat's own connection (a busy pool must never make it miss a beat).
    heartbeat_engine: AsyncEngine
    heartbeat: Heartbeat
    # Retention and the autopilot: their long reads run off the event loop (bot.db.engine).
    jobs_engine: AsyncEngine
    leases: tuple[Leases, Leases]  # inbox, outbox
    delivery: Delivery
    inbox_worker: InboxWorker
    ingest: ElectedPolling | WebhookIngest
    health: Health
    ops: OpsServer | None  # METRICS_PORT: /metrics, /healthz, /readyz
    _commands_task: asyncio.Task[None] | None = field(default=None, init=False)
    _retention_task: asyncio.Task[None] | None = field(default=None, init=False)
    _autopilot_task: asyncio.Task[None] | None = field(default=None, init=False)

    async def start(self, stop: asyncio.Event | None = None) -> None:
        """Send leftovers, process pending updates, then take new ones.

        Raises Interrupted if `stop` is set while setWebhook/deleteWebhook is being retried.
        """
        if self.ops is not None:  # first: /healthz answers, /readyz tells, during start-up
            await self.ops.start()
        self._commands_task = asyncio.create_task(self._set_commands(), name="setMyCommands")
        await self.cases.core.safety.warm_up()  # the classifier loads now, not on the first reply
        jobs = make_sessionmaker(self.jobs_engine)  # retention and the autopilot
        if self.settings.retention_days:
            from bot.service.retention import run_forever

            self._retention_task = asyncio.create_task(
                run_forever(jobs, self.settings.retention_days), name="retention"
            )
        experiment = getattr(self.responder, "experiment", None)
        if experiment is not None:
            # Every replica watches `admin variants autopilot`; a decision is made once
            # (bot/service/autopilot.py), and every replica follows it like any change.
            from bot.service.autopilot import run_forever as autopilot

            self._autopilot_task = asyncio.create_task(
                autopilot(jobs, experiment.name, owner=self.owner), name="autopilot"
            )
        # The heartbeat row first: a peer judges our leases by it.
        await retry(
            self.heartbeat.start,
            what="writing this replica's heartbeat",
            backoff=Backoff(cap_s=10.0),
            stop=stop,
        )
        for leases in self.leases:
            leases.start()
        await self.delivery.start()
        await self.inbox_worker.start()
        await self.ingest.start(stop)
        mode = "webhook" if isinstance(self.ingest, WebhookIngest) else "polling (elected poller)"
        log.info("serving Telegram (%s mode); database %s", mode, safe_url(self.settings.db_url))

    async def wait(self, stop: asyncio.Event) -> None:
        """Until `stop` is set, or polling fails fatally (re-raised)."""
        waiters: list[asyncio.Future[object]] = [asyncio.ensure_future(stop.wait())]
        polling = self.ingest.done if isinstance(self.ingest, ElectedPolling) else None
        if polling is not None:
            waiters.append(polling)  # type: ignore[arg-type]
        done, _ = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        waiters[0].cancel()
        if polling is not None and polling in done:
            polling.result()

    async def stop(self) -> None:
        """Stop fetching, finish turns in progress within shutdown_grace_s, send their replies."""
        grace = self.settings.shutdown_grace_s
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        log.info("stopping: no new updates; %d in progress", self.inbox_worker.busy)
        self.health.stopping = True  # /readyz: 503, so a load balancer drains this replica
        try:
            await self.ingest.stop()
        except Exception as err:  # noqa: BLE001 - stopping goes on regardless
            log.warning("stopping ingest: %s: %s", type(err).__name__, err)
        await self.inbox_worker.stop(grace)
        # Replies of the last turns go out too, within what is left of the grace period.
        await self.delivery.stop(max(deadline - loop.time(), min(grace, 3.0)))
        for leases in self.leases:
            await leases.stop()
        await self.heartbeat.stop()  # after the leases: peers need not wait for anything
        await cancel_and_wait(
            self._commands_task, self._retention_task, self._autopilot_task, raise_errors=False
        )
        if self.ops is not None:
            await self.ops.stop()

    async def status(self) -> dict[str, object]:
        """What this replica reports in its heartbeat row (`replicas.info`) for operators and
        the dashboard: mode, whether it polls, readiness (what fails), and its model workers."""
        polling = isinstance(self.ingest, ElectedPolling)
        stats_of = getattr(self.responder, "worker_stats", None)
        workers = []
        for variant, figures in (await stats_of() if stats_of is not None else {}).items():
            cache = {
                k: figures[k] for k in ("cached", "hits", "misses", "evictions") if k in figures
            }
            workers.append(
                {
                    "variant": variant,
                    "pid": figures.get("pid"),
                    "alive": bool(cache) or figures.get("pid") is None,
                    "restarts": figures.get("restarts", 0),
                    "cache": cache,
                }
            )
        readiness = await self.health.readiness()
        problems = [
            f"{name}: {check.get('detail', '')}"
            for name, check in readiness["checks"].items()
            if not check.get("ok")
        ]
        # Variants this replica cannot serve (a model that does not load here): the others
        # keep serving, and operators see why in `replicas.info` and on the dashboard.
        load_errors: dict[str, str] = dict(getattr(self.responder, "load_errors", {}) or {})
        experiment = getattr(self.responder, "experiment", None)
        weights = experiment.weights if experiment is not None else {}
        problems += [
            f"variant {name}: {why}"
            for name, why in load_errors.items()
            if not weights.get(name)  # a weighted one fails readiness, which named it above
        ]
        info: dict[str, object] = {
            "mode": "polling" if polling else "webhook",
            "poller": isinstance(self.ingest, ElectedPolling) and self.ingest.polling,
            "ready": readiness["ready"],
            "problems": problems,
            "busy_chats": self.inbox_worker.busy,
            "workers": workers,
            # Read by `admin variants weight/remove` (bot.engine.live.cannot_serve): a change
            # that would leave new chats only variants no replica can load is refused.
            "load_errors": load_errors,
            "serving": list(getattr(self.responder, "ready", []) or []),
        }
        if experiment is not None:
            info["experiment"] = {
                "name": experiment.name,
                "version": experiment.version,
                "allocation": experiment.allocation,
                "control": next((v.name for v in experiment.variants if v.control), None),
                "variants": {v.name: v.weight for v in experiment.variants},
            }
        return info

    async def close(self) -> None:
        """Release the responder, the Bot API client and the database."""
        try:
            await self.responder.close()
        finally:
            with contextlib.suppress(Exception):
                await self.application.shutdown()
            with contextlib.suppress(Exception):
                await self.handlers.close()
            await self.heartbeat_engine.dispose()
            await self.jobs_engine.dispose()
            await self.db_engine.dispose()

    async def _set_commands(self) -> None:
        """The command menu and the bot's descriptions, once per shipped language: English
        without a language_code (what every other client language falls back to), each
        translation with its own."""
        bot = self.application.bot
        calls: list[tuple[str, Callable[[], Awaitable[bool]]]] = []
        for language in texts.LANGUAGES:
            t = texts.for_language(language)
            code = None if language == texts.SOURCE_LANGUAGE else language
            calls += [
                (
                    f"setMyCommands({language})",
                    partial(bot.set_my_commands, command_menu(t), language_code=code),
                ),
                (
                    f"setMyDescription({language})",
                    partial(bot.set_my_description, t.DESCRIPTION, language_code=code),
                ),
                (
                    f"setMyShortDescription({language})",
                    partial(bot.set_my_short_description, t.SHORT_DESCRIPTION, language_code=code),
                ),
            ]
        for what, call in calls:
            try:
                await retry(call, what=what, backoff=Backoff(cap_s=60.0), on=(NetworkError,))
            except TelegramError as err:  # a refused description must not cost the menu
                log.warning("%s failed: %s", what, err)
