"""`python -m bot run` with DASHBOARD_PORT: the real service process, the loopback Bot API, the
tiny model, and its dashboard on the side showing what the service just did."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import aiohttp

from tests.support.botprocess import TOKEN, bot_env, bot_process, free_port
from tests.support.fakebotapi import FakeBotAPI

PASSWORD = "dashboard-Passw0rd-for-e2e"


async def test_run_serves_the_dashboard_beside_the_bot(
    tmp_path: Path, tiny_model_file: str
) -> None:
    port = free_port()
    async with FakeBotAPI(TOKEN) as api:
        env = bot_env(
            tmp_path, api, tiny_model_file,
            DASHBOARD_PORT=str(port), DASHBOARD_PASSWORD=PASSWORD, LOG_LEVEL="DEBUG",
        )  # fmt: skip
        async with bot_process(env, tmp_path, api) as bot:
            api.user_message(77, "hello there")
            await api.wait_for_texts(77, 1, timeout_s=30)
            jar = aiohttp.CookieJar(unsafe=True)  # keep cookies for 127.0.0.1
            base = f"http://127.0.0.1:{port}"
            async with aiohttp.ClientSession(base, cookie_jar=jar) as client:
                async with client.get("/", allow_redirects=False) as r:
                    assert r.status == 303
                async with client.post("/login", data={"password": PASSWORD}) as r:
                    assert r.status == 200
                    body = await r.text()
                figures = dict(re.findall(r'data-stat="(\w+)" data-value="([^"]*)"', body))
                assert figures["messages_total"] == "2" and figures["chats"] == "1"
                # the running service's own heartbeat row: alive, and (once its first status
                # report is written, every few seconds) polling
                deadline = asyncio.get_running_loop().time() + 30
                while True:
                    async with client.get("/health") as r:
                        health = await r.text()
                    rows = re.findall(r'<tr data-owner="[^"]+" class="(\w+)">', health)
                    assert rows == ["alive"], health[-2000:]
                    if "polls getUpdates" in health:
                        break
                    assert asyncio.get_running_loop().time() < deadline, health[-2000:]
                    await asyncio.sleep(0.5)
            assert await bot.stop() == 0
        # the dashboard went with the service
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            pass
        else:
            writer.close()
            raise AssertionError("the dashboard still listens after the service stopped")
        output = bot.output()
        assert PASSWORD not in output and TOKEN not in output
        assert f"dashboard at http://127.0.0.1:{port}/" in output
