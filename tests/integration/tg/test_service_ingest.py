"""Ingest: nothing acknowledged before it is stored; duplicates change nothing; webhook secret."""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bot.app import serve
from bot.conversations.store import ConversationStore
from bot.tg import ingest as ingest_module
from tests.support.botprocess import free_port
from tests.support.fakebotapi import SECRET_HEADER, FakeBotAPI
from tests.support.fixtures import ServeSettings
from tests.support.service_harness import (
    TOKEN,
    EchoResponder,
    make_settings,
    rows,
    running_service,
    settled,
    sqlite_rows,
)

SECRET = "s3cret-Token_for-tests"


async def test_polling_confirms_an_update_only_after_its_inbox_row_is_committed(
    sqlite_url: str, tmp_path: Path, api: FakeBotAPI
) -> None:
    unsafe: list[tuple[int, list[int]]] = []

    def check(offset: int | None) -> None:
        # Runs inside getUpdates, before the offset confirms anything.
        if offset is None:
            return
        stored = {r[0] for r in sqlite_rows(sqlite_url, "SELECT update_id FROM inbox")}
        confirmed = [u["update_id"] for u in api.updates if u["update_id"] < offset]
        if not set(confirmed) <= stored:
            unsafe.append((offset, confirmed))

    api.on_get_updates = check
    responder = EchoResponder()
    async with running_service(make_settings(sqlite_url, api, tmp_path), responder):
        ids = [api.user_message(11, f"message {i}") for i in range(5)]
        await api.wait_for_texts(11, 5)
        await api.wait_for(lambda: any(o and o > max(ids) for o in api.offsets))
    assert unsafe == []
    assert [o for o in api.offsets if o is not None][-1] == max(ids) + 1


async def test_a_duplicated_update_produces_one_turn(
    api: FakeBotAPI, serve_db: ServeSettings
) -> None:
    responder = EchoResponder()
    service = await serve_db(responder)
    first = api.user_message(21, "only once")
    api.redeliver(first)  # in the same getUpdates batch
    await api.wait_for_texts(21, 1)
    api.redeliver(first)  # again after it was answered
    polls = len(api.offsets)
    # The next poll starts only once the duplicate went through ingest.
    await api.wait_for(lambda: len(api.offsets) >= polls + 1, what="another poll")
    await settled(service, api)  # a duplicate taken in would be pending, or its reply queued
    assert responder.calls == [(21, "only once")]
    assert api.texts(21) == ["echo 21: only once"]
    messages = await rows(service, "SELECT role, text FROM messages ORDER BY id")
    assert messages == [("user", "only once"), ("bot", "echo 21: only once")]
    inbox = await rows(service, "SELECT update_id, status FROM inbox")
    assert inbox == [(first, "done")]


@pytest.mark.parametrize(
    ("honours_allowed_updates", "stored_as"), [(True, None), (False, "ignored")]
)
async def test_channel_posts_are_stored_closed_and_never_answered(
    sqlite_url: str,
    tmp_path: Path,
    api: FakeBotAPI,
    honours_allowed_updates: bool,
    stored_as: str | None,
) -> None:
    # allowed_updates keeps channel posts away (as Telegram does): never handed out, so never
    # stored. An API that sends them anyway: stored already closed.
    api.honours_allowed_updates = honours_allowed_updates
    responder = EchoResponder()
    async with running_service(make_settings(sqlite_url, api, tmp_path), responder) as service:
        post = api.channel_post(-100123, "news")
        api.user_message(22, "after the post")
        await api.wait_for_texts(22, 1)
        inbox = dict(await rows(service, "SELECT update_id, status FROM inbox"))
    assert inbox.get(post) == stored_as
    assert api.texts(-100123) == []
    assert responder.calls == [(22, "after the post")]


