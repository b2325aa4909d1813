"""SIGTERM and SIGINT stop the real `python -m bot run` while start-up still retries the Bot API.

Regression: getMe, deleteWebhook and setWebhook were retried forever without looking at the stop
event, so a stop during an outage waited for systemd's (or the container runtime's) kill timeout.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.botprocess import SECRET, TOKEN, BotProcess, bot_env, free_port
from tests.support.fakebotapi import FakeBotAPI, Fault

PROMPT_S = 10.0  # generous: a stop takes well under a second; the bug never stopped at all


async def until(what: str, bot: BotProcess, predicate: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 90
    while not predicate():
        if bot.proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"never saw {what}:\n{bot.output()[-3000:]}")
        await asyncio.sleep(0.05)


async def stops_promptly(bot: BotProcess, sig: signal.Signals) -> None:
    bot.proc.send_signal(sig)
    assert await bot.wait(PROMPT_S) == 0
    output = bot.output()
    assert "Traceback" not in output
    assert TOKEN.split(":")[1] not in output


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_a_signal_stops_the_getme_retries_when_the_bot_api_is_unreachable(
    tmp_path: Path, tiny_model_file: str, sig: signal.Signals
) -> None:
    async with FakeBotAPI(TOKEN) as api:
        env = bot_env(tmp_path, api, tiny_model_file)
    # Nothing listens there any more: every getMe fails at once, and the retries back off.
    env["TELEGRAM_BASE_URL"] = f"http://127.0.0.1:{free_port()}/bot"
    bot = BotProcess(env, tmp_path, tmp_path / "bot.log")
    try:
        await until("the third getMe retry", bot, lambda: "retry 3" in bot.output())
        await stops_promptly(bot, sig)
    finally:
        bot.kill()
    assert "cannot reach the Bot API" in bot.output()


@pytest.mark.parametrize(
    ("method", "sig"),
    [("deleteWebhook", signal.SIGTERM), ("setWebhook", signal.SIGINT)],
    ids=["deleteWebhook-SIGTERM", "setWebhook-SIGINT"],
)
async def test_a_signal_stops_the_webhook_call_retries_at_start_up(
    tmp_path: Path, tiny_model_file: str, method: str, sig: signal.Signals
) -> None:
    async with FakeBotAPI(TOKEN) as api:
        api.inject(Fault(method, status=502, times=10**6))  # 502: a NetworkError, retried
        extra: dict[str, str] = {}
        if method == "setWebhook":
            port = free_port()
            extra = {
                "WEBHOOK_URL": f"http://127.0.0.1:{port}/hook", "WEBHOOK_SECRET": SECRET,
                "WEBHOOK_LISTEN": "127.0.0.1", "WEBHOOK_PORT": str(port),
            }  # fmt: skip
        bot = BotProcess(
            bot_env(tmp_path, api, tiny_model_file, **extra), tmp_path, tmp_path / "b.log"
        )
        try:
            await until(f"{method} retried", bot, lambda: len(api.calls_to(method)) >= 3)
            await stops_promptly(bot, sig)
        finally:
            bot.kill()
        assert api.calls_to("getUpdates") == []  # it never got as far as serving
