"""Persona presets and their deep links, and /privacy, through the real PTB Application and
the loopback Bot API."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bot.app import Service
from bot.config import ConfigError
from bot.presets import load_presets
from bot.texts import ENGLISH as texts
from tests.support.fakebotapi import FakeBotAPI, Fault
from tests.support.fixtures import StartService
from tests.support.service_harness import EchoResponder, make_settings, rows, settled

PRESETS = """\
[presets]
sarah = "My name is Sarah. I love hiking."
chef = "I am a chef in Lyon."
"""


def _presets_file(tmp_path: Path) -> Path:
    path = tmp_path / "personas.toml"
    path.write_text(PRESETS)
    return path


async def test_presets_list_use_and_the_deep_link(
    db_url: str, tmp_path: Path, api: FakeBotAPI, start_service: StartService
) -> None:
    settings = make_settings(db_url, api, tmp_path, personas_file=_presets_file(tmp_path))
    service = await start_service(settings, EchoResponder())
    api.user_message(701, "/persona list")
    api.user_message(701, "/persona use chef")
    api.user_message(701, "/persona use pirate")
    sent = await api.wait_for_texts(701, 3)
    assert sent[0] == texts.presets_list(
        {"sarah": "My name is Sarah. I love hiking.", "chef": "I am a chef in Lyon."}
    )
    assert sent[1] == texts.persona_set("I am a chef in Lyon.")
    assert sent[2] == texts.preset_unknown("pirate", ["sarah", "chef"])
    # t.me/<bot>?start=persona_sarah: Telegram sends "/start persona_sarah".
    api.user_message(702, "/start persona_sarah")
    api.user_message(703, "/start persona_nobody")
    [first] = await api.wait_for_texts(702, 1)
    assert first == "Hi! " + texts.persona_set("My name is Sarah. I love hiking.") + (
        "\n\n" + texts.help("en")
    )
    [other] = await api.wait_for_texts(703, 1)
    assert other.endswith(texts.preset_unknown("nobody", ["sarah", "chef"]))
    personas = dict(await rows(service, "SELECT chat_id, persona FROM sessions"))
    assert personas == {701: "I am a chef in Lyon.", 702: "My name is Sarah. I love hiking."}


async def test_without_presets_the_commands_say_so(
    db_url: str, tmp_path: Path, api: FakeBotAPI, start_service: StartService
) -> None:
    await start_service(make_settings(db_url, api, tmp_path), EchoResponder())
    api.user_message(711, "/persona list")
    api.user_message(711, "/persona use sarah")
    assert await api.wait_for_texts(711, 2) == [texts.NO_PRESETS, texts.NO_PRESETS]


def test_a_bad_presets_file_is_one_line_per_problem(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text('[presets]\n"bad name" = "x"\nempty = ""\nlong = "' + "x" * 50 + '"\n')
    with pytest.raises(ConfigError) as caught:
        load_presets(path, max_chars=20)
    assert [line.strip() for line in str(caught.value).splitlines()[1:]] == [
        "preset 'bad name': names are 1-56 of A-Z a-z 0-9 _ - (deep links)",
        "preset 'empty': the persona must be a non-empty string",
        "preset 'long': longer than PERSONA_MAX_CHARS (20)",
    ]


async def test_privacy_says_what_is_kept_and_the_operator_can_replace_it(
    db_url: str, tmp_path: Path, api: FakeBotAPI, start_service: StartService
) -> None:
    await start_service(make_settings(db_url, api, tmp_path, retention_days=30), EchoResponder())
    api.user_message(721, "/privacy")
    [notice] = await api.wait_for_texts(721, 1)
    assert notice == texts.privacy(30)
    assert "30 days" in notice and "/forget" in notice


async def test_a_privacy_file_replaces_the_notice(
    db_url: str, tmp_path: Path, api: FakeBotAPI, start_service: StartService
) -> None:
    own = tmp_path / "privacy.txt"
    own.write_text("We keep nothing longer than a week. Ask @operator.\n")
    await start_service(make_settings(db_url, api, tmp_path, privacy_file=own), EchoResponder())
    api.user_message(731, "/privacy")
    assert await api.wait_for_texts(731, 1) == [
        "We keep nothing longer than a week. Ask @operator."
    ]


async def test_editing_the_last_message_regenerates_the_reply_in_place(
    db_url: str, tmp_path: Path, api: FakeBotAPI, start_service: StartService
) -> None:
    chat = 741
    service = await start_service(make_settings(db_url, api, tmp_path), EchoResponder())
    api.user_message(chat, "hello there")
    first = api.history[-1]["message"]["message_id"]
    await api.wait_for_texts(chat, 1)
    api.user_message(chat, "how are yuo")
    second = api.history[-1]["message"]["message_id"]
    await api.wait_for_texts(chat, 2)
    reply = api.last_sent(chat)
    [(old_reply_id,)] = await rows(service, "SELECT max(id) FROM messages WHERE role = 'bot'")
    _, query = api.press(chat, reply.message_id, f"v:{old_reply_id}:1")  # a vote on the old one
    await api.wait_for(lambda: query in api.callback_answers, what="the vote")

    api.user_message(chat, "how are you", kind="edited_message", message_id=second)
    await api.wait_for(lambda: bool(api.edits), what="the reply edited in place")
    assert api.edits == [(chat, reply.message_id, "echo 741: how are yuo", "echo 741: how are you")]
    assert len(api.texts(chat)) == 2  # nothing new sent
    history = await rows(service, "SELECT role, text FROM messages ORDER BY id")
    assert history == [
        ("user", "hello there"),
        ("bot", "echo 741: hello there"),
        ("user", "how are you"),
        ("bot", "echo 741: how are you"),
    ]
    assert await rows(service, "SELECT count(*) FROM votes") == [(0,)]  # the old reply's vote
    # The new reply carries buttons for itself.
    [(new_reply_id,)] = await rows(service, "SELECT max(id) FROM messages WHERE role = 'bot'")
    buttons = reply.reply_markup["inline_keyboard"][0]  # type: ignore[index]
    assert buttons[0]["callback_data"] == f"v:{new_reply_id}:1"

    # An older message: a notice, nothing regenerated.
    api.user_message(chat, "hello again", kind="edited_message", message_id=first)
    sent = await api.wait_for_texts(chat, 3)
    assert sent[2] == texts.EDITED
    assert len(api.edits) == 1


def _send_typo(api: FakeBotAPI, chat: int) -> int:
    """`chat` sends "how are yuo" (to be edited to "how are you"); its message id."""
    sent = api.user_message(chat, "how are yuo")
    return int(next(u for u in api.history if u["update_id"] == sent)["message"]["message_id"])


async def _only_the_edit_answered(service: Service, api: FakeBotAPI, chat: int) -> None:
    """Once nothing more can go out: the chat shows one reply, to "how are you", the history
    is that turn alone, and no reply waits unsent."""
    await settled(service, api)
    assert api.texts(chat) == [f"echo {chat}: how are you"]
    assert await rows(service, "SELECT role, text FROM messages ORDER BY id") == [
        ("user", "how are you"),
        ("bot", f"echo {chat}: how are you"),
    ]
    assert await rows(service, "SELECT count(*) FROM outbox WHERE sent_at IS NULL") == [(0,)]


async def _edit_stored(service: Service, chat: int, text: str) -> None:
    """Wait until the history's last turn is `text` and its regenerated reply."""
    want = [("user", text), ("bot", f"echo {chat}: {text}")]
    for _ in range(500):
        last = await rows(
            service,
            "SELECT role, text FROM messages WHERE chat_id = :c ORDER BY id DESC LIMIT 2",
            c=chat,
        )
        if last[::-1] == want:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"the edit to {text!r} was not stored")


