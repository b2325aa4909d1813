"""bot.db.conversations.add_message, whose INSERT is built once per shape: a reply keeps the
persona and the variant identity it was made with, read by the statement itself where the caller
did not know them (the conversation's persona now, the variant's current identity), on both
backends."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bot.db import conversations, variants
from bot.db.conversations import NO_FACTS, ReplyFacts
from bot.db.engine import make_engine, make_sessionmaker
from bot.db.models import Message, Role
from bot.db.variants import StoredVariant


@pytest.fixture
async def sessionmaker(db_url: str) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    engine = make_engine(db_url)
    yield make_sessionmaker(engine)
    await engine.dispose()


async def test_a_reply_keeps_its_persona_and_variant_identity_known_or_read(
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    async with sessionmaker.begin() as db:
        await variants.seed(db, "main", "weights", [StoredVariant("b", None, 1.0, True)])
        identity = (await variants.load(db, "main")).variants[0].version  # type: ignore[union-attr]
        session = await conversations.create_session(db, 7, 7, "i like tea.")

        async def add(role: Role, text: str, facts: ReplyFacts = NO_FACTS) -> int:
            return await conversations.add_message(
                db, session_id=session.id, chat_id=7, role=role, text=text, facts=facts
            )

        written = {
            "user": await add(Role.USER, "hi"),
            "read": await add(Role.BOT, "hello", ReplyFacts(variant="b", latency_ms=12.5)),
            "known": await add(
                Role.BOT,
                "hello again",
                ReplyFacts(variant="b", variant_version=999, persona="i like coffee."),
            ),
            "no variant": await add(Role.BOT, "bye"),
            "unknown variant": await add(Role.BOT, "?", ReplyFacts(variant="gone")),
        }
    async with sessionmaker() as db:
        rows = {
            r.id: r
            for r in (
                await db.execute(
                    select(
                        Message.id,
                        Message.role,
                        Message.text,
                        Message.persona,
                        Message.variant,
                        Message.variant_version,
                        Message.latency_ms,
                        Message.created_at,
                    )
                )
            ).all()
        }
    assert len(set(written.values())) == 5 and set(written.values()) == set(rows)
    user, read, known = rows[written["user"]], rows[written["read"]], rows[written["known"]]
    assert (user.role, user.text, user.persona, user.variant_version) == ("user", "hi", None, None)
    assert user.created_at is not None and user.created_at.tzinfo is not None
    assert (read.persona, read.variant, read.variant_version, read.latency_ms) == (
        "i like tea.",
        "b",
        identity,
        12.5,
    )
    assert identity
    assert (known.persona, known.variant_version) == ("i like coffee.", 999)
    no_variant = rows[written["no variant"]]
    assert (no_variant.persona, no_variant.variant, no_variant.variant_version) == (
        "i like tea.",
        None,
        None,
    )
    assert rows[written["unknown variant"]].variant_version is None
