"""Feedback through the real PTB Application and the loopback Bot API: 👍/👎 under replies,
the 1-5 rating at /done, reactions in groups, and every stale or forged press refused."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

from bot.app import Service
from bot.texts import ENGLISH as texts
from tests.support.fakebotapi import FakeBotAPI, Sent
from tests.support.fixtures import ServeSettings, StartService
from tests.support.service_harness import EchoResponder, make_settings, rows


async def _settle(api: FakeBotAPI, query_id: str) -> str:
    await api.wait_for(lambda: query_id in api.callback_answers, what=f"answer to {query_id}")
    return api.callback_answers[query_id]


async def _eventually(
    read: Callable[[], Awaitable[list[tuple[object, ...]]]], expected: list[tuple[object, ...]]
) -> None:
    got: list[tuple[object, ...]] = []
    for _ in range(250):
        got = await read()
        if got == expected:
            return
        await asyncio.sleep(0.04)
    raise AssertionError(f"expected {expected!r}, still {got!r}")


async def replied_to_hello(
    api: FakeBotAPI, serve_db: ServeSettings, chat: int
) -> tuple[Service, Sent]:
    """A started service that has replied to "hello" in `chat`; the reply with its buttons."""
    service = await serve_db(EchoResponder())
    api.user_message(chat, "hello")
    await api.wait_for_texts(chat, 1)
    return service, api.last_sent(chat)


async def test_votes_are_stored_once_changeable_and_shown_on_the_buttons(
    api: FakeBotAPI, serve_db: ServeSettings
) -> None:
    chat = 301
    service, reply = await replied_to_hello(api, serve_db, chat)
    [(message_id,)] = await rows(service, "SELECT id FROM messages WHERE role = 'bot'")
    buttons = reply.reply_markup["inline_keyboard"][0]  # type: ignore[index]
    assert [b["text"] for b in buttons] == ["👍", "👎"]
    assert [b["callback_data"] for b in buttons] == [f"v:{message_id}:1", f"v:{message_id}:-1"]

    update_id, query = api.press(chat, reply.message_id, f"v:{message_id}:1")
    assert await _settle(api, query) == texts.VOTED_UP
    await api.wait_for(
        lambda: "✓" in reply.reply_markup["inline_keyboard"][0][0]["text"],  # type: ignore[index]
        what="the 👍 button ticked",
    )
    # Telegram delivers at least once: the same press again changes nothing.
    api.redeliver(update_id)
    _, changed = api.press(chat, reply.message_id, f"v:{message_id}:-1")
    assert await _settle(api, changed) == texts.VOTED_DOWN
    await api.wait_for(
        lambda: "✓" in reply.reply_markup["inline_keyboard"][0][1]["text"],  # type: ignore[index]
        what="the 👎 button ticked",
    )
    votes = await rows(service, "SELECT message_id, user_id, value, source FROM votes")
    assert votes == [(message_id, chat, -1, "button")]
    [(status,)] = await rows(service, "SELECT status FROM inbox WHERE update_id = :u", u=update_id)
    assert status == "done"


async def test_forged_and_stale_presses_are_answered_and_change_nothing(
    api: FakeBotAPI, serve_db: ServeSettings
) -> None:
    mine, other = 311, 312
    service = await serve_db(EchoResponder())
    api.user_message(mine, "hello")
    api.user_message(other, "hi")
    await api.wait_for_texts(mine, 1)
    await api.wait_for_texts(other, 1)
    reply = api.last_sent(mine)
    ids = dict(await rows(service, "SELECT chat_id, id FROM messages WHERE role = 'bot'"))
    [(user_message, active)] = await rows(
        service,
        "SELECT id, session_id FROM messages WHERE role = 'user' AND chat_id = :c",
        c=mine,
    )
    forged = [
        "garbage",  # not ours at all
        f"v:{ids[mine]}:7",  # not a vote value
        f"v:{ids[other]}:1",  # another chat's reply
        f"v:{user_message}:1",  # not a bot reply
        f"v:{ids[mine] + 1000}:1",  # no such message
        "r:999999:3",  # no such conversation
        "v:9999999999999999999:1",  # beyond 64 bits (would not even bind as a parameter)
        f"r:{active}:4",  # the conversation still running: only /done offers a rating
        f"v:{ids[mine]}:1" + "x" * 40,  # trailing junk
    ]
    queries = [api.press(mine, reply.message_id, data)[1] for data in forged]
    for data, query in zip(forged, queries, strict=True):
        # A rating's data gets the rating's answer; anything else, the vote's.
        stale = texts.RATING_STALE if data.startswith("r:") else texts.VOTE_STALE
        assert await _settle(api, query) == stale, data
    # The right data under the wrong message (another reply of this chat) is refused too.
    api.user_message(mine, "again")
    await api.wait_for_texts(mine, 2)
    second = api.last_sent(mine)
    _, query = api.press(mine, second.message_id, f"v:{ids[mine]}:1")
    assert await _settle(api, query) == texts.VOTE_STALE
    assert await rows(service, "SELECT count(*) FROM votes") == [(0,)]
    assert await rows(service, "SELECT count(*) FROM ratings") == [(0,)]
    statuses = await rows(
        service, "SELECT DISTINCT status FROM inbox WHERE kind = 'callback_query'"
    )
    assert statuses == [("ignored",)]


async def test_done_offers_a_rating_once_and_forget_removes_all_feedback(
    api: FakeBotAPI, serve_db: ServeSettings
) -> None:
    chat = 321
    service, reply = await replied_to_hello(api, serve_db, chat)
    [(message_id, session_id)] = await rows(
        service, "SELECT id, session_id FROM messages WHERE role = 'bot'"
    )
    _, query = api.press(chat, reply.message_id, f"v:{message_id}:1")
    await _settle(api, query)
    api.user_message(chat, "/done")
    sent = await api.wait_for_texts(chat, 3)
    assert sent[1:] == [texts.ENDED, texts.RATE_PROMPT]
    prompt = api.last_sent(chat)
    keyboard = prompt.reply_markup["inline_keyboard"][0]  # type: ignore[index]
    assert [b["callback_data"] for b in keyboard] == [f"r:{session_id}:{n}" for n in range(1, 6)]
    update_id, first = api.press(chat, prompt.message_id, f"r:{session_id}:4")
    assert await _settle(api, first) == texts.rated(4)
    api.redeliver(update_id)
    _, second = api.press(chat, prompt.message_id, f"r:{session_id}:5")
    assert await _settle(api, second) == texts.RATING_TWICE
    assert await rows(service, "SELECT session_id, value FROM ratings") == [(session_id, 4)]
    # /done with nothing said offers no rating.
    api.user_message(chat, "/done")
    await api.wait_for_texts(chat, 4)

    api.user_message(chat, "/forget")
    await api.wait_for_texts(chat, 5)
    for table in ("votes", "ratings", "assignments", "messages"):
        assert await rows(service, f"SELECT count(*) FROM {table}") == [(0,)], table
    _, late = api.press(chat, reply.message_id, f"v:{message_id}:-1")
    assert await _settle(api, late) == texts.VOTE_STALE
    assert await rows(service, "SELECT count(*) FROM votes") == [(0,)]


async def test_reactions_in_groups_count_as_votes(
    db_url: str, tmp_path: Path, api: FakeBotAPI, start_service: StartService
) -> None:
    group = -331
    service = await start_service(
        make_settings(db_url, api, tmp_path, group_policy="all"), EchoResponder()
    )
    api.user_message(group, "hello everyone", user_id=41, chat_type="group")
    await api.wait_for_texts(group, 1)
    reply = api.last_sent(group)
    api.react(group, reply.message_id, ["👍"], user_id=41)
    api.react(group, reply.message_id, ["👎", "🔥"], user_id=42)
    api.react(group, reply.message_id, ["🔥"], user_id=43)  # not a vote
    api.react(group, 987654, ["👍"], user_id=44)  # not one of the bot's messages

    async def votes() -> list[tuple[object, ...]]:
        return await rows(service, "SELECT user_id, value, source FROM votes ORDER BY user_id")

    await _eventually(votes, [(41, 1, "reaction"), (42, -1, "reaction")])
    api.react(group, reply.message_id, [], user_id=41)  # taken back
    await _eventually(votes, [(42, -1, "reaction")])


async def test_feedback_buttons_off_sends_plain_replies(
    db_url: str, tmp_path: Path, api: FakeBotAPI, start_service: StartService
) -> None:
    chat = 341
    await start_service(
        make_settings(db_url, api, tmp_path, feedback_buttons=False), EchoResponder()
    )
    api.user_message(chat, "hello")
    api.user_message(chat, "/done")
    assert await api.wait_for_texts(chat, 2) == ["echo 341: hello", texts.ENDED]
    assert all(s.reply_markup is None for s in api.sent)


async def test_presses_over_the_flood_limit_are_not_applied_nor_answered(
    db_url: str, tmp_path: Path, api: FakeBotAPI, start_service: StartService
) -> None:
    """Regression: 300 presses from one chat made 600 Bot API calls (an answer and an edit of
    the buttons each) and slowed every other chat's replies down."""
    presser, calm = 341, 342
    settings = make_settings(db_url, api, tmp_path, flood_max_messages=3, flood_window_s=60)
    service = await start_service(settings, EchoResponder())
    api.user_message(presser, "hello")
    await api.wait_for_texts(presser, 1)
    reply = api.last_sent(presser)
    [(message_id,)] = await rows(service, "SELECT id FROM messages WHERE role = 'bot'")
    values = [1, -1] * 5
    queries = [api.press(presser, reply.message_id, f"v:{message_id}:{v}")[1] for v in values]

    async def closed() -> list[tuple[object, ...]]:
        return await rows(
            service,
            "SELECT count(*) FROM inbox WHERE kind = 'callback_query' AND status != 'pending'",
        )

    await _eventually(closed, [(len(values),)])
    api.user_message(calm, "still there?")  # the presses' chat is the only one held back
    assert await api.wait_for_texts(calm, 1) == [f"echo {calm}: still there?"]
    assert [api.callback_answers.get(q) for q in queries] == [
        texts.VOTED_UP,
        texts.VOTED_DOWN,
        texts.VOTED_UP,
        texts.pressing_too_fast(3, 60),
    ] + [None] * 6
    assert len(api.calls_to("answerCallbackQuery")) == 4
    assert len(api.calls_to("editMessageReplyMarkup")) == 3
    assert await rows(service, "SELECT value FROM votes") == [(1,)]  # the third press
    statuses = await rows(
        service, "SELECT status FROM inbox WHERE kind = 'callback_query' ORDER BY update_id"
    )
    assert statuses == [("done",)] * 3 + [("ignored",)] * 7
    # The text budget is not touched: the chat is still answered.
    api.user_message(presser, "and now?")
    assert (await api.wait_for_texts(presser, 2))[1] == f"echo {presser}: and now?"
