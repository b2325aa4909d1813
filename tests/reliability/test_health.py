"""/healthz and /readyz while things go wrong: the database stopped and back, an inbox that
lags behind, a service that is stopping. Each answer says which check fails and why."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from bot.app import open_service
from bot.db import migrate
from tests.support.botprocess import free_port
from tests.support.fakebotapi import FakeBotAPI
from tests.support.ops import get_json, readyz, scrape, value, wait_readyz
from tests.support.pgserver import PrivatePostgres
from tests.support.service_harness import (
    FAST,
    TOKEN,
    EchoResponder,
    make_settings,
    running_service,
)

PASSWORD = "Pw-Ready-Secret-7c1d"


async def test_readyz_is_not_ready_while_the_database_is_down_and_ready_again_after(
    tmp_path: Path,
) -> None:
    pg = PrivatePostgres(password=PASSWORD)
    port = free_port()
    try:
        async with FakeBotAPI(TOKEN) as api:
            settings = make_settings(pg.url, api, tmp_path, metrics_port=port, log_level="INFO")
            async with running_service(settings, EchoResponder()):
                api.user_message(8001, "hello")
                await api.wait_for_texts(8001, 1)
                status, body = await readyz(port)
                assert (status, body["ready"]) == (200, True), body
                assert {name for name, check in body["checks"].items() if check["ok"]} == {
                    "database",
                    "model",
                    "inbox_lag",
                }
                await asyncio.to_thread(pg.stop)
                _, body = await wait_readyz(port, 503)
                assert body["ready"] is False
                database = body["checks"]["database"]
                assert database["ok"] is False and database["detail"], body
                assert body["checks"]["inbox_lag"]["ok"] is False  # cannot be known now
                assert body["checks"]["model"]["ok"] is True
                assert PASSWORD not in json.dumps(body)
                # Alive all the same, and still scraped (the queue gauges keep their values).
                assert (await get_json(port, "/healthz"))[0] == 200
                down = await scrape(port)
                assert value(down, "bot_updates_acknowledged_total") == 1
                assert value(down, "bot_ready") == 0  # what the BotNotReady alert reads
                await asyncio.to_thread(pg.start)
                _, body = await wait_readyz(port, 200, timeout_s=30)
                assert all(check["ok"] for check in body["checks"].values()), body
                assert value(await scrape(port), "bot_ready") == 1
    finally:
        await asyncio.to_thread(pg.close)


async def test_readyz_follows_the_inbox_lag_and_fails_while_stopping(
    sqlite_url: str, tmp_path: Path, api: FakeBotAPI
) -> None:
    release = asyncio.Event()

    class Held(EchoResponder):
        """Answers only once the test releases it: the update waits in the inbox meanwhile."""

        started = 0

        async def respond(self, session: Any, user_text: str, **kw: Any) -> Any:
            self.started += 1
            await release.wait()
            return await super().respond(session, user_text, **kw)

    port = free_port()
    settings = make_settings(
        sqlite_url, api, tmp_path, metrics_port=port, ready_max_inbox_lag_s=0.5
    )
    await asyncio.to_thread(migrate.upgrade, sqlite_url)
    responder = Held()

    async def factory(_settings: object, _store: object) -> Held:
        return responder

    svc = await open_service(settings, responder_factory=factory, backoff=FAST, timeout_s=5.0)
    stopping: asyncio.Task[None] | None = None
    try:
        await svc.start()
        assert (await readyz(port))[0] == 200
        api.user_message(8101, "a turn that takes its time")
        _, body = await wait_readyz(port, 503)
        lag = body["checks"]["inbox_lag"]
        assert lag["ok"] is False and "limit 0.5 s" in lag["detail"], body
        assert body["checks"]["database"]["ok"] is True
        release.set()
        await api.wait_for_texts(8101, 1)
        await wait_readyz(port, 200)
        # SIGTERM: not ready at once, while the turns in progress finish.
        release.clear()
        api.user_message(8101, "one more")
        await api.wait_for(lambda: responder.started == 2, what="the second turn")
        stopping = asyncio.create_task(svc.stop())
        _, body = await wait_readyz(port, 503)
        assert body["checks"]["stopping"] == {
            "ok": False,
            "detail": "the service is shutting down",
        }
        assert (await get_json(port, "/healthz"))[0] == 200
        release.set()
        await stopping
        assert api.texts(8101)[-1] == "echo 8101: one more"  # finished within the grace
    finally:
        release.set()
        if stopping is None:
            await svc.stop()
        await svc.close()
