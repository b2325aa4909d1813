"""The session store's use cases, on SQLite and PostgreSQL alike."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from bot.conversations.store import ConversationStore
from bot.db import conversations, inbox, outbox
from bot.db.conversations import ReplyFacts
from bot.db.inbox import UpdateRef
from bot.db.models import Inbox, Message, Outbox, OutboxKind, Session
from tests.support.store_rows import finish_update, ingest


async def _count(store: ConversationStore, model: type, **where: object) -> int:
    async with store.sessionmaker() as db:
        stmt = select(func.count()).select_from(model)
        for key, value in where.items():
            stmt = stmt.where(getattr(model, key) == value)
        return int(await db.scalar(stmt) or 0)


async def test_ingest_is_idempotent_per_update_id(store: ConversationStore) -> None:
    first = await ingest(store, update_id=10, chat_id=1, user_id=2, kind="message", payload="{}")
    again = await ingest(store, update_id=10, chat_id=1, user_id=2, kind="message", payload="{}")
    assert (first, again) == (True, False)
    assert await _count(store, Inbox) == 1


async def test_at_most_one_active_session_per_chat(store: ConversationStore) -> None:
    a = await store.active_session(100, 7)
    b = await store.active_session(100, 7)
    assert a.id == b.id
    with pytest.raises(IntegrityError):
        async with store.sessionmaker.begin() as db:
            await conversations.create_session(db, 100, 7, "")


async def test_persona_carries_over_after_done(store: ConversationStore) -> None:
    await store.set_persona(5, 5, "My name is Sarah.", notice="ok")
    ended = await store.end_session(5, notice="bye")
    assert ended is not None
    async with store.read() as db:  # the persona the next conversation starts with
        assert await conversations.latest_persona(db, 5) == "My name is Sarah."
    new = await store.active_session(5, 5)
    assert new.id != ended.id
    assert new.persona == "My name is Sarah."
    assert await _count(store, Session, chat_id=5, status="done") == 1


async def test_record_turn_is_one_transaction_and_closes_update(store: ConversationStore) -> None:
    await ingest(store, update_id=1, chat_id=9, user_id=9, kind="message", payload="{}")
    session = await store.active_session(9, 9)
    await store.record_turn(
        session.id, 9, "hi", "hello!", facts=ReplyFacts(latency_ms=12.5), update=UpdateRef(1)
    )
    ctx = await store.load_context(session.id, tail=None)
    assert [(m.role, m.text) for m in ctx.messages] == [("user", "hi"), ("bot", "hello!")]
    async with store.sessionmaker() as db:
        assert await inbox.status_of(db, 1) == "done"
        pending = await outbox.pending(db, 9)
    assert [p.text for p in pending] == ["hello!"]
    # The same update once more: its fence (the update is no longer pending) fails at the end,
    # after both messages and the outbox row were written; all of them go with it.
    with pytest.raises(inbox.StaleUpdate):
        await store.record_turn(session.id, 9, "hi again", "hello again!", update=UpdateRef(1))
    ctx = await store.load_context(session.id, tail=None)
    assert [(m.role, m.text) for m in ctx.messages] == [("user", "hi"), ("bot", "hello!")]
    assert await _count(store, Outbox, chat_id=9) == 1
    async with store.sessionmaker() as db:
        assert await inbox.status_of(db, 1) == "done"


async def test_failed_turn_leaves_nothing_behind(store: ConversationStore) -> None:
    await ingest(store, update_id=3, chat_id=3, user_id=3, kind="message", payload="{}")
    session = await store.active_session(3, 3)
    with pytest.raises(IntegrityError):
        # A reply without text violates NOT NULL in the middle of the turn, after the user's
        # message was written and before the outbox row and the update's closing.
        await store.record_turn(session.id, 3, "a", None, update=UpdateRef(3))  # type: ignore[arg-type]
    assert await _count(store, Message) == 0
    assert await _count(store, Outbox) == 0
    async with store.sessionmaker() as db:
        assert await inbox.status_of(db, 3) == "pending"  # still to be answered
    # ... and the turn can then be stored for real.
    await store.record_turn(session.id, 3, "a", "b", update=UpdateRef(3))
    assert await _count(store, Message, chat_id=3) == 2


async def test_tail_messages_keeps_order(store: ConversationStore) -> None:
    session = await store.active_session(4, 4)
    for i in range(10):
        await store.record_turn(session.id, 4, f"u{i}", f"b{i}")
    ctx = await store.load_context(session.id, tail=3)
    assert [m.text for m in ctx.messages] == ["b8", "u9", "b9"]


async def test_outbox_delivery_marks_message(store: ConversationStore) -> None:
    session = await store.active_session(6, 6)
    outbox_id = (await store.record_turn(session.id, 6, "hi", "yo")).outbox_id
    async with store.sessionmaker.begin() as db:
        await outbox.sent(db, outbox_id, telegram_message_id=77)
    async with store.sessionmaker() as db:
        assert await outbox.pending(db) == []
        delivered = await db.scalar(select(Message.delivered_at).where(Message.role == "bot"))
    assert delivered is not None


async def test_forget_removes_every_row_of_the_chat(store: ConversationStore) -> None:
    await ingest(store, update_id=1, chat_id=8, user_id=8, kind="message", payload='{"x": 1}')
    session = await store.active_session(8, 8)
    await store.record_turn(session.id, 8, "secret", "ok", update=UpdateRef(1))
    other = await store.active_session(99, 99)
    await store.record_turn(other.id, 99, "keep", "me")
    await store.forget_chat(8)
    for model in (Session, Message, Outbox, Inbox):
        assert await _count(store, model, chat_id=8) == 0
    assert await _count(store, Message, chat_id=99) == 2
    # idempotent
    assert await store.forget_chat(8) == 0


async def test_forget_keeps_update_deduplicated(store: ConversationStore) -> None:
    await ingest(store, update_id=5, chat_id=8, user_id=8, kind="message", payload="{}")
    await store.forget_chat(8, notice="forgotten", update=UpdateRef(5))
    again = await ingest(store, update_id=5, chat_id=8, user_id=8, kind="message", payload="{}")
    assert again is False
    assert await _count(store, Inbox, chat_id=8) == 0


async def test_forgotten_session_id_is_never_reused(store: ConversationStore) -> None:
    """Regression: SQLite reused the highest deleted id, and the agent cache is keyed by id, so
    after `admin forget` the next chat could be served the forgotten chat's cached clone."""
    first = await store.active_session(21, 21)
    await store.forget_chat(21)
    second = await store.active_session(22, 22)
    assert second.id > first.id


