"""The bot speaks its user's language, through the real PTB Application and the loopback Bot
API: the sender's language_code, /lang for the chat, groups, buttons, the command menu, and
the terminal chat's --lang. The model's replies are never translated."""

from __future__ import annotations

import asyncio
from pathlib import Path

from bot.config import Settings
from bot.conversations.store import ConversationStore
from bot.conversations.usecases import UseCases
from bot.db import migrate
from bot.db.engine import make_engine, make_sessionmaker
from bot.service.inbox import sender_language
from bot.terminal import dispatch as terminal_dispatch
from bot.texts import ENGLISH, LANGUAGES, for_language
from tests.support.fakebotapi import FakeBotAPI
from tests.support.fixtures import StartService
from tests.support.service_harness import EchoResponder, make_settings, rows
from tests.support.store_rows import pending_outbox

DE, RU, ES = for_language("de"), for_language("ru"), for_language("es")


def start_text(language: str, model_language: str = "en") -> str:
    texts = for_language(language)
    return texts.GREETING + texts.help(model_language)


async def test_start_is_answered_in_the_senders_telegram_language(
    db_url: str, tmp_path: Path, api: FakeBotAPI, start_service: StartService
) -> None:
    await start_service(make_settings(db_url, api, tmp_path), EchoResponder())
    senders = {501: "de", 502: "ru", 503: "pt-BR", 504: "de-AT", 505: None, 506: "es"}
    for chat, code in senders.items():
        api.user_message(chat, "/start", language_code=code)
    got = {chat: (await api.wait_for_texts(chat, 1))[0] for chat in senders}
    assert got[501] == start_text("de")
    assert got[501].startswith("Hallo! Ich bin ein Chatbot")
    assert got[502] == start_text("ru")
    assert got[502].startswith("Здравствуйте! Я чат-бот")
    assert got[503] == start_text("en")  # no Portuguese catalog: English
    assert got[504] == start_text("de")  # de-AT is German
    assert got[505] == start_text("en")  # no language_code at all
    assert got[506] == start_text("es")
    # /help says in each language that the replies are the model's, in English.
    assert "английский" in got[502] and "Englisch" in got[501] and "inglés" in got[506]


async def test_model_replies_are_not_translated_and_help_names_the_model_language(
    db_url: str, tmp_path: Path, api: FakeBotAPI, start_service: StartService
) -> None:
    chat = 511
    settings = make_settings(db_url, api, tmp_path, bot_model_language="de")
    await start_service(settings, EchoResponder())
    api.user_message(chat, "/help", language_code="ru")
    api.user_message(chat, "how are you", language_code="ru")
    sent = await api.wait_for_texts(chat, 2)
    assert sent[0] == RU.help("de") and "немецкий" in sent[0]
    assert sent[1] == f"echo {chat}: how are you"  # the model's words, as they came


async def test_lang_switches_the_chat_and_forget_removes_the_setting(
    db_url: str, tmp_path: Path, api: FakeBotAPI, start_service: StartService
) -> None:
    chat = 521
    service = await start_service(make_settings(db_url, api, tmp_path), EchoResponder())
    script = ["/lang", "/lang es", "/help", "/lang", "/lang xx", "/lang DE-ch", "/lang auto"]
    for line in script:
        api.user_message(chat, line, language_code="ru")
    sent = await api.wait_for_texts(chat, len(script))
    assert sent[0] == RU.language_shown(chosen=False)
    assert "ru Русский" in sent[0] and "de Deutsch" in sent[0]
    assert sent[1] == ES.language_set() == "A partir de ahora hablo español en este chat."
    assert sent[2] == ES.help("en")  # the chat's choice wins over the sender's ru
    assert sent[3] == ES.language_shown(chosen=True)
    # Bad input: a clear answer in the chat's language, listing the choices.
    assert sent[4] == ES.language_unknown("xx")
    assert all(f"{code} " in sent[4] for code in LANGUAGES)
    assert sent[5] == DE.language_set()  # a region tag names its language
    assert sent[6] == RU.language_auto()  # back to the sender's Telegram language
    assert await rows(service, "SELECT language FROM chat_settings WHERE chat_id = :c", c=chat) == [
        (None,)
    ]

    api.user_message(chat, "/lang de", language_code="ru")
    api.user_message(chat, "hello", language_code="ru")
    # The replies first: a /forget deletes the chat's replies still queued (docs/guarantees.md),
    # and these need no model, so without the wait it may come before they go out.
    await api.wait_for_texts(chat, len(script) + 2)
    api.user_message(chat, "/forget", language_code="ru")
    sent = await api.wait_for_texts(chat, len(script) + 3)
    assert sent[-3:] == [DE.language_set(), f"echo {chat}: hello", DE.FORGOTTEN]
    assert await rows(service, "SELECT count(*) FROM chat_settings") == [(0,)]
    api.user_message(chat, "/help", language_code="ru")
    assert (await api.wait_for_texts(chat, len(script) + 4))[-1] == RU.help("en")


