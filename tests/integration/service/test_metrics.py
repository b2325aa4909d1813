"""METRICS_PORT's /metrics, scraped over HTTP from the running service: exact values after a
known sequence of updates and Bot API faults; per-variant figures and the clone cache's from
real model worker processes."""

from __future__ import annotations

import asyncio
import os
import signal
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from bot.db.models import ChatLease, utcnow
from bot.engine.assign import choose
from bot.service.heartbeat import HOST, PID_NAMESPACE
from tests.integration.engine.test_variants_service import write_variants
from tests.support.botprocess import free_port
from tests.support.fakebotapi import FakeBotAPI, Fault
from tests.support.fixtures import StartService
from tests.support.ops import readyz, scrape, value, wait_readyz, wait_scraped
from tests.support.service_harness import EchoResponder, make_settings, rows


async def test_scraped_metrics_are_exact_after_a_known_sequence(
    sqlite_url: str, tmp_path: Path, api: FakeBotAPI, start_service: StartService
) -> None:
    port = free_port()
    settings = make_settings(sqlite_url, api, tmp_path, metrics_port=port, log_level="INFO")
    svc = await start_service(settings, EchoResponder())
    chat, blocked = 5101, 5102
    # The chat's inbox lease is held by a process of this machine that has exited: it is
    # taken over at the chat's first update.
    gone = await asyncio.create_subprocess_exec("true")
    await gone.wait()
    async with svc.sessionmaker.begin() as db:
        db.add(
            ChatLease(
                chat_id=chat,
                kind="inbox",
                owner=f"{HOST}:{PID_NAMESPACE}:{gone.pid}:deadbeef",
                lease_until=utcnow() + timedelta(seconds=60),
            )
        )
    # The first reply meets a 500 (delivery retries it), then a 429 (PTB's rate limiter waits
    # it out inside the same call).
    api.inject(
        Fault("sendMessage", status=500, times=1),
        Fault("sendMessage", status=429, retry_after=1, times=1),
    )
    first = api.user_message(chat, "one")
    await api.wait_for_texts(chat, 1)
    api.redeliver(first)  # Telegram's at-least-once delivery: changes nothing
    for text in ("two", "/help", "three"):
        api.user_message(chat, text)
    await api.wait_for_texts(chat, 4)
    # A chat that blocked the bot: its reply is given up.
    api.inject(Fault("sendMessage", status=403, chat_id=blocked, times=1))
    api.user_message(blocked, "anyone there")

    async def given_up() -> bool:
        failed = "SELECT count(*) FROM outbox WHERE chat_id = :c AND failed_at IS NOT NULL"
        return await rows(svc, failed, c=blocked) == [(1,)]

    for _ in range(400):
        if await given_up():
            break
        await asyncio.sleep(0.05)
    samples = await wait_scraped(
        port,
        lambda s: (
            value(s, "bot_updates_received_total", kind="message") == 6
            and value(s, "bot_turns_total", outcome="replied", variant="") == 4
        ),
        "6 updates received and 4 replies",
    )
    sent = api.texts(chat)
    assert [sent[0], sent[1], sent[3]] == ["echo 5101: one", "echo 5101: two", "echo 5101: three"]
    expected: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {
        ("bot_updates_received_total", (("kind", "message"),)): 6,
        ("bot_updates_duplicate_total", ()): 1,
        ("bot_updates_acknowledged_total", ()): 6,
        ("bot_turns_total", (("outcome", "replied"), ("variant", ""))): 4,
        ("bot_turns_total", (("outcome", "command"), ("variant", ""))): 1,
        ("bot_reply_latency_seconds_count", (("variant", ""),)): 4,
        ("bot_telegram_requests_total", (("method", "sendMessage"), ("result", "ok"))): 4,
        ("bot_telegram_requests_total", (("method", "sendMessage"), ("result", "error"))): 2,
        ("bot_telegram_requests_total", (("method", "sendMessage"), ("result", "429"))): 1,
        ("bot_telegram_requests_total", (("method", "getMe"), ("result", "ok"))): 1,
        ("bot_telegram_failures_total", (("action", "retry"), ("method", "sendMessage"))): 1,
        ("bot_telegram_failures_total", (("action", "gave_up"), ("method", "sendMessage"))): 1,
        ("bot_lease_takeovers_total", (("kind", "inbox"),)): 1,
        ("bot_lease_takeovers_total", (("kind", "outbox"),)): 0,
        ("bot_inbox_depth", ()): 0,
        ("bot_inbox_lag_seconds", ()): 0,
        ("bot_outbox_depth", ()): 0,
    }
    got = {key: value(samples, key[0], **dict(key[1])) for key in expected}
    assert got == expected
    # Every turn outcome of this run is one of the two above: nothing counted twice.
    turns = {k: v for k, v in samples.items() if k[0] == "bot_turns_total"}
    assert sum(turns.values()) == 5
    # The echo responder reports no model time, batch or cache: those series stay empty.
    assert not [k for k in samples if k[0].startswith(("bot_model_time", "bot_agent_cache"))]


