"""Persona presets and their deep links, and /privacy, through the real PTB Application and
the loopback Bot API."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot import texts
from bot.config import ConfigError
from bot.presets import load_presets
from tests.support.fakebotapi import FakeBotAPI
from tests.support.fixtures import StartService
from tests.support.service_harness import EchoResponder, make_settings, rows

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
        "\n\n" + texts.HELP
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