async def test_forget_keeps_updates_that_came_after_it(store: ConversationStore) -> None:
    """Regression: /forget deleted the chat's pending inbox rows, so a message sent right after
    it was never answered."""
    for update_id in (1, 2, 3):
        await ingest(store, update_id=update_id, chat_id=8, user_id=8, kind="message", payload="{}")
    await finish_update(store, UpdateRef(1))
    await store.forget_chat(8, notice="forgotten", update=UpdateRef(2))
    async with store.sessionmaker() as db:
        assert await inbox.status_of(db, 1) is None
        assert await inbox.status_of(db, 3) == "pending"


async def test_a_turn_for_an_update_closed_elsewhere_is_rolled_back(
    store: ConversationStore,
) -> None:
    """Fence: if another process already closed the update, this turn leaves no rows."""
    await ingest(store, update_id=40, chat_id=40, user_id=40, kind="message", payload="{}")
    session = await store.active_session(40, 40)
    await finish_update(store, UpdateRef(40))  # another replica answered it meanwhile
    with pytest.raises(inbox.StaleUpdate):
        await store.record_turn(session.id, 40, "hi", "hello", update=UpdateRef(40))
    assert await _count(store, Message, chat_id=40) == 0
    assert await _count(store, Outbox, chat_id=40) == 0


