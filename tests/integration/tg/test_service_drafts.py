"""Streamed drafts through the real PTB Application and the loopback Bot API (bot/tg/drafts.py).

A private chat sees "Thinking…" (an empty draft) at once, then the growing text; the final
message is a sendMessage whose text is exactly the stored reply; groups keep the typing
indicator; a draft method that fails or hangs never loses the final reply, and no draft
reaches the chat after it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.tg import drafts
from tests.support.fakebotapi import BOT_USERNAME, FakeBotAPI, Fault
from tests.support.fixtures import ServeSettings, StartService
from tests.support.service_harness import EchoResponder, make_settings, rows


async def _stored_reply(service: object, chat_id: int) -> str:
    [(text,)] = await rows(
        service,  # type: ignore[arg-type]
        "SELECT text FROM messages WHERE chat_id = :c AND role = 'bot'",
        c=chat_id,
    )
    return str(text)


async def test_a_private_chat_sees_thinking_then_the_draft_then_the_stored_reply(
    api: FakeBotAPI, serve_sqlite: ServeSettings
) -> None:
    service = await serve_sqlite(EchoResponder(0.4))
    api.user_message(501, "tell me more")
    [final] = await api.wait_for_texts(501, 1)
    assert api.drafts_to(501) == ["", "echo"]  # "Thinking…" at once, then the draft
    assert final == await _stored_reply(service, 501) == "echo 501: tell me more"
    [draft_ids] = [{d.draft_id for d in api.drafts}]
    assert len(draft_ids) == 1 and 0 not in draft_ids  # one growing draft
    last_draft = max(d.at for d in api.drafts)
    assert last_draft <= api.last_sent(501).at  # drafts come before the message
    assert api.calls_to("sendChatAction") == []  # the draft replaces "typing…"


async def test_groups_keep_the_typing_indicator_and_get_no_drafts(
    api: FakeBotAPI, serve_sqlite: ServeSettings
) -> None:
    responder = EchoResponder(0.4)
    await serve_sqlite(responder)
    api.user_message(-502, f"@{BOT_USERNAME} hello all", user_id=7, chat_type="group")
    await api.wait_for_texts(-502, 1)
    assert api.drafts == [] and api.calls_to("sendMessageDraft") == []
    assert responder.drafted == []  # no sink at all: nothing streamed in the worker either
    assert {c.params["action"] for c in api.calls_to("sendChatAction")} == {"typing"}


async def test_stream_replies_off_means_typing_only(
    sqlite_url: str, tmp_path: Path, api: FakeBotAPI, start_service: StartService
) -> None:
    settings = make_settings(sqlite_url, api, tmp_path, stream_replies=False)
    await start_service(settings, EchoResponder(0.4))
    api.user_message(503, "hello")
    await api.wait_for_texts(503, 1)
    assert api.calls_to("sendMessageDraft") == []
    assert api.calls_to("sendChatAction")


@pytest.mark.parametrize("status", [400, 429])
async def test_a_failing_draft_method_loses_nothing(
    status: int,
    api: FakeBotAPI,
    serve_sqlite: ServeSettings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An older client (400) or a flood limit (429, retry after 30 s): the drafts fail, the
    reply arrives (the drafts' timeout is a minute here: it is not what saves the reply), and
    nothing retries a draft. After the 429 the drafts pause: the second one is not even
    tried."""
    monkeypatch.setattr(drafts, "DRAFT_TIMEOUT_S", 60.0)
    api.fail_drafts(status)
    service = await serve_sqlite(EchoResponder(0.4))
    api.user_message(504, "still there?")
    [final] = await api.wait_for_texts(504, 1, timeout_s=10.0)
    assert final == await _stored_reply(service, 504)
    calls = api.calls_to("sendMessageDraft")
    assert [c.status for c in calls] == ([400, 400] if status == 400 else [429])
    assert api.drafts == []