async def test_an_edit_while_the_reply_is_generating_gets_the_only_answer(
    db_url: str, tmp_path: Path, api: FakeBotAPI, start_service: StartService
) -> None:
    """The typo fixed while the bot is thinking: the edit's update waits behind the
    message's turn, and is answered, not refused with the notice for older messages."""
    chat = 751
    responder = EchoResponder(delay_s=lambda _chat, text: 1.0 if text == "how are yuo" else 0.0)
    service = await start_service(make_settings(db_url, api, tmp_path), responder)
    typo = _send_typo(api, chat)
    await api.wait_for(lambda: responder.in_progress > 0, what="the reply generating")
    api.user_message(chat, "how are you", kind="edited_message", message_id=typo)
    await _edit_stored(service, chat, "how are you")
    await api.wait_for(lambda: api.texts(chat) == [f"echo {chat}: how are you"], what="the reply")
    # One message on the screen (the old reply edited in place, if it was out already).
    await _only_the_edit_answered(service, api, chat)
    assert responder.calls == [(chat, "how are yuo"), (chat, "how are you")]


async def test_an_edit_before_the_reply_went_out_withdraws_it(
    db_url: str, tmp_path: Path, api: FakeBotAPI, start_service: StartService
) -> None:
    """Generated but not sent (Telegram failing): the stale replies never go out, also when
    the message is edited twice; only the reply to the last edit is sent."""
    chat = 752
    responder = EchoResponder()
    service = await start_service(make_settings(db_url, api, tmp_path), responder)
    outage = Fault("sendMessage", 500, times=10**9, chat_id=chat)
    api.inject(outage)
    typo = _send_typo(api, chat)
    await api.wait_for(lambda: len(api.calls_to("sendMessage")) >= 2, what="a failed send")
    api.user_message(chat, "how are yu", kind="edited_message", message_id=typo)
    await _edit_stored(service, chat, "how are yu")
    api.user_message(chat, "how are you", kind="edited_message", message_id=typo)
    await _edit_stored(service, chat, "how are you")
    # The outage ends once delivery tries the last edit's reply (one worker per chat, in
    # order: the stale ones are behind it). Ended earlier, a stale reply's try that was on its
    # way when the edit was stored could get through, to be edited in place (the next test's
    # case, not this one's): seen under load.
    await api.wait_for(
        lambda: any(
            c.params.get("text") == f"echo {chat}: how are you" and c.status == 500
            for c in api.calls_to("sendMessage")
        ),
        what="a try of the last edit's reply",
    )
    outage.times = 0
    await api.wait_for_texts(chat, 1)
    await _only_the_edit_answered(service, api, chat)
    assert api.edits == []


