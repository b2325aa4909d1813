"""Serving the dashboard: alone (`python -m bot dashboard`) or beside the Telegram service."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from aiohttp import web

from bot.admin.cli import admin_sql_url
from bot.config import ConfigError, Settings
from bot.dashboard.auth import is_loopback
from bot.db.engine import safe_url

log = logging.getLogger(__name__)

DEFAULT_PORT = 8090


def _password(settings: Settings) -> str:
    secret = settings.dashboard_password
    return secret.get_secret_value() if secret is not None else ""


def check_settings(settings: Settings, *, listen: str, required: bool) -> bool:
    """Whether to serve the dashboard: False without DASHBOARD_PASSWORD on loopback.

    Raises ConfigError where serving would be unsafe or was asked for without a password:
    a non-loopback address without one, or `required` (the `dashboard` command).
    """
    if _password(settings).strip():
        return True
    if not is_loopback(listen):
        raise ConfigError(
            f"refusing to serve the dashboard on {listen} without DASHBOARD_PASSWORD: set "
            "DASHBOARD_PASSWORD, or DASHBOARD_LISTEN=127.0.0.1 to keep it on this machine"
        )
    if required:
        raise ConfigError(
            "the dashboard needs DASHBOARD_PASSWORD: set it in .env or the environment "
            "(without one there is no dashboard)"
        )
    return False


@dataclass
class RunningDashboard:
    """A started dashboard; `close()` stops it."""

    runner: web.AppRunner
    url: str

    async def close(self) -> None:
        """Stop listening and close the database engine."""
        await self.runner.cleanup()


async def _check_database(app: web.Application) -> None:
    """PostgreSQL: the role must be read-only, checked now rather than at the first page."""
    from sqlalchemy import text

    from bot.dashboard.app import DASHBOARD

    dash = app[DASHBOARD]
    if dash.engine is None or dash.engine.dialect.name != "postgresql":
        return  # SQLite: mode=ro on every connection; the file may not exist yet
    from bot.admin.sql import SqlRefused

    try:
        async with dash.engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
    except SqlRefused as err:
        raise ConfigError(f"dashboard: {err}") from err


async def start_dashboard(settings: Settings, *, listen: str, port: int) -> RunningDashboard:
    """Start the dashboard on listen:port (check_settings first); ConfigError if it cannot."""
    from bot.dashboard.app import build_app
    from bot.engine.variants import load_experiment

    url = admin_sql_url(settings)
    app = build_app(
        settings,
        url=url,
        password=_password(settings),
        experiment=load_experiment(settings, check_model=False),
        listen=listen,
    )
    app.on_startup.append(_check_database)
    # No access log: request lines would carry search terms (persona text) into the log.
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, listen, port)
    try:
        await site.start()
    except OSError as err:
        await runner.cleanup()
        raise ConfigError(f"the dashboard cannot listen on {listen}:{port}: {err}") from err
    shown = f"[{listen}]" if ":" in listen else listen
    bound = f"http://{shown}:{port}/"
    log.info("dashboard at %s (database %s, read-only)", bound, safe_url(url))
    return RunningDashboard(runner, bound)


class DashboardThread:
    """The dashboard beside `run`, on an event loop of its own in a thread of its own.

    Its own loop keeps page rendering (templates, the variants report's statistics) off the
    service's loop, which must never wait on anything but I/O (docs/guarantees.md, invariant 7), and
    leaves bot/app.py as it is.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.url: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="dashboard", daemon=True)

    def start(self) -> None:
        """Start listening; raises what start_dashboard raised (ConfigError) in this thread."""
        self._thread.start()
        self._started.wait()
        if self._error is not None:
            self._thread.join()
            raise self._error

    def _main(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        try:
            running = await start_dashboard(
                self.settings,
                listen=self.settings.dashboard_listen,
                port=self.settings.dashboard_port or DEFAULT_PORT,
            )
        except BaseException as err:  # noqa: BLE001 - handed to the starting thread
            self._error = err
            self._started.set()
            return
        self.url = running.url
        self._started.set()
        try:
            await self._stop.wait()
        finally:
            await running.close()

    def stop(self) -> None:
        """Stop serving and wait for the thread."""
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=30)


@contextlib.contextmanager
def beside_service(settings: Settings) -> Iterator[DashboardThread | None]:
    """The dashboard for the time of `run`, when DASHBOARD_PORT is set (and a password)."""
    if settings.dashboard_port is None:
        yield None
        return
    if not check_settings(settings, listen=settings.dashboard_listen, required=False):
        log.warning("DASHBOARD_PORT is set but DASHBOARD_PASSWORD is not: no dashboard")
        yield None
        return
    thread = DashboardThread(settings)
    thread.start()
    try:
        yield thread
    finally:
        thread.stop()


def run_dashboard(settings: Settings, *, listen: str | None, port: int | None) -> int:
    """`python -m bot dashboard`: serve until SIGINT/SIGTERM; returns the exit status."""
    host = listen or settings.dashboard_listen
    check_settings(settings, listen=host, required=True)

    async def serve() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
        # start_dashboard logs "dashboard at http://...": the address to open
        running = await start_dashboard(
            settings, listen=host, port=port or settings.dashboard_port or DEFAULT_PORT
        )
        try:
            await stop.wait()
        finally:
            await running.close()
        return 0

    return asyncio.run(serve())
