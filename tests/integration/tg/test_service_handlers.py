"""Handlers: commands, turns, and a defined answer for every kind of bad input."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bot.texts import ENGLISH
from bot.tg import handlers
from tests.support.fakebotapi import BOT_ID, BOT_USERNAME, FakeBotAPI
from tests.support.fixtures import ServeSettings, StartService
from tests.support.service_harness import (
    EchoResponder,
    make_settings,
    rows,
    running_service,
    settled,
)

EDITED, NOT_TEXT, UNKNOWN_COMMAND = ENGLISH.EDITED, ENGLISH.NOT_TEXT, ENGLISH.UNKNOWN_COMMAND
HELP = ENGLISH.help("en")  # BOT_MODEL_LANGUAGE's default


async def test_a_command_followed_by_punctuation_is_that_command(
    api: FakeBotAPI, serve_db: ServeSettings
) -> None:
    """Telegram marks only "/help" in "/help." (a command is [A-Za-z0-9_]), and PTB runs /help's
    handler for it: the use case is /help's, not an error."""
    await serve_db(EchoResponder())
    api.user_message(102, "/help.")
    api.user_message(102, "/persona!")
    texts = await api.wait_for_texts(102, 2)
    assert texts[0] == HELP
    assert texts[1].startswith("I have no persona yet")


async def test_commands_persona_turns_done_and_forget(
    db_url: str, tmp_path: Path, api: FakeBotAPI, start_service: StartService
) -> None:
    chat = 101
    responder = EchoResponder()
    # Without the feedback buttons /done sends one text; the rating has tests of its own.
    settings = make_settings(db_url, api, tmp_path, feedback_buttons=False)
    service = await start_service(settings, responder)
    await api.wait_for(lambda: bool(api.commands), what="setMyCommands")
    assert [c["command"] for c in api.commands] == [
        "start", "help", "persona", "done", "forget", "context", "privacy", "lang",
    ]  # fmt: skip
    script = [
        "/start",
        "/persona",
        "/persona My name is Sarah.\nI love hiking.",
        "/persona",
        "hi there",
        "how are you",
        "/done",
        "/persona",
        "back again",
        "/persona clear",
        "/help",
    ]
    for line in script:
        api.user_message(chat, line)
    await api.wait_for_texts(chat, len(script))
    # /forget also drops texts not yet delivered, so it comes once the rest went out.
    api.user_message(chat, "/forget")
    api.user_message(chat, "/forget")
    texts = await api.wait_for_texts(chat, len(script) + 1)
    # The second /forget deletes the first one's confirmation if it is not out yet
    # (delivery re-reads every row before sending it): one or two confirmations.
    for _ in range(200):
        unsent = await rows(service, "SELECT count(*) FROM outbox WHERE sent_at IS NULL")
        if unsent == [(0,)]:
            break
        await asyncio.sleep(0.05)
    texts = api.texts(chat)
    assert len(texts) in (len(script) + 1, len(script) + 2)
    assert texts[0] == "Hi! " + HELP
    assert texts[1].startswith("I have no persona yet")
    assert texts[2] == "Got it. From now on: My name is Sarah.\nI love hiking."
    assert texts[3].startswith("My persona: My name is Sarah.\nI love hiking.")
    assert texts[4:6] == ["echo 101: hi there", "echo 101: how are you"]
    assert texts[6].startswith("Conversation ended")
    assert texts[7].startswith("My persona: My name is Sarah.")  # carried over
    assert texts[8] == "echo 101: back again"
    assert texts[9] == "Persona cleared. I'm just me now."
    assert texts[10] == HELP
    assert all(t.startswith("Done: I deleted everything") for t in texts[11:])
    assert await rows(service, "SELECT id FROM sessions") == []
    assert await rows(service, "SELECT id FROM messages") == []
    assert [c for c in api.calls_to("sendMessage") if c.params.get("parse_mode")] == []


