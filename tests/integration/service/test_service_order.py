"""The sequencer: per-chat order, cross-chat concurrency, retries, shutdown and restart."""

from __future__ import annotations

import random
from pathlib import Path

from bot.config import Settings
from bot.texts import ENGLISH
from tests.support.fakebotapi import FakeBotAPI
from tests.support.fixtures import ServeSettings, StartService
from tests.support.service_harness import EchoResponder, make_settings, rows, running_service


async def test_five_messages_at_once_are_answered_in_order(
    api: FakeBotAPI, serve_db: ServeSettings
) -> None:
    rng = random.Random(5)
    # Random generation times would reorder the replies of a sequencer that did not wait.
    responder = EchoResponder(delay_s=lambda chat, text: rng.uniform(0.0, 0.15))
    svc = await serve_db(responder)
    sent = [f"message {i}" for i in range(5)]
    for text in sent:
        api.user_message(901, text)
    texts = await api.wait_for_texts(901, 5)
    assert texts == [f"echo 901: {t}" for t in sent]
    assert responder.calls == [(901, t) for t in sent]
    history = await rows(svc, "SELECT role, text FROM messages ORDER BY id")
    expected = []
    for text in sent:
        expected += [("user", text), ("bot", f"echo 901: {text}")]
    assert history == expected


async def test_twenty_chats_at_once_get_their_own_replies(
    db_url: str, tmp_path: Path, api: FakeBotAPI, start_service: StartService
) -> None:
    chats = list(range(1001, 1021))
    in_parallel = 0
    peak = 0

    def delay(chat: int, text: str) -> float:
        nonlocal in_parallel, peak
        in_parallel = responder.in_progress
        peak = max(peak, in_parallel)
        return 0.2

    responder = EchoResponder(delay_s=delay)
    settings = make_settings(db_url, api, tmp_path, max_concurrent_chats=8)
    svc = await start_service(settings, responder)
    for round_ in range(2):
        for chat in chats:
            api.user_message(chat, f"chat {chat} says {round_}")
    for chat in chats:
        texts = await api.wait_for_texts(chat, 2)
        assert texts == [f"echo {chat}: chat {chat} says {r}" for r in range(2)]
    assert 2 <= peak <= 8  # concurrent, and bounded
    sessions = await rows(svc, "SELECT id, chat_id FROM sessions")
    assert sorted(c for _, c in sessions) == chats
    session_chat = dict(sessions)
    for session_id, chat_id, text in await rows(
        svc, "SELECT session_id, chat_id, text FROM messages"
    ):
        assert session_chat[session_id] == chat_id
        assert f"chat {chat_id} says" in text
    (count,) = await rows(svc, "SELECT count(*) FROM messages")
    assert count == (len(chats) * 4,)


async def test_a_slow_chat_does_not_block_another(
    api: FakeBotAPI, serve_sqlite: ServeSettings
) -> None:
    responder = EchoResponder(delay_s=lambda chat, text: 1.5 if chat == 1101 else 0.0)
    await serve_sqlite(responder)
    api.user_message(1101, "slow one")
    api.user_message(1102, "quick one")
    await api.wait_for_texts(1102, 1)
    assert api.texts(1101) == []
    await api.wait_for_texts(1101, 1)


async def test_a_failing_update_is_retried_then_apologised_for_and_the_chat_goes_on(
    api: FakeBotAPI, serve_sqlite: ServeSettings
) -> None:
    responder = EchoResponder()
    responder.fail_on = {"boom"}
    svc = await serve_sqlite(responder)
    bad = api.user_message(1201, "boom")
    api.user_message(1201, "after the boom")
    texts = await api.wait_for_texts(1201, 2)
    assert texts == [ENGLISH.APOLOGY, "echo 1201: after the boom"]
    assert responder.calls.count((1201, "boom")) == 3
    (row,) = await rows(svc, f"SELECT status, attempts, error FROM inbox WHERE update_id = {bad}")
    assert row[0] == "failed" and row[1] >= 2 and "responder exploded" in row[2]
    # The failed turn left nothing half-written.
    history = await rows(svc, "SELECT text FROM messages ORDER BY id")
    assert history == [("after the boom",), ("echo 1201: after the boom",)]


async def _stopped_while_generating(
    settings: Settings, api: FakeBotAPI, delay_s: float, chat: int, text: str
) -> EchoResponder:
    """The service stopped gracefully (running_service's exit) while its responder, which
    takes `delay_s` a reply, generates the reply to `chat`'s `text`; that responder."""
    responder = EchoResponder(delay_s=delay_s)
    async with running_service(settings, responder):
        api.user_message(chat, text)
        await api.wait_for(lambda: responder.in_progress == 1, what="generation")
    return responder


async def test_stop_finishes_the_turn_in_progress_and_sends_its_reply(
    sqlite_url: str, tmp_path: Path, api: FakeBotAPI
) -> None:
    settings = make_settings(sqlite_url, api, tmp_path, shutdown_grace_s=5)
    responder = await _stopped_while_generating(settings, api, 1.0, 1301, "answer before you go")
    assert api.texts(1301) == ["echo 1301: answer before you go"]
    assert responder.closed


async def test_a_turn_cut_off_by_the_grace_period_is_answered_after_restart(
    sqlite_url: str, tmp_path: Path, api: FakeBotAPI
) -> None:
    settings = make_settings(sqlite_url, api, tmp_path, shutdown_grace_s=0.3)
    await _stopped_while_generating(settings, api, 30.0, 1401, "too slow")
    assert api.texts(1401) == []
    fast = EchoResponder()
    async with running_service(settings, fast, migrate_db=False) as svc:
        assert await api.wait_for_texts(1401, 1) == ["echo 1401: too slow"]
        assert fast.calls == [(1401, "too slow")]
        history = await rows(svc, "SELECT role, text FROM messages ORDER BY id")
        assert history == [("user", "too slow"), ("bot", "echo 1401: too slow")]