async def test_queue_gauges_are_read_at_scrape_time(
    sqlite_url: str, tmp_path: Path, api: FakeBotAPI, start_service: StartService
) -> None:
    release = asyncio.Event()

    class Held(EchoResponder):
        async def respond(self, session: Any, user_text: str, **kw: Any) -> Any:
            await release.wait()
            return await super().respond(session, user_text, **kw)

    port = free_port()
    settings = make_settings(sqlite_url, api, tmp_path, metrics_port=port, log_level="INFO")
    await start_service(settings, Held())
    for text in ("held", "queued behind it"):
        api.user_message(6101, text)
    samples = await wait_scraped(
        port, lambda s: value(s, "bot_inbox_depth") == 2, "two updates waiting"
    )
    assert (value(samples, "bot_inbox_lag_seconds") or 0) > 0
    release.set()
    await api.wait_for_texts(6101, 2)
    samples = await wait_scraped(
        port,
        lambda s: value(s, "bot_inbox_depth") == 0 and value(s, "bot_outbox_depth") == 0,
        "empty queues",
    )
    assert value(samples, "bot_inbox_lag_seconds") == 0


@pytest.mark.parametrize("model_workers", ["process", "inline"])
async def test_per_variant_figures_and_the_clone_cache_on_the_tiny_model(
    sqlite_url: str,
    tmp_path: Path,
    api: FakeBotAPI,
    start_service: StartService,
    tiny_model_file: str,
    model_workers: str,
) -> None:
    vf = write_variants(tmp_path / "v.toml", tiny_model_file, {"a": 1, "b": 1})
    port = free_port()
    settings = make_settings(
        sqlite_url,
        api,
        tmp_path,
        variants_file=vf,
        model_workers=model_workers,
        metrics_port=port,
        agent_cache_size=1,
        worker_threads=1,
        log_level="INFO",
        safety="off",  # a replaced reply would evict its clone: the cache figures would move
    )
    svc = await start_service(settings, None)
    weights = {"a": 1.0, "b": 1.0}
    a_chats = [c for c in range(7001, 7100) if choose("default", c, weights) == "a"][:2]
    b_chat = next(c for c in range(7001, 7100) if choose("default", c, weights) == "b")
    # Variant a: two chats over a cache of one clone, alternating: every turn is a miss (the
    # other chat's clone took the place) and every rebuild evicts the other clone.
    # Variant b: one chat, twice: a miss, then a hit.
    for round_ in (1, 2):
        for chat in (*a_chats, b_chat):
            api.user_message(chat, f"hello number {round_}")
            await api.wait_for_texts(chat, round_, timeout_s=60)
    samples = await wait_scraped(
        port,
        lambda s: (
            value(s, "bot_turns_total", outcome="replied", variant="a") == 4
            and value(s, "bot_turns_total", outcome="replied", variant="b") == 2
        ),
        "6 replies",
        timeout_s=60,
    )
    # The model-side figures also name the model server: this service's own process here.
    local = {"model_replica": "local"}
    for variant, turns in (("a", 4), ("b", 2)):
        assert value(samples, "bot_reply_latency_seconds_count", variant=variant) == turns
        for name in ("bot_model_time_seconds_count", "bot_batch_size_count"):
            assert value(samples, name, variant=variant, **local) == turns, (name, variant)
        # Batches of one: the turns were sent one at a time.
        assert value(samples, "bot_batch_size_sum", variant=variant, **local) == turns
    assert value(samples, "bot_agent_cache_misses_total", variant="a", **local) == 4
    assert value(samples, "bot_agent_cache_hits_total", variant="a", **local) is None
    assert value(samples, "bot_agent_cache_rebuild_seconds_count", variant="a", **local) == 4
    # Each of a's rebuilds but the first evicted the other chat's clone.
    assert value(samples, "bot_agent_cache_evictions_total", variant="a", **local) == 3
    assert value(samples, "bot_agent_cache_misses_total", variant="b", **local) == 1
    assert value(samples, "bot_agent_cache_hits_total", variant="b", **local) == 1
    assert value(samples, "bot_agent_cache_rebuild_seconds_count", variant="b", **local) == 1
    if model_workers == "inline":
        return

    # The model check of /readyz: a worker that died is "not ready" until it is back.
    engine: Any = svc.responder.backends["b"]  # type: ignore[attr-defined]
    pid = engine.pid
    assert (await readyz(port))[0] == 200
    os.kill(pid, signal.SIGKILL)
    _, body = await wait_readyz(port, 503)
    assert body["checks"]["model"] == {
        "ok": False,
        "detail": "variant b: worker down; restarting",
    }
    assert body["checks"]["database"]["ok"] is True
    _, body = await wait_readyz(port, 200, timeout_s=90)
    assert body["checks"]["model"] == {"ok": True, "detail": "2 variant(s) loaded"}
    assert engine.pid != pid
    samples = await scrape(port)
    assert value(samples, "bot_worker_restarts_total", variant="b", reason="exited") == 1
    assert value(samples, "bot_worker_restarts_total", variant="b", reason="stalled") == 0
    assert value(samples, "bot_worker_restarts_total", variant="a", reason="exited") == 0