async def test_a_hanging_draft_delays_the_reply_by_its_timeout_only(
    api: FakeBotAPI,
    serve_sqlite: ServeSettings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every draft hangs for a minute: the reply waits for the draft in flight only as long as
    the draft's own timeout (1 s here), then arrives while that draft is still unanswered."""
    monkeypatch.setattr(drafts, "DRAFT_TIMEOUT_S", 1.0)
    api.fail_drafts(None, delay=60.0)
    service = await serve_sqlite(EchoResponder(0.2))
    api.user_message(505, "quick one")
    [final] = await api.wait_for_texts(505, 1, timeout_s=10.0)
    assert final == await _stored_reply(service, 505)
    [thinking] = api.calls_to("sendMessageDraft")  # the second was dropped: one in flight
    assert thinking.status is None  # still hanging when the reply was sent


async def test_a_draft_in_flight_reaches_telegram_before_the_reply(
    api: FakeBotAPI,
    serve_sqlite: ServeSettings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The "echo" draft takes Telegram a second to answer, and the reply is ready long before:
    the reply is sent only after that draft was answered, never before it."""
    monkeypatch.setattr(drafts, "DRAFT_TIMEOUT_S", 30.0)
    api.inject(Fault("sendMessageDraft", None, delay=1.0, skip=1))  # "Thinking…" goes through
    service = await serve_sqlite(EchoResponder(0.4))
    api.user_message(508, "in flight")
    [final] = await api.wait_for_texts(508, 1, timeout_s=15.0)
    assert final == await _stored_reply(service, 508)
    assert api.drafts_to(508) == ["", "echo"]
    assert max(d.at for d in api.drafts) <= api.last_sent(508).at


async def test_drafts_wait_out_a_replys_429(
    api: FakeBotAPI,
    serve_sqlite: ServeSettings,
) -> None:
    """One budget for replies and drafts: while the replies wait out Telegram's 429 (retry
    after 2 s), no draft goes either, though another chat is generating meanwhile; its drafts
    come after the wait."""
    a, b = 509, 510
    api.inject(Fault("sendMessage", 429, retry_after=2, chat_id=a))
    responder = EchoResponder(lambda chat, _text: 5.0 if chat == b else 0.0)
    await serve_sqlite(responder)
    api.user_message(a, "a quick one")
    await api.wait_for(
        lambda: any(c.status == 429 for c in api.calls_to("sendMessage")), what="the 429"
    )
    [limited] = [c for c in api.calls_to("sendMessage") if c.status == 429]
    api.user_message(b, "a slow one")
    await api.wait_for_texts(a, 1, timeout_s=10.0)
    await api.wait_for_texts(b, 1, timeout_s=15.0)
    assert "echo" in api.drafts_to(b)
    drafts_b = [c for c in api.calls_to("sendMessageDraft") if int(c.params["chat_id"]) == b]
    assert all(c.at >= limited.at + 2 for c in drafts_b)


async def test_a_429_on_one_chats_draft_holds_no_other_chats_reply(
    api: FakeBotAPI,
    serve_sqlite: ServeSettings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A's drafts hit a 429 (retry after 30 s) while A generates: B's reply arrives while A
    is still generating, and A's reply after it."""
    monkeypatch.setattr(drafts, "DRAFT_TIMEOUT_S", 60.0)
    a, b = 506, 507
    api.inject(Fault("sendMessageDraft", 429, retry_after=30, chat_id=a, times=10**9))
    responder = EchoResponder(lambda chat, _text: 4.0 if chat == a else 0.2)
    await serve_sqlite(responder)
    api.user_message(a, "a long one")
    await api.wait_for(lambda: bool(api.calls_to("sendMessageDraft")), what="A's draft")
    api.user_message(b, "a short one")
    await api.wait_for_texts(b, 1, timeout_s=10.0)
    assert responder.in_progress == 1 and api.texts(a) == []  # A is still generating
    await api.wait_for_texts(a, 1, timeout_s=15.0)