async def test_non_text_edits_and_unknown_commands_get_a_defined_answer(
    api: FakeBotAPI, serve_sqlite: ServeSettings
) -> None:
    chat = 102
    responder = EchoResponder()
    service = await serve_sqlite(responder)
    api.user_message(chat, "/persona first")
    await api.wait_for_texts(chat, 1)
    sticker = {
        "file_id": "s", "file_unique_id": "s", "type": "regular",
        "width": 512, "height": 512, "is_animated": False, "is_video": False,
    }  # fmt: skip
    photo = [{"file_id": "p", "file_unique_id": "p", "width": 90, "height": 90}]
    voice = {"file_id": "v", "file_unique_id": "v", "duration": 2}
    api.user_message(chat, None, extra={"sticker": sticker})
    api.user_message(chat, None, extra={"photo": photo, "caption": "look"})
    api.user_message(chat, None, extra={"voice": voice})
    api.user_message(chat, "/persona second", kind="edited_message")
    api.user_message(chat, "an edited text", kind="edited_message")
    api.user_message(chat, "/nonsense")
    api.user_message(chat, "x" * 5000)
    api.user_message(chat, "/persona " + "p" * 1500)
    api.user_message(chat, "   ")  # whitespace only
    api.user_message(chat, "/persona")
    texts = (await api.wait_for_texts(chat, 11))[1:]
    assert texts[:3] == [NOT_TEXT] * 3
    assert texts[3:5] == [EDITED] * 2
    assert texts[5] == UNKNOWN_COMMAND
    assert texts[6].startswith("Your message is 5000 characters long")
    assert texts[7].startswith("That persona is 1500 characters long")
    assert texts[8] == "Say something and I'll answer."
    assert texts[9].startswith("My persona: first")  # the edit changed nothing
    assert responder.calls == []
    statuses = await rows(service, "SELECT DISTINCT status FROM inbox")
    assert statuses == [("done",)]


async def test_group_policy_mention(
    sqlite_url: str, tmp_path: Path, api: FakeBotAPI, start_service: StartService
) -> None:
    group = -5001
    responder = EchoResponder()
    settings = make_settings(sqlite_url, api, tmp_path, group_policy="mention")
    service = await start_service(settings, responder)
    chatter = api.user_message(group, "people talking", chat_type="group", user_id=1)
    api.user_message(group, "/help@other_bot", chat_type="group", user_id=1)
    api.user_message(group, "/unknown", chat_type="group", user_id=1)
    api.user_message(group, "a photo", chat_type="group", user_id=1,
                     extra={"photo": [{"file_id": "p", "file_unique_id": "p",
                                       "width": 9, "height": 9}]})  # fmt: skip
    api.user_message(group, f"@{BOT_USERNAME} how are you?", chat_type="group", user_id=1)
    api.user_message(group, "and you?", chat_type="group", user_id=2, reply_to_bot=True)
    api.user_message(group, "/help", chat_type="group", user_id=1)
    api.user_message(group, f"/nope@{BOT_USERNAME}", chat_type="group", user_id=1)
    api.user_message(group, f"@{BOT_USERNAME}", chat_type="group", user_id=1,
                     kind="edited_message")  # fmt: skip
    texts = await api.wait_for_texts(group, 4)
    await settled(service, api)  # every update closed, nothing left to send
    assert api.texts(group) == texts
    assert texts == [
        f"echo {group}: how are you?",
        f"echo {group}: and you?",
        HELP,
        UNKNOWN_COMMAND,
    ]
    # Group replies thread under the message they answer.
    assert all(s.reply_to for s in api.sent if s.text.startswith("echo"))
    inbox = dict(await rows(service, "SELECT update_id, status FROM inbox"))
    assert inbox[chatter] == "ignored"
    assert set(inbox.values()) == {"ignored", "done"}


@pytest.mark.parametrize(("policy", "answered"), [("all", 2), ("ignore", 0)])
async def test_group_policy_all_and_ignore(
    sqlite_url: str,
    tmp_path: Path,
    policy: str,
    answered: int,
    api: FakeBotAPI,
    start_service: StartService,
) -> None:
    group = -5002
    private = 5002
    responder = EchoResponder()
    settings = make_settings(sqlite_url, api, tmp_path, group_policy=policy)
    service = await start_service(settings, responder)
    api.user_message(group, "hello group", chat_type="supergroup", user_id=1)
    api.user_message(group, "/help", chat_type="supergroup", user_id=1)
    api.user_message(private, "private still works")
    await api.wait_for_texts(private, 1)
    await api.wait_for(lambda: len(api.texts(group)) >= answered)
    await settled(service, api)
    assert len(api.texts(group)) == answered


async def test_flood_limit_keeps_messages_and_sends_one_notice(
    sqlite_url: str, tmp_path: Path, api: FakeBotAPI, start_service: StartService
) -> None:
    flooder, calm = 201, 202
    responder = EchoResponder()
    settings = make_settings(sqlite_url, api, tmp_path, flood_max_messages=3, flood_window_s=60)
    service = await start_service(settings, responder)
    for i in range(8):
        api.user_message(flooder, f"spam {i}")
    api.user_message(calm, "just one")
    await api.wait_for_texts(calm, 1)
    texts = await api.wait_for_texts(flooder, 4)
    await settled(service, api)
    texts = api.texts(flooder)
    assert texts[:3] == [f"echo {flooder}: spam {i}" for i in range(3)]
    assert len(texts) == 4 and "faster than I can answer" in texts[3]
    assert api.texts(calm) == [f"echo {calm}: just one"]
    stored = await rows(
        service,
        "SELECT role, text FROM messages WHERE chat_id = :c ORDER BY id",
        c=flooder,
    )
    users = [t for role, t in stored if role == "user"]
    assert users == [f"spam {i}" for i in range(8)]  # nothing dropped
    assert len(stored) == 8 + 3