async def test_webhook_answers_403_without_the_secret_and_stores_nothing(
    db_url: str, tmp_path: Path, api: FakeBotAPI
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/telegram/hook"
    settings = make_settings(
        db_url, api, tmp_path, webhook_url=url, webhook_secret=SECRET,
        webhook_listen="127.0.0.1", webhook_port=port,
    )  # fmt: skip
    responder = EchoResponder()
    async with running_service(settings, responder) as service:
        assert api.webhook.url == url and api.webhook.secret == SECRET
        assert api.webhook.allowed_updates == [
            "message",
            "edited_message",
            "callback_query",
            "message_reaction",
        ]
        forged = {
            "update_id": 999,
            "message": {
                "message_id": 1, "date": 0, "text": "forged",
                "chat": {"id": 31, "type": "private"},
            },
        }  # fmt: skip
        assert await api.post_to_webhook(forged, secret=None) == 403
        assert await api.post_to_webhook(forged, secret="wrong") == 403
        assert await api.post_to_webhook(forged, secret=SECRET[:-1]) == 403
        async with (
            aiohttp.ClientSession() as http,
            http.post(url, data=b"not json", headers={SECRET_HEADER: "nope"}) as resp,
        ):
            assert resp.status == 403
        assert await rows(service, "SELECT update_id FROM inbox") == []
        # The real thing: Telegram (the fake) posts with the secret and gets answers.
        api.user_message(31, "hello over the webhook")
        assert await api.wait_for_texts(31, 1) == ["echo 31: hello over the webhook"]
        assert all(status == 200 for _, status in api.webhook_posts)
        assert responder.calls == [(31, "hello over the webhook")]
        # A webhook retry of an already stored update changes nothing.
        update = api.history[-1]
        assert await api.post_to_webhook(update, secret=SECRET) == 200
        await settled(service, api)  # answered 200 once committed: any new turn is pending
        assert responder.calls == [(31, "hello over the webhook")]
        assert len(api.texts(31)) == 1
    assert api.calls_to("getUpdates") == []


async def test_webhook_keeps_redelivering_while_the_bot_is_down(
    sqlite_url: str, tmp_path: Path
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/hook"
    async with FakeBotAPI(TOKEN, webhook_retry_s=0.1) as api:
        settings = make_settings(
            sqlite_url, api, tmp_path, webhook_url=url, webhook_secret=SECRET,
            webhook_listen="127.0.0.1", webhook_port=port,
        )  # fmt: skip
        async with running_service(settings, EchoResponder()):
            pass
        # The bot is down; the webhook stays registered and Telegram keeps trying.
        api.user_message(41, "while you were away")
        await api.wait_for(lambda: len(api.webhook_posts) >= 2, what="failed posts")
        assert all(status != 200 for _, status in api.webhook_posts)
        async with running_service(settings, EchoResponder(), migrate_db=False):
            assert await api.wait_for_texts(41, 1) == ["echo 41: while you were away"]


async def test_a_rejected_token_ends_the_service_with_status_1(
    sqlite_url: str, tmp_path: Path
) -> None:
    async with FakeBotAPI("111:other-token-entirely-different") as api:
        settings = make_settings(sqlite_url, api, tmp_path)
        assert await asyncio.wait_for(serve(settings, responder_factory=_never), 30) == 1
        assert [c.method for c in api.calls] == []  # 401 before any method ran


async def _never(*_args: object) -> EchoResponder:
    raise AssertionError("the responder must not load when Telegram refuses the token")


async def test_a_batch_of_updates_is_one_commit_and_one_wake(
    api: FakeBotAPI, store: ConversationStore
) -> None:
    # Measured at 50 users (docs/benchmarks.md): getUpdates batches held 2-15 updates, each its
    # own commit, and the worker heard of the first only after the last was stored.
    from sqlalchemy import event
    from telegram import Bot
    from telegram.request import HTTPXRequest

    ids = [api.user_message(chat, "hello") for chat in (801, 802, 803, 804)]
    commits: list[int] = []  # the inbox's row count at each commit
    wakes: list[tuple[int, list[int]]] = []  # commits made before each wake, the chats named

    def on_commit(conn: Any) -> None:
        commits.append(conn.exec_driver_sql("SELECT count(*) FROM inbox").scalar())

    def on_stored(chats: Collection[int]) -> None:
        wakes.append((len(commits), sorted(chats)))

    sync_engine = store.sessionmaker.kw["bind"].sync_engine
    bot = Bot(
        TOKEN, base_url=api.base_url, request=HTTPXRequest(), get_updates_request=HTTPXRequest()
    )
    ingest = ingest_module.PollingIngest(bot, store, on_stored)
    event.listen(sync_engine, "commit", on_commit)
    try:
        async with bot:
            await ingest.start()
            try:
                await api.wait_for(lambda: any(o and o > max(ids) for o in api.offsets))
            finally:
                await ingest.stop()
    finally:
        event.remove(sync_engine, "commit", on_commit)
    # the four updates came in one getUpdates batch: one commit that stored all four, then
    # one wake that names their chats (the inbox worker starts them without a scan)
    assert commits == [len(ids)]
    assert wakes == [(1, [801, 802, 803, 804])]