async def test_groups_use_the_chats_setting_else_each_senders_language(
    db_url: str, tmp_path: Path, api: FakeBotAPI, start_service: StartService
) -> None:
    group = -531
    await start_service(make_settings(db_url, api, tmp_path), EchoResponder())
    api.user_message(group, "/help", user_id=41, chat_type="group", language_code="de")
    api.user_message(group, "/help", user_id=42, chat_type="group", language_code="ru")
    api.user_message(group, "/lang es", user_id=41, chat_type="group", language_code="de")
    api.user_message(group, "/help", user_id=42, chat_type="group", language_code="ru")
    sent = await api.wait_for_texts(group, 4)
    assert sent == [DE.help("en"), RU.help("en"), ES.language_set(), ES.help("en")]


async def test_buttons_and_their_answers_are_in_the_chats_language(
    db_url: str, tmp_path: Path, api: FakeBotAPI, start_service: StartService
) -> None:
    chat = 541
    service = await start_service(make_settings(db_url, api, tmp_path), EchoResponder())
    api.user_message(chat, "hallo", language_code="de")
    await api.wait_for_texts(chat, 1)
    reply = api.last_sent(chat)
    [(message_id,)] = await rows(service, "SELECT id FROM messages WHERE role = 'bot'")
    _, query = api.press(chat, reply.message_id, f"v:{message_id}:1", language_code="de")
    await api.wait_for(lambda: query in api.callback_answers, what="the vote's answer")
    assert api.callback_answers[query] == DE.VOTED_UP == "Danke! Schön, dass das gepasst hat."
    api.user_message(chat, "/done", language_code="de")
    sent = await api.wait_for_texts(chat, 3)
    assert sent[1:] == [DE.ENDED, DE.RATE_PROMPT]
    prompt = api.last_sent(chat)
    [(session_id,)] = await rows(service, "SELECT id FROM sessions")
    # The callback data stays language-free: a press from a Russian client is understood.
    _, rating = api.press(chat, prompt.message_id, f"r:{session_id}:5", language_code="ru")
    await api.wait_for(lambda: rating in api.callback_answers, what="the rating's answer")
    assert api.callback_answers[rating] == RU.rated(5)


async def test_command_menu_and_descriptions_are_set_once_per_language(
    db_url: str, tmp_path: Path, api: FakeBotAPI, start_service: StartService
) -> None:
    await start_service(make_settings(db_url, api, tmp_path), EchoResponder())
    await api.wait_for(lambda: len(api.short_descriptions) == len(LANGUAGES), what="set-up")
    calls = api.calls_to("setMyCommands")
    # English is the default (no language_code): what clients of any other language see.
    assert [c.params.get("language_code") for c in calls] == [None, "ru", "es", "de"]
    assert set(api.commands_by_language) == {None, "ru", "es", "de"}
    names = [c["command"] for c in api.commands]
    assert "lang" in names and "stats" not in names
    for code in ("ru", "es", "de"):
        menu = api.commands_by_language[code]
        assert [c["command"] for c in menu] == names
        assert [c["description"] for c in menu] == [d for _, d in for_language(code).command_menu()]
    assert api.commands_by_language["de"][0]["description"] == (
        "Hallo sagen und erfahren, wie ich funktioniere"
    )
    assert api.descriptions == {
        (None if code == "en" else code): for_language(code).DESCRIPTION for code in LANGUAGES
    }
    assert api.short_descriptions[None] == ENGLISH.SHORT_DESCRIPTION
    assert api.short_descriptions["ru"] == RU.SHORT_DESCRIPTION != ENGLISH.SHORT_DESCRIPTION


async def test_an_apology_after_retries_is_in_the_senders_language(
    db_url: str, tmp_path: Path, api: FakeBotAPI, start_service: StartService
) -> None:
    chat = 551
    responder = EchoResponder()
    responder.fail_on.add("boom")
    await start_service(make_settings(db_url, api, tmp_path), responder)
    api.user_message(chat, "boom", language_code="es")
    assert await api.wait_for_texts(chat, 1, timeout_s=30) == [ES.APOLOGY]


def test_sender_language_is_read_from_a_stored_update() -> None:
    assert sender_language('{"message": {"from": {"id": 1, "language_code": "de"}}}') == "de"
    assert sender_language('{"callback_query": {"from": {"language_code": "ru"}}}') == "ru"
    assert sender_language('{"message": {"from": {"id": 1}}}') is None
    assert sender_language("{}") is None
    assert sender_language("not json") is None


async def test_the_terminal_chat_speaks_its_lang(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'chat.sqlite3'}"
    await asyncio.to_thread(migrate.upgrade, url)
    engine = make_engine(url)
    store = ConversationStore(make_sessionmaker(engine))
    settings = Settings(_env_file=None, database_url=url, data_dir=tmp_path, safety="off")  # type: ignore[call-arg]
    chat = UseCases(store, EchoResponder(), settings)
    try:
        for line in ("/help", "hello", "/bogus", "/lang es", "/done"):
            await terminal_dispatch(chat, 7, line, language="de")
        texts = [row.text for row in await pending_outbox(store, 7)]
    finally:
        await engine.dispose()
    assert texts == [
        DE.help("en"),
        "echo 7: hello",
        DE.unknown_terminal_command("bogus"),
        ES.language_set(),
        ES.ENDED,
        ES.TERMINAL_RATE_HINT,
    ]