async def test_typing_indicator_is_repeated_while_the_model_works(
    monkeypatch: pytest.MonkeyPatch,
    api: FakeBotAPI,
    serve_sqlite: ServeSettings,
) -> None:
    monkeypatch.setattr(handlers, "TYPING_INTERVAL_S", 0.2)
    responder = EchoResponder(delay_s=1.0)
    # private chats stream drafts instead (tests/integration/tg/test_service_drafts.py)
    await serve_sqlite(responder, stream_replies=False)
    api.user_message(301, "think hard")
    await api.wait_for_texts(301, 1)
    actions = api.calls_to("sendChatAction")
    assert len(actions) >= 4
    assert {a.params["action"] for a in actions} == {"typing"}
    count = len(actions)
    # Nothing may follow: a typing loop still running would send within one interval (0.2 s);
    # no event says it stopped, so this waits one and a half intervals.
    await asyncio.sleep(0.3)
    assert len(api.calls_to("sendChatAction")) == count  # stopped with the turn


async def test_stats_is_for_admins_only(sqlite_url: str, tmp_path: Path, api: FakeBotAPI) -> None:
    admin, user = 401, 402
    settings = make_settings(sqlite_url, api, tmp_path, admin_user_ids=[admin])
    async with running_service(settings, EchoResponder()):
        api.user_message(user, "hello")
        api.user_message(user, "/stats")
        await api.wait_for_texts(user, 2)
        api.user_message(admin, "/stats")
        (stats,) = await api.wait_for_texts(admin, 1)
    assert api.texts(user)[1] == UNKNOWN_COMMAND
    assert stats.startswith("Bot stats at")
    assert "Chats: 1" in stats and "2 in total" in stats


async def test_bot_id_and_username_come_from_getme(
    sqlite_url: str,
    tmp_path: Path,
    api: FakeBotAPI,
    start_service: StartService,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The group tests rely on the bot knowing itself from getMe: here getMe names another bot,
    # and only mentions of that one, and replies to its messages, are answered.
    old = FakeBotAPI.me(api)
    renamed = {**old, "id": BOT_ID + 1, "username": "renamed_bot"}
    monkeypatch.setattr(api, "me", lambda: renamed)
    group = -5003
    settings = make_settings(sqlite_url, api, tmp_path, group_policy="mention")
    service = await start_service(settings, EchoResponder())
    assert (service.application.bot.id, service.application.bot.username) == (
        BOT_ID + 1,
        "renamed_bot",
    )
    earlier = {"message_id": 999, "date": 0, "chat": {"id": group, "type": "group", "title": "G"}}
    api.user_message(group, f"@{BOT_USERNAME} old name", chat_type="group", user_id=1)
    api.user_message(group, "@renamed_bot new name", chat_type="group", user_id=1)
    api.user_message(group, "to the new one", chat_type="group", user_id=2, reply_to_bot=True)
    to_old = {"reply_to_message": {**earlier, "from": old, "text": "hi"}}
    api.user_message(group, "to the old one", chat_type="group", user_id=3, extra=to_old)
    api.user_message(group, "/help", chat_type="group", user_id=1)  # answered: in order
    texts = await api.wait_for_texts(group, 3)
    await settled(service, api)
    assert (
        api.texts(group)
        == texts
        == [
            f"echo {group}: new name",
            f"echo {group}: to the new one",
            HELP,
        ]
    )


async def test_a_message_right_after_forget_is_still_answered(
    api: FakeBotAPI, serve_sqlite: ServeSettings
) -> None:
    # Regression: /forget deletes the chat's inbox rows, the still-pending next update included.
    responder = EchoResponder()
    service = await serve_sqlite(responder)
    api.user_message(103, "/forget")
    api.user_message(103, "hello after forget")
    texts = await api.wait_for_texts(103, 2)
    assert texts[1] == "echo 103: hello after forget"
    assert responder.calls == [(103, "hello after forget")]
    statuses = await rows(service, "SELECT status FROM inbox ORDER BY update_id")
    assert statuses == [("done",), ("done",)]