async def test_pending_chats_come_oldest_first(store: ConversationStore) -> None:
    # Found in review: SELECT DISTINCT ... LIMIT had no order, so with more waiting chats than
    # the scan limit, the same ones could come back every time and others wait forever.
    for update_id, chat_id in [(5, 30), (7, 10), (1, 20), (9, 30)]:
        await ingest(
            store,
            update_id=update_id,
            chat_id=chat_id,
            user_id=chat_id,
            kind="message",
            payload="{}",
        )
    async with store.sessionmaker.begin() as db:
        for chat_id in (40, 10, 40, 50):
            await outbox.enqueue(db, chat_id=chat_id, kind=OutboxKind.NOTICE, text="hi")
    async with store.sessionmaker() as db:
        assert await inbox.pending_chats(db) == [20, 30, 10]
        assert await inbox.pending_chats(db, limit=2) == [20, 30]
        assert await outbox.pending_chats(db) == [40, 10, 50]
        assert await outbox.pending_chats(db, limit=1) == [40]


async def test_each_reply_keeps_the_persona_it_was_generated_with(
    store: ConversationStore,
) -> None:
    sid = (await store.active_session(7, 7)).id
    await store.record_turn(sid, 7, "hi", "hello", facts=ReplyFacts(persona="I am a pirate."))
    await store.set_persona(7, 7, "I love cats.", notice="ok")
    await store.record_turn(sid, 7, "and now?", "meow")  # not told: the session's now
    # An /arena duel answered with the cat persona, picked after a change: it read the cats.
    match = await store.request_arena(7, 7, notice="duel")
    await store.record_duel(
        sid, 7, match, "a joke?", (("a", "no."), ("b", "why?")), text="pick", markup=None,
        persona="I love cats.",
    )  # fmt: skip
    await store.set_persona(7, 7, "", notice="ok")
    await store.decide_duel(7, match, "b")
    async with store.sessionmaker() as db:
        rows = (await db.execute(select(Message.role, Message.persona).order_by(Message.id))).all()
    assert [tuple(r) for r in rows] == [
        ("user", None), ("bot", "I am a pirate."),
        ("user", None), ("bot", "I love cats."),
        ("user", None), ("bot", "I love cats."),
    ]  # fmt: skip


async def test_a_watched_update_counts_as_closed_only_once_its_closing_commit_is_done(
    store: ConversationStore,
) -> None:
    # The inbox worker skips its closing re-read for such an update (bot/tg/runner.py): a
    # rolled-back close must not count, or the update would be left pending unread.
    for update_id in (7001, 7002, 7003):
        await ingest(
            store, update_id=update_id, chat_id=70, user_id=70, kind="message", payload="{}"
        )
    with inbox.watching_close(7001) as watch, pytest.raises(RuntimeError):
        async with store.write() as db:
            await inbox.finish(db, UpdateRef(7001))
            raise RuntimeError("the turn failed after closing its update")
    assert not watch.closed
    assert await store_status(store, 7001) == "pending"
    session = await store.active_session(70)
    with inbox.watching_close(7002) as watch:
        await store.record_turn(session.id, 70, "hi", "hello!", update=UpdateRef(7002))
    assert watch.closed
    # another update's close, or a close outside the block, is not this watch's
    with inbox.watching_close(7001) as watch:
        await finish_update(store, UpdateRef(7003))
    assert not watch.closed
    # a session that rolled back a close and then commits something else closes nothing
    with inbox.watching_close(7001) as watch:
        async with store.sessionmaker() as db:
            await inbox.finish(db, UpdateRef(7001))
            await db.rollback()
            await db.commit()
    assert not watch.closed


async def store_status(store: ConversationStore, update_id: int) -> str | None:
    async with store.sessionmaker() as db:
        return await inbox.status_of(db, update_id)
