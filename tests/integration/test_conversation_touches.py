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