async def test_a_reply_on_its_way_when_the_edit_is_stored_is_edited_in_place(
    db_url: str, tmp_path: Path, api: FakeBotAPI, start_service: StartService
) -> None:
    """The stale reply's request was in flight when the edit was stored: it cannot be called
    back, so the regenerated reply edits it instead of appearing beside it."""
    chat = 753
    responder = EchoResponder()
    service = await start_service(make_settings(db_url, api, tmp_path), responder)
    on_its_way = asyncio.Event()
    api.inject(Fault("sendMessage", None, hold=on_its_way, chat_id=chat))
    typo = _send_typo(api, chat)
    await api.wait_for(lambda: bool(api.calls_to("sendMessage")), what="the reply on its way")
    api.user_message(chat, "how are you", kind="edited_message", message_id=typo)
    await _edit_stored(service, chat, "how are you")
    on_its_way.set()
    await api.wait_for(lambda: bool(api.edits), what="the reply edited in place")
    await settled(service, api)  # nothing more goes out after this
    [stale] = api.sent
    assert api.edits == [
        (chat, stale.message_id, f"echo {chat}: how are yuo", f"echo {chat}: how are you")
    ]
    assert api.texts(chat) == [f"echo {chat}: how are you"]
    assert await rows(service, "SELECT count(*) FROM outbox WHERE sent_at IS NULL") == [(0,)]
    [(telegram_id,)] = await rows(
        service, "SELECT telegram_message_id FROM messages WHERE role = 'bot'"
    )
    assert telegram_id == stale.message_id  # a further edit edits the same message


async def test_a_second_edit_before_the_first_regenerated_reply_is_out(
    db_url: str, tmp_path: Path, api: FakeBotAPI, start_service: StartService
) -> None:
    """Delivered, then edited twice while editing the message fails: the reply to the last
    edit still goes into the one message on the screen."""
    chat = 754
    responder = EchoResponder()
    service = await start_service(make_settings(db_url, api, tmp_path), responder)
    typo = _send_typo(api, chat)
    await api.wait_for_texts(chat, 1)
    outage = Fault("editMessageText", 500, times=10**9, chat_id=chat)
    api.inject(outage)
    api.user_message(chat, "how are yu", kind="edited_message", message_id=typo)
    await _edit_stored(service, chat, "how are yu")
    api.user_message(chat, "how are you", kind="edited_message", message_id=typo)
    await _edit_stored(service, chat, "how are you")
    outage.times = 0
    await api.wait_for(lambda: bool(api.edits), what="the reply edited in place")
    await settled(service, api)  # nothing more goes out after this
    assert api.texts(chat) == [f"echo {chat}: how are you"]
    # Every edit went into that one message, the last with the last edit's reply. The first
    # edit's reply may show in it for a moment: a retried edit already on its way when the
    # second edit withdrew it goes out (outbox.withdrawn_reply_went_out).
    assert {message for _, message, *_ in api.edits} == {api.last_sent(chat).message_id}
    assert [new for *_, new in api.edits] in (
        [f"echo {chat}: how are you"],
        [f"echo {chat}: how are yu", f"echo {chat}: how are you"],
    )


async def test_a_regenerated_reply_on_its_way_when_the_next_edit_is_stored(
    db_url: str, tmp_path: Path, api: FakeBotAPI, start_service: StartService
) -> None:
    """Edited twice, the first edit's reply already on its way into the message when the
    second is stored: it shows for a moment, then the second's reply replaces it, in the one
    message on the screen."""
    chat = 755
    service = await start_service(make_settings(db_url, api, tmp_path), EchoResponder())
    typo = _send_typo(api, chat)
    await api.wait_for_texts(chat, 1)
    on_its_way = asyncio.Event()
    api.inject(Fault("editMessageText", None, hold=on_its_way, chat_id=chat))
    api.user_message(chat, "how are yu", kind="edited_message", message_id=typo)
    await api.wait_for(
        lambda: bool(api.calls_to("editMessageText")), what="the first edit's reply on its way"
    )
    api.user_message(chat, "how are you", kind="edited_message", message_id=typo)
    await _edit_stored(service, chat, "how are you")
    on_its_way.set()
    await api.wait_for(lambda: len(api.edits) == 2, what="both replies edited in")
    await settled(service, api)  # nothing more goes out after this
    [shown] = api.sent
    assert api.edits == [
        (chat, shown.message_id, f"echo {chat}: how are yuo", f"echo {chat}: how are yu"),
        (chat, shown.message_id, f"echo {chat}: how are yu", f"echo {chat}: how are you"),
    ]
    assert api.texts(chat) == [f"echo {chat}: how are you"]
    assert await rows(service, "SELECT count(*) FROM outbox WHERE sent_at IS NULL") == [(0,)]
