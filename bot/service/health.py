"""Operations endpoints on METRICS_PORT: /metrics (Prometheus), /healthz and /readyz.

/healthz answers 200 while the process's event loop runs. /readyz answers 200 when this replica
can do its work: the database answers a `SELECT 1` within a short timeout, every model variant's
worker is up and answers its pings (a stalled or restarting one is named), and the oldest
update waiting in the inbox is younger than READY_MAX_INBOX_LAG_S;
otherwise 503, with a JSON body naming each failing check and why. A stopping service is not
ready either, so a load balancer drains it before it goes.

The queue gauges (inbox and outbox depth, inbox lag) and bot_ready are refreshed at scrape time
by the checks /readyz runs: always current, and nothing runs while nobody scrapes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from dataclasses import KW_ONLY, InitVar, dataclass, field
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bot.db import inbox, outbox
from bot.db.models import utcnow
from bot.engine.protocol import ResponderProtocol
from bot.logs import RedactingFilter
from bot.service.metrics import Metrics

log = logging.getLogger(__name__)

# A database that does not answer within this is as good as down for a probe.
DB_TIMEOUT_S = 2.0


@dataclass(frozen=True, slots=True)
class Backlog:
    """The queues as the database has them now."""

    inbox_depth: int
    inbox_lag_s: float
    outbox_depth: int


async def read_backlog(
    sessionmaker: async_sessionmaker[AsyncSession], timeout_s: float = DB_TIMEOUT_S
) -> Backlog:
    """`SELECT 1`, then the queues' depths and the inbox's lag, within `timeout_s` (TimeoutError
    after it, or the database's own error)."""
    async with asyncio.timeout(timeout_s), sessionmaker() as db:
        await db.execute(text("SELECT 1"))
        depth, oldest = await inbox.backlog(db)
        waiting = await outbox.backlog(db)
    lag = max((utcnow() - oldest).total_seconds(), 0.0) if oldest is not None else 0.0
    return Backlog(depth, lag, waiting)


def model_check(responder: ResponderProtocol) -> tuple[bool, str]:
    """Whether every model variant takes turns (a responder without variants: yes)."""
    variants = responder.abilities.variants
    states = variants.model_states() if variants is not None else {}
    if not states:
        return True, "loaded"
    down = {name: why for name, why in states.items() if why}
    if down:
        return False, "; ".join(f"variant {name}: {why}" for name, why in sorted(down.items()))
    return True, f"{len(states)} variant(s) loaded"


@dataclass(eq=False, repr=False)
class Health:
    """The readiness checks of one service."""

    sessionmaker: async_sessionmaker[AsyncSession]
    responder: ResponderProtocol
    _: KW_ONLY
    max_inbox_lag_s: float
    secrets: InitVar[Iterable[str]] = ()
    metrics: Metrics | None = None
    stopping: bool = field(init=False, default=False)
    _was_ready: bool | None = field(init=False, default=None)

    def __post_init__(self, secrets: Iterable[str]) -> None:
        # A database error's text can name the server; it never carries a password (the
        # driver does not print it), but it is masked like a log line all the same.
        self._redactor = RedactingFilter(secrets)

    async def readiness(self) -> dict[str, Any]:
        """`{"ready": bool, "checks": {name: {"ok": bool, "detail": str}}}` with the checks
        database, model, inbox_lag (and stopping, once the service stops). Never raises."""
        checks: dict[str, dict[str, Any]] = {}
        try:
            backlog = await self.backlog()
        except Exception as err:  # noqa: BLE001 - whatever failed, the database is not usable
            reason = f"no answer within {DB_TIMEOUT_S:.1f} s"
            if not isinstance(err, TimeoutError):
                reason = self._redactor.redact(f"{type(err).__name__}: {err}".splitlines()[0])
            checks["database"] = {"ok": False, "detail": reason[:300]}
            checks["inbox_lag"] = {"ok": False, "detail": "unknown: the database does not answer"}
        else:
            checks["database"] = {"ok": True, "detail": "answers"}
            lag_ok = backlog.inbox_lag_s < self.max_inbox_lag_s
            checks["inbox_lag"] = {
                "ok": lag_ok,
                "detail": (
                    f"oldest waiting update {backlog.inbox_lag_s:.1f} s old "
                    f"(limit {self.max_inbox_lag_s:g} s), {backlog.inbox_depth} waiting"
                ),
            }
        ok, detail = model_check(self.responder)
        checks["model"] = {"ok": ok, "detail": detail}
        if self.stopping:
            checks["stopping"] = {"ok": False, "detail": "the service is shutting down"}
        ready = all(c["ok"] for c in checks.values())
        if self.metrics is not None:
            self.metrics.ready.set(1 if ready else 0)
        if ready != self._was_ready:  # once per change, not once per probe
            failing = ", ".join(f"{n}: {c['detail']}" for n, c in checks.items() if not c["ok"])
            log.log(
                logging.INFO if ready or self._was_ready is None else logging.WARNING,
                "ready" if ready else "not ready (%s)",
                *(() if ready else (failing,)),
            )
            self._was_ready = ready
        return {"ready": ready, "checks": checks}

    async def backlog(self) -> Backlog:
        """The queues now (and into the gauges); raises when the database does not answer."""
        backlog = await read_backlog(self.sessionmaker)
        if self.metrics is not None:
            self.metrics.set_backlog(backlog.inbox_depth, backlog.inbox_lag_s, backlog.outbox_depth)
        return backlog


class OpsServer:
    """The aiohttp server of /metrics, /healthz and /readyz."""

    def __init__(self, metrics: Metrics, health: Health, *, listen: str, port: int) -> None:
        self.metrics = metrics
        self.health = health
        self.listen = listen
        self.port = port
        self.started = time.monotonic()
        self._runner: web.AppRunner | None = None

    def make_app(self) -> web.Application:
        """The three GET routes."""
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        return app

    async def start(self) -> None:
        """Listen on METRICS_LISTEN:METRICS_PORT."""
        self._runner = web.AppRunner(self.make_app(), shutdown_timeout=2, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.listen, self.port).start()
        log.info("metrics and health on http://%s:%s/metrics", self.listen, self.port)

    async def stop(self) -> None:
        """Stop listening."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _metrics(self, request: web.Request) -> web.Response:
        # The readiness checks (never raising) refresh bot_ready and, through their database
        # query, the queue gauges; those keep their last values when the database is down.
        await self.health.readiness()
        body = generate_latest(self.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, request: web.Request) -> web.Response:
        body = {"status": "alive", "uptime_s": round(time.monotonic() - self.started, 1)}
        return web.json_response(body)

    async def _readyz(self, request: web.Request) -> web.Response:
        result = await self.health.readiness()
        return web.json_response(result, status=200 if result["ready"] else 503)
