"""Delivery: Telegram's faults, long replies in parts, never a text twice."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from bot.conversations.store import ConversationStore
from bot.db import inbox, migrate, outbox
from bot.db.engine import make_engine, make_sessionmaker
from bot.service import chat_pool, delivery
from bot.service.delivery import split_message
from tests.support.fakebotapi import BOT_USERNAME, FakeBotAPI, Fault
from tests.support.fixtures import ServeSettings, StartService
from tests.support.service_harness import (
    EchoResponder,
    make_settings,
    rows,
    running_service,
    settled,
)


async def test_a_429_delays_the_reply_but_delivers_it_once(
    api: FakeBotAPI, serve_sqlite: ServeSettings
) -> None:
    api.inject(Fault("sendMessage", status=429, retry_after=1, times=1))
    svc = await serve_sqlite(EchoResponder())
    api.user_message(501, "please answer")
    assert await api.wait_for_texts(501, 1) == ["echo 501: please answer"]
    refused, accepted = api.calls_to("sendMessage")
    assert refused.status == 429 and accepted.status == 200
    assert accepted.at - refused.at >= 0.95  # waited retry_after
    await settled(svc, api)
    assert api.texts(501) == ["echo 501: please answer"]
    assert await rows(svc, "SELECT count(*) FROM outbox WHERE sent_at IS NULL") == [(0,)]
    delivered = await rows(
        svc, "SELECT count(*) FROM messages WHERE role = 'bot' AND delivered_at IS NOT NULL"
    )
    assert delivered == [(1,)]


async def test_server_errors_and_timeouts_are_retried(
    sqlite_url: str, tmp_path: Path, api: FakeBotAPI, start_service: StartService
) -> None:
    api.inject(
        Fault("sendMessage", status=500, times=1),
        Fault("sendMessage", status=502, times=1),
        # Longer than the client's timeout; the server then fails it, so nothing was sent.
        Fault("sendMessage", status=504, delay=1.5, times=1),
        Fault("getUpdates", status=502, times=2),
        Fault("sendChatAction", status=500, times=5),
    )
    settings = make_settings(sqlite_url, api, tmp_path)
    svc = await start_service(settings, EchoResponder(), timeout_s=1.0)
    api.user_message(502, "are you there")
    assert await api.wait_for_texts(502, 1, timeout_s=15) == ["echo 502: are you there"]
    await api.wait_for(lambda: api.calls_to("sendMessage")[2].status is not None)
    statuses = [c.status for c in api.calls_to("sendMessage")]
    assert statuses == [500, 502, 504, 200]
    (attempts,) = await rows(svc, "SELECT attempts FROM outbox")
    assert attempts == (3,)


async def test_a_blocked_chat_stops_retrying_and_others_are_unaffected(
    api: FakeBotAPI, serve_db: ServeSettings
) -> None:
    blocked, fine = 601, 602
    api.inject(Fault("sendMessage", status=403, chat_id=blocked, times=100))
    svc = await serve_db(EchoResponder())
    api.user_message(blocked, "one")
    api.user_message(blocked, "two")
    api.user_message(fine, "hello")
    await api.wait_for_texts(fine, 1)
    outbox = f"SELECT count(*) FROM outbox WHERE chat_id = {blocked} AND failed_at IS NOT NULL"

    async def both_failed() -> bool:
        return await rows(svc, outbox) == [(2,)]

    for _ in range(200):
        if await both_failed():
            break
        await asyncio.sleep(0.02)
    assert await both_failed()
    tries = len([c for c in api.calls_to("sendMessage") if c.params["chat_id"] == str(blocked)])
    await settled(svc, api)  # nothing left to send: a retry would have to come now
    assert tries == len(
        [c for c in api.calls_to("sendMessage") if c.params["chat_id"] == str(blocked)]
    )
    assert tries <= 2
    # Both turns are stored; only delivery gave up.
    (count,) = await rows(svc, f"SELECT count(*) FROM messages WHERE chat_id = {blocked}")
    assert count == (4,)


async def test_a_long_reply_goes_out_in_parts_and_a_retry_resends_no_part(
    api: FakeBotAPI, serve_sqlite: ServeSettings
) -> None:
    long_reply = ("Sentence number one is here. " * 200 + "\n\n") * 3  # ~17,400 characters
    parts = split_message(long_reply)
    assert len(parts) == 5
    responder = EchoResponder()
    responder.reply_override = lambda chat, text: long_reply
    svc = await serve_sqlite(responder)
    # The third part fails twice (5xx, then a 429); parts sent must not repeat.
    api.inject(
        Fault("sendMessage", status=500, times=1, skip=2),
        Fault("sendMessage", status=429, retry_after=1, times=1, skip=2),
    )
    api.user_message(701, "tell me a long story")
    await api.wait_for_texts(701, 5, timeout_s=15)
    await settled(svc, api)
    assert api.texts(701) == parts
    statuses = [c.status for c in api.calls_to("sendMessage")]
    assert statuses == [200, 200, 500, 429, 200, 200, 200]
    assert await rows(svc, "SELECT parts_sent, sent_at IS NOT NULL FROM outbox") == [(4, 1)]


async def test_undelivered_texts_are_sent_at_start_resuming_after_sent_parts(
    sqlite_url: str, tmp_path: Path, api: FakeBotAPI
) -> None:
    text = "x" * 5000 + " " + "y" * 5000 + " " + "z" * 100
    parts = split_message(text)
    assert len(parts) == 3
    await asyncio.to_thread(migrate.upgrade, sqlite_url)
    engine = make_engine(sqlite_url)
    sm = make_sessionmaker(engine)
    async with sm.begin() as db:
        first = await outbox.enqueue(db, chat_id=801, kind="notice", text=text)
        await outbox.part_sent(db, first, 1)  # a crash after the first part went out
        await outbox.enqueue(db, chat_id=801, kind="notice", text="and then this")
        await outbox.enqueue(db, chat_id=802, kind="notice", text="for someone else")
    await engine.dispose()
    settings = make_settings(sqlite_url, api, tmp_path)
    async with running_service(settings, EchoResponder(), migrate_db=False):
        texts = await api.wait_for_texts(801, 3)
        await api.wait_for_texts(802, 1)
    assert texts == [parts[1], parts[2], "and then this"]


@pytest.mark.parametrize("fresh_s", [chat_pool.FRESH_S, 60.0])
async def test_a_reply_deleted_by_forget_while_queued_is_never_sent(
    sqlite_url: str,
    tmp_path: Path,
    api: FakeBotAPI,
    start_service: StartService,
    monkeypatch: pytest.MonkeyPatch,
    fresh_s: float,
) -> None:
    # Issue 11.5: delivery looped over rows it had read earlier, so replies that /forget
    # deleted while an earlier one was still being sent went out anyway. Only the first row
    # of a read skips the re-read (FRESH_S): with a FRESH_S longer than the whole test, the
    # others must still be read again.
    monkeypatch.setattr(chat_pool, "FRESH_S", fresh_s)
    chat = 531
    await asyncio.to_thread(migrate.upgrade, sqlite_url)
    engine = make_engine(sqlite_url)
    try:
        store = ConversationStore(make_sessionmaker(engine))
        session = await store.active_session(chat, chat)
        for text in ("one", "two", "three"):  # replies a crash left undelivered
            await store.record_turn(session.id, chat, text, f"reply to {text}")
    finally:
        await engine.dispose()
    api.inject(Fault("sendMessage", status=None, delay=1.5, times=1, chat_id=chat))
    settings = make_settings(sqlite_url, api, tmp_path)
    svc = await start_service(settings, EchoResponder(), migrate_db=False)
    await api.wait_for(lambda: api.calls_to("sendMessage") != [], what="sendMessage")
    api.user_message(chat, "/forget")  # while "reply to one" is on its way
    texts = await api.wait_for_texts(chat, 2)
    await settled(svc, api)  # no send in flight, none queued: no stale reply can follow
    assert (
        api.texts(chat)
        == texts
        == [
            "reply to one",  # already in flight when /forget came
            "Done: I deleted everything I had stored about this chat.",
        ]
    )
    assert await rows(svc, "SELECT count(*) FROM outbox WHERE sent_at IS NULL") == [(0,)]


@pytest.mark.parametrize("blind", ["outbox", "inbox and outbox"])
async def test_updates_and_replies_are_handed_on_without_a_scan(
    api: FakeBotAPI, serve_db: ServeSettings, monkeypatch: pytest.MonkeyPatch, blind: str
) -> None:
    # Polling hands the inbox worker the chats of the batch it committed, and the inbox worker
    # hands delivery the chats its committed transactions queued texts for
    # (bot.db.outbox.watching_queued): with scans that find nothing, replies still go out.
    async def nothing(*_args: object, **_kwargs: object) -> list[int]:
        return []

    monkeypatch.setattr(outbox, "pending_chats", nothing)
    if blind == "inbox and outbox":
        monkeypatch.setattr(inbox, "pending_chats", nothing)
    svc = await serve_db(EchoResponder())
    api.user_message(541, "first")
    assert await api.wait_for_texts(541, 1) == ["echo 541: first"]
    api.user_message(541, "second")
    api.user_message(542, "another chat")
    assert await api.wait_for_texts(541, 2) == ["echo 541: first", "echo 541: second"]
    assert await api.wait_for_texts(542, 1) == ["echo 542: another chat"]
    await settled(svc, api)
    assert await rows(svc, "SELECT count(*) FROM outbox WHERE sent_at IS NULL") == [(0,)]


async def test_replies_go_out_a_few_chats_at_a_time_and_groups_never_wait_for_them(
    api: FakeBotAPI, serve_sqlite: ServeSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # DELIVERY_CONCURRENCY=4: two private chats and two groups are sent to at once. Two
    # private chats' sends hang at the Bot API; a third private chat's reply waits for a
    # slot, while a group's reply goes out; once the hanging chats have held their slots for
    # SLOT_HOLD_S they give them back, and the third reply goes out while they still hang.
    monkeypatch.setattr(delivery, "SLOT_HOLD_S", 3.0)
    holds = {chat: asyncio.Event() for chat in (551, 552)}
    api.inject(*(Fault("sendMessage", status=None, hold=h, chat_id=c) for c, h in holds.items()))
    svc = await serve_sqlite(EchoResponder(), delivery_concurrency=4)

    def sent_to() -> set[int]:
        return {int(c.params["chat_id"]) for c in api.calls_to("sendMessage")}

    for chat in holds:
        api.user_message(chat, "hello")
        await api.wait_for(lambda chat=chat: chat in sent_to(), what=f"a send to {chat}")
    held_at = time.monotonic()
    api.user_message(553, "third")
    for _ in range(500):  # until the third chat's reply is committed
        if await rows(svc, "SELECT count(*) FROM outbox WHERE chat_id = 553") == [(1,)]:
            break
        await asyncio.sleep(0.02)
    assert await rows(svc, "SELECT count(*) FROM outbox WHERE chat_id = 553") == [(1,)]
    api.user_message(-554, f"@{BOT_USERNAME} hello all", user_id=9, chat_type="group")
    assert len(await api.wait_for_texts(-554, 1)) == 1
    assert 553 not in sent_to()
    assert time.monotonic() - held_at < 3.0  # (else the check above proves nothing)

    assert await api.wait_for_texts(553, 1, timeout_s=10) == ["echo 553: third"]
    assert time.monotonic() - held_at >= 2.5  # it waited for a slot given back
    assert not api.texts(551) and not api.texts(552)  # still hanging
    for hold in holds.values():
        hold.set()
    await settled(svc, api)
    for chat in (551, 552):
        assert api.texts(chat) == [f"echo {chat}: hello"]
    assert await rows(svc, "SELECT count(*) FROM outbox WHERE sent_at IS NULL") == [(0,)]
