"""A second instance with the same token and the same database must not double-answer.

Telegram answers 409 to all but the newest getUpdates, so the instances elect one poller
(bot/tg/poller.py) and both process the one inbox. Only one process may turn an update into a
reply, and only one may send a given outbox row, with per-chat order kept across the processes.
"""

from __future__ import annotations

import asyncio
import signal
from collections import Counter
from pathlib import Path

import pytest

from bot.app import Service
from bot.tg.poller import ElectedPolling
from tests.support.fakebotapi import FakeBotAPI
from tests.support.procs import TOKEN, bot_env, check_database, start_bot
from tests.support.service_harness import TOKEN as IN_PROCESS_TOKEN
from tests.support.service_harness import EchoResponder, make_settings, running_service, settled

CHATS = range(301, 307)
PER_CHAT = 4


@pytest.mark.slow
async def test_two_processes_on_one_database_answer_each_message_exactly_once_in_order(
    tmp_path: Path, tiny_model_file: str
) -> None:
    async with FakeBotAPI(TOKEN) as api:
        env = bot_env(tmp_path, api, tiny_model_file, FAULT_GENERATION_DELAY_MS="200")
        first = await start_bot(env, tmp_path, api, "first")
        second = await start_bot(env, tmp_path, api, "second")
        try:
            for i in range(PER_CHAT):
                for chat in CHATS:
                    api.user_message(chat, f"message {i} hello how are you")
                await asyncio.sleep(0.3)
            for chat in CHATS:
                await api.wait_for_texts(chat, PER_CHAT, timeout_s=90)
            await asyncio.sleep(2.0)  # time for a duplicate to show up
            # One elected poller: getUpdates never had two consumers.
            assert not [c for c in api.calls_to("getUpdates") if c.status == 409]
            for bot in (first, second):
                bot.proc.send_signal(signal.SIGTERM)
            assert await first.wait(30) == 0 and await second.wait(30) == 0
        finally:
            first.kill()
            second.kill()
    counts = Counter(s.chat_id for s in api.sent)
    assert {chat: counts[chat] for chat in CHATS} == {chat: PER_CHAT for chat in CHATS}
    check_database(tmp_path, {chat: PER_CHAT for chat in CHATS})
    for out in (first.output(), second.output()):
        assert "Traceback" not in out


async def test_two_services_in_one_process_share_the_work_without_double_answers(
    sqlite_url: str, tmp_path: Path
) -> None:
    """The same claim, fast: two Service instances (two owners) on one SQLite file."""
    async with FakeBotAPI(IN_PROCESS_TOKEN) as api:
        # Two chats at a time each: the poller cannot take every chat, and a chat waiting for
        # a slot holds no lease, so the other replica takes it at its next scan (within a
        # second). A turn takes long enough that the poller's first two chats keep its slots
        # past that scan: with quick turns it could answer everything alone, every chat's lease
        # lingering with it between turns, and there would be nothing to share.
        engines = (EchoResponder(delay_s=0.3), EchoResponder(delay_s=0.3))
        settings = make_settings(
            sqlite_url, api, tmp_path, log_level="INFO", max_concurrent_chats=2
        )
        async with (
            running_service(settings, engines[0]) as one,
            running_service(settings, engines[1]),
        ):
            sent: dict[int, list[str]] = {chat: [] for chat in CHATS}
            for i in range(PER_CHAT * 2):
                for chat in CHATS:
                    text = f"message {i}"
                    api.user_message(chat, text)
                    sent[chat].append(text)
                await asyncio.sleep(0.05)
            for chat in CHATS:
                await api.wait_for_texts(chat, PER_CHAT * 2, timeout_s=30)
            # Both replicas idle (they share the database): a duplicate turn or send would be
            # queued or in flight until now.
            await settled(one, api)
        # One elected poller (no 409), and both processed part of the inbox.
        assert not [c for c in api.calls_to("getUpdates") if c.status == 409]
        assert all(responder.calls for responder in engines)
    for chat in CHATS:
        # Exactly once each, and in order, though two processes took turns.
        assert api.texts(chat) == [f"echo {chat}: {t}" for t in sent[chat]]
    calls = Counter(call for responder in engines for call in responder.calls)
    assert set(calls.values()) == {1}  # no update was even generated twice


async def test_the_poller_hands_over_on_stop_and_nothing_is_lost_or_answered_twice(
    sqlite_url: str, tmp_path: Path
) -> None:
    """SIGTERM's path (Service.stop) gives the poller lease back: the other replica polls
    within about a second, and the updates around the handover are answered exactly once."""
    async with FakeBotAPI(IN_PROCESS_TOKEN) as api:
        settings = make_settings(sqlite_url, api, tmp_path, log_level="INFO")
        first = running_service(settings, EchoResponder())
        one = await first.__aenter__()
        try:
            await polls(one)  # elected before the second one starts
            async with running_service(settings, EchoResponder()) as two:
                assert isinstance(one.ingest, ElectedPolling)
                assert isinstance(two.ingest, ElectedPolling)
                assert one.ingest.polling and not two.ingest.polling
                for i in range(3):
                    api.user_message(401, f"before {i}")
                await api.wait_for_texts(401, 3)
                await first.__aexit__(None, None, None)
                one = None
                for i in range(3):
                    api.user_message(401, f"after {i}")
                texts = await api.wait_for_texts(401, 6, timeout_s=15)
                assert two.ingest.polling
        finally:
            if one is not None:
                await first.__aexit__(None, None, None)
    assert texts == [f"echo 401: {w} {i}" for w in ("before", "after") for i in range(3)]
    assert not [c for c in api.calls_to("getUpdates") if c.status == 409]


async def test_a_replica_whose_heartbeats_stop_hands_over_polling_and_its_chats(
    sqlite_url: str, tmp_path: Path
) -> None:
    """As if the poller's database connection hung: it fences itself and stops polling, the
    other replica takes over the poller lease and the chat after TAKEOVER_AFTER_S, and no
    update is answered twice or lost."""
    async with FakeBotAPI(IN_PROCESS_TOKEN) as api:
        settings = make_settings(sqlite_url, api, tmp_path, takeover_after_s=1.0)
        async with running_service(settings, EchoResponder()) as one:
            await polls(one)  # elected before the second one starts
            async with running_service(settings, EchoResponder()) as two:
                await _heartbeats_stop(api, one, two)
    assert api.texts(402) == ["echo 402: first"] + [f"echo 402: then {i}" for i in range(3)]


async def _heartbeats_stop(api: FakeBotAPI, one: Service, two: Service) -> None:
    """The poller's heartbeats stop; the other replica takes polling and the chat over."""
    assert isinstance(one.ingest, ElectedPolling)
    assert isinstance(two.ingest, ElectedPolling)
    api.user_message(402, "first")
    await api.wait_for_texts(402, 1)
    assert one.ingest.polling
    one.heartbeat.pause()  # its heartbeats stop landing
    api.user_message(402, "then 0")  # while the handover is under way
    for _ in range(50):  # within 5 s: the lease's own TTL (10 s) would be too late
        if two.ingest.polling:
            break
        await asyncio.sleep(0.1)
    assert two.ingest.polling and not one.ingest.polling
    for i in (1, 2):
        api.user_message(402, f"then {i}")
    await api.wait_for_texts(402, 4, timeout_s=20)
    assert two.metrics.lease_takeovers.labels("poller")._value.get() == 1


async def polls(service: Service) -> None:
    """Wait until `service` is the elected poller (its election runs in the background)."""
    assert isinstance(service.ingest, ElectedPolling)
    for _ in range(200):
        if service.ingest.polling:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the first service never became the poller")
