"""Alembic is the schema authority: every revision goes up, down and up again, and the
models agree with the migrations, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
from typing import Any

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import text

from bot.db import migrate
from bot.db.engine import make_engine
from bot.db.models import Base, utcnow
from tests.support.dbutil import TABLES, create_pg_database, drop_pg_database, table_names

CATS = "I love cats."


async def _diff(url: str) -> list[object]:
    engine = make_engine(url)
    try:
        async with engine.connect() as conn:

            def compare(sync_conn: object) -> list[object]:
                ctx = MigrationContext.configure(sync_conn, opts={"compare_type": True})
                return list(compare_metadata(ctx, Base.metadata))

            return await conn.run_sync(compare)
    finally:
        await engine.dispose()


def test_stairway_every_revision_up_down_up(empty_db_url: str) -> None:
    cfg = migrate.alembic_config(empty_db_url)
    revisions = list(ScriptDirectory.from_config(cfg).walk_revisions("base", "heads"))
    revisions.reverse()
    assert revisions, "no migrations found"
    for rev in revisions:
        migrate.upgrade(empty_db_url, rev.revision)
        migrate.downgrade(empty_db_url, rev.down_revision or "base")
        migrate.upgrade(empty_db_url, rev.revision)
    assert asyncio.run(table_names(empty_db_url)) == TABLES


def test_downgrade_base_removes_every_table(empty_db_url: str) -> None:
    migrate.upgrade(empty_db_url)
    migrate.downgrade(empty_db_url, "base")
    assert asyncio.run(table_names(empty_db_url)) <= {"alembic_version"}


def test_models_and_migrations_agree(db_url: str) -> None:
    assert asyncio.run(_diff(db_url)) == []


def test_replicas_that_start_together_migrate_one_at_a_time() -> None:
    # Three replicas of a fresh deployment run `upgrade` at the same moment (processes:
    # Alembic's context is global): without the advisory lock, all but one fail with
    # "relation already exists".
    import subprocess
    import sys

    url = create_pg_database()  # replicas share PostgreSQL (SQLite is one process's)
    try:
        code = "import sys; from bot.db import migrate; migrate.upgrade(sys.argv[1])"
        runs = [
            subprocess.Popen([sys.executable, "-c", code, url], stderr=subprocess.PIPE)
            for _ in range(3)
        ]
        for run in runs:
            _, err = run.communicate(timeout=120)
            assert run.returncode == 0, err.decode()[-2000:]
        assert asyncio.run(table_names(url)) == TABLES
    finally:
        drop_pg_database(url)


# --- 0010: the persona each reply read -----------------------------------------------------------


async def _seed_0009(url: str) -> dict[str, int]:
    """Today's data as a 0009 database holds it: a conversation whose persona is set, one
    without, an /arena duel still waiting for its pick; a delivered reply with a vote. Written
    with Core inserts of the columns 0009 has (the ORM's tables have 0010's too)."""
    from sqlalchemy import insert

    from bot.db.models import ArenaMatch, Message, Outbox, Session, Vote

    engine = make_engine(url)
    ids: dict[str, int] = {}
    try:
        async with engine.begin() as db:

            async def row(table: Any, **values: Any) -> int:
                result = await db.execute(insert(table).values(**values))
                return int(result.inserted_primary_key[0])

            s1 = await row(Session.__table__, chat_id=1, persona=CATS, status="done")
            s2 = await row(Session.__table__, chat_id=2, persona="", status="active")
            for sid, chat, user, bot in (
                (s1, 1, "hi", "hello"),
                (s1, 1, "do you like cats?", "i do"),
                (s2, 2, "hey", "hi!"),
            ):
                await row(Message.__table__, session_id=sid, chat_id=chat, role="user", text=user)
                ids[bot] = await row(
                    Message.__table__, session_id=sid, chat_id=chat, role="bot", text=bot
                )
            await row(
                Outbox.__table__, chat_id=1, kind="reply", text="hello", message_id=ids["hello"]
            )
            await row(
                Vote.__table__, chat_id=1, message_id=ids["hello"], user_id=1, value=1,
                source="button", updated_at=utcnow(),
            )  # fmt: skip
            duel = await row(
                Message.__table__, session_id=s2, chat_id=2, role="user", text="a joke?"
            )
            ids["match"] = await row(
                ArenaMatch.__table__, chat_id=2, session_id=s2, user_message_id=duel,
                variant_a="a", text_a="no.", variant_b="b", text_b="why?",
            )  # fmt: skip
        ids |= {"s1": s1, "s2": s2}
        return ids
    finally:
        await engine.dispose()


async def _read(url: str, sql: str) -> list[tuple[Any, ...]]:
    engine = make_engine(url)
    try:
        async with engine.connect() as conn:
            return [tuple(r) for r in await conn.execute(text(sql))]
    finally:
        await engine.dispose()


async def _after_upgrade(url: str, ids: dict[str, int]) -> None:
    from bot.admin import export
    from bot.conversations.store import ConversationStore
    from bot.db.engine import make_sessionmaker

    # Every existing reply read its session's persona as it is now; user messages have none.
    rows = await _read(url, "SELECT session_id, role, persona FROM messages ORDER BY id")
    s1, s2 = ids["s1"], ids["s2"]
    assert rows == [
        (s1, "user", None), (s1, "bot", CATS), (s1, "user", None), (s1, "bot", CATS),
        (s2, "user", None), (s2, "bot", ""), (s2, "user", None),
    ]  # fmt: skip
    assert await _read(url, "SELECT persona FROM arena_matches") == [("",)]

    engine = make_engine(url)
    try:
        # The export reads them as it did before: the persona from the first turn on.
        got = [e async for e in export.episodes(engine, export.EpisodeFilter())]
        assert [(e.session_id, [x.text for x in e.examples]) for e in got] == [
            (s1, ["your persona: I love cats.\nhi", "do you like cats?"]),
            (s2, ["hey"]),
        ]
        # A persona set after the migration reaches the next reply only; the duel's pick
        # keeps the persona its replies were generated with.
        store = ConversationStore(make_sessionmaker(engine))
        await store.set_persona(2, 2, "I am a pirate.", notice="ok")
        picked = (await store.decide_duel(2, ids["match"], "b")).bot_message_id
        turn = await store.record_turn(s2, 2, "ahoy", "arr")
    finally:
        await engine.dispose()
    personas = dict(await _read(url, "SELECT id, persona FROM messages WHERE role = 'bot'"))
    assert (personas[picked], personas[turn.bot_message_id]) == ("", "I am a pirate.")


def test_0010_keeps_todays_conversations_readable(empty_db_url: str) -> None:
    migrate.upgrade(empty_db_url, "0009")
    ids = asyncio.run(_seed_0009(empty_db_url))
    migrate.upgrade(empty_db_url)
    asyncio.run(_after_upgrade(empty_db_url, ids))
    # Down again: the columns go, the rows stay, and so does everything that points at a
    # message (a rebuilt `messages` table on SQLite would have taken the vote and the duel).
    counts = "SELECT (SELECT COUNT(*) FROM messages), (SELECT COUNT(*) FROM outbox), " \
             "(SELECT COUNT(*) FROM votes), (SELECT COUNT(*) FROM arena_matches)"  # fmt: skip
    before = asyncio.run(_read(empty_db_url, counts))
    assert before == [(10, 3, 1, 1)]
    migrate.downgrade(empty_db_url, "0009")
    assert asyncio.run(_read(empty_db_url, counts)) == before


# --- 0011: the model's own text beside the text shown ----------------------------------------


async def _after_0011(url: str, ids: dict[str, int]) -> None:
    from bot.conversations.store import ConversationStore
    from bot.db.conversations import ReplyFacts
    from bot.db.engine import make_sessionmaker

    # Existing rows keep NULL: their rebuild reads the text, as before.
    assert await _read(url, "SELECT DISTINCT model_text FROM messages") == [(None,)]
    engine = make_engine(url)
    try:
        store = ConversationStore(make_sessionmaker(engine))
        before = await store.load_context(ids["s1"], None)
        assert [(m.text, m.model_text) for m in before.messages] == [
            ("hi", None), ("hello", None), ("do you like cats?", None), ("i do", None),
        ]  # fmt: skip
        # A reply stored now keeps the model's text beside the one shown, and the context a
        # conversation is rebuilt from carries both; the user's message has none.
        facts = ReplyFacts(model_text="what ' s up ?")
        turn = await store.record_turn(ids["s2"], 2, "yo", "What's up?", facts=facts)
        after = await store.load_context(ids["s2"], 2)
    finally:
        await engine.dispose()
    assert [(m.id, m.text, m.model_text) for m in after.messages] == [
        (turn.user_message_id, "yo", None),
        (turn.bot_message_id, "What's up?", "what ' s up ?"),
    ]


def test_0011_keeps_existing_replies_and_stores_the_models_text(empty_db_url: str) -> None:
    migrate.upgrade(empty_db_url, "0009")
    ids = asyncio.run(_seed_0009(empty_db_url))
    migrate.upgrade(empty_db_url, "0010")
    migrate.upgrade(empty_db_url, "0011")
    migrate.upgrade(empty_db_url)  # the ORM writes today's columns (0012's too)
    asyncio.run(_after_0011(empty_db_url, ids))
    counts = "SELECT (SELECT COUNT(*) FROM messages), (SELECT COUNT(*) FROM votes), " \
             "(SELECT COUNT(*) FROM arena_matches)"  # fmt: skip
    before = asyncio.run(_read(empty_db_url, counts))
    migrate.downgrade(empty_db_url, "0010")
    assert asyncio.run(_read(empty_db_url, counts)) == before
    rows = asyncio.run(_read(empty_db_url, "SELECT text FROM messages WHERE role = 'bot'"))
    assert ("What's up?",) in rows


# --- 0012: variant identities; moved and fallback assignments ---------------------------------


async def _seed_0011(url: str) -> dict[str, int]:
    """A 0011 database mid-experiment: variants a (control) and b stored; a name "old" removed
    before the migration whose reply, vote, rating and chat are still there; a reply of each,
    voted on, a rated conversation and a decided duel. Core inserts of 0011's columns."""
    from sqlalchemy import insert

    from bot.db.models import (
        ArenaMatch,
        Assignment,
        ExperimentRow,
        Message,
        Rating,
        Session,
        VariantRow,
        Vote,
    )

    engine = make_engine(url)
    ids: dict[str, int] = {}
    now = utcnow()
    try:
        async with engine.begin() as db:

            async def row(table: Any, **values: Any) -> int:
                result = await db.execute(insert(table).values(**values))
                return int(result.inserted_primary_key[0])

            await db.execute(
                insert(ExperimentRow.__table__).values(name="exp", created_at=now, updated_at=now)
            )
            for position, (name, model, control) in enumerate(
                (("a", None, True), ("b", "zoo:b", False)), start=1
            ):
                await db.execute(insert(VariantRow.__table__).values(
                    experiment="exp", name=name, position=position, model=model, weight=1.0,
                    is_control=control, options='{"topp": 0.9}', created_at=now, updated_at=now,
                ))  # fmt: skip
            for chat, name in ((1, "a"), (2, "b"), (3, "old")):
                await db.execute(insert(Assignment.__table__).values(
                    chat_id=chat, experiment="exp", variant=name, source="hash",
                    probability=0.5, allocation='{"by": "weights", "split": {"a": 0.5, "b": 0.5}}',
                ))  # fmt: skip
                sid = await row(Session.__table__, chat_id=chat, status="done")
                await row(Message.__table__, session_id=sid, chat_id=chat, role="user", text="hi")
                ids[name] = await row(
                    Message.__table__, session_id=sid, chat_id=chat, role="bot", text="yo",
                    variant=name,
                )  # fmt: skip
                await row(
                    Vote.__table__, chat_id=chat, message_id=ids[name], user_id=chat, value=1,
                    source="button", variant=name, updated_at=now,
                )  # fmt: skip
                await row(Rating.__table__, chat_id=chat, session_id=sid, value=4, variant=name)
                if name == "b":
                    await row(
                        ArenaMatch.__table__, chat_id=chat, session_id=sid,
                        user_message_id=ids[name], variant_a="a", text_a="x", variant_b="old",
                        text_b="y", winner="a",
                    )  # fmt: skip
        return ids
    finally:
        await engine.dispose()


def test_0012_gives_every_existing_row_the_identity_of_its_name(empty_db_url: str) -> None:
    migrate.upgrade(empty_db_url, "0011")
    asyncio.run(_seed_0011(empty_db_url))
    migrate.upgrade(empty_db_url, "0012")
    read = lambda sql: asyncio.run(_read(empty_db_url, sql))  # noqa: E731
    identities = read(
        "SELECT id, experiment, name, model, options, retired_at IS NOT NULL "
        "FROM variant_versions ORDER BY id"
    )
    # The stored variants in their order, then the name only the history knows, retired.
    assert [row[1:] for row in identities] == [
        ("exp", "a", None, '{"topp": 0.9}', False),
        ("exp", "b", "zoo:b", '{"topp": 0.9}', False),
        ("exp", "old", None, "{}", True),
    ]
    a, b, old = (row[0] for row in identities)
    assert a < b < old
    assert read("SELECT name, version_id FROM variants ORDER BY name") == [("a", a), ("b", b)]
    by_name = {"a": a, "b": b, "old": old}
    for table in ("messages", "votes", "ratings"):
        rows = read(f"SELECT variant, variant_version FROM {table} WHERE variant IS NOT NULL")
        assert sorted(rows) == sorted(by_name.items()), table
    assert read("SELECT version_a, version_b FROM arena_matches") == [(a, old)]
    # A user message has no variant, and no identity.
    assert read("SELECT DISTINCT variant_version FROM messages WHERE role = 'user'") == [(None,)]

    # The new sources are taken; the old ones still are.
    for chat, source in ((1, "moved"), (2, "fallback")):
        asyncio.run(_exec(empty_db_url, f"UPDATE assignments SET source = '{source}' "
                                        f"WHERE chat_id = {chat}"))  # fmt: skip

    # Down again: the identities go, every row stays, and the new sources become what the
    # release before stored (a move not drawn: admin; a fallback: a hash draw of probability 1).
    counts = "SELECT (SELECT COUNT(*) FROM messages), (SELECT COUNT(*) FROM votes), " \
             "(SELECT COUNT(*) FROM ratings), (SELECT COUNT(*) FROM arena_matches)"  # fmt: skip
    before = read(counts)
    assert before == [(6, 3, 3, 1)]
    migrate.downgrade(empty_db_url, "0011")
    assert read(counts) == before
    assert read("SELECT chat_id, source FROM assignments ORDER BY chat_id") == [
        (1, "admin"), (2, "hash"), (3, "hash"),
    ]  # fmt: skip
    later = {"variant_versions", "autopilot_decisions", "audit_log"}  # 0012-0014's
    assert asyncio.run(table_names(empty_db_url)) == TABLES - later
    migrate.upgrade(empty_db_url)


async def _exec(url: str, sql: str) -> None:
    engine = make_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.execute(text(sql))
    finally:
        await engine.dispose()


# --- 0013: the autopilot's policy and decisions ---------------------------------------------


async def _write(url: str, *statements: str) -> None:
    engine = make_engine(url)
    try:
        async with engine.begin() as conn:
            for sql in statements:
                await conn.execute(text(sql))
    finally:
        await engine.dispose()


def test_0013_adds_the_autopilot_off_and_one_decision_per_version(empty_db_url: str) -> None:
    from sqlalchemy.exc import IntegrityError

    cfg = migrate.alembic_config(empty_db_url)
    before_0013 = ScriptDirectory.from_config(cfg).get_revision("0013").down_revision
    assert isinstance(before_0013, str)
    migrate.upgrade(empty_db_url, before_0013)
    now = "'2026-03-01 12:00:00.000000'"
    asyncio.run(
        _write(
            empty_db_url,
            f"INSERT INTO experiments (name, allocation, version, created_at, updated_at) "
            f"VALUES ('exp', 'weights', 7, {now}, {now})",
            f"INSERT INTO variants (experiment, name, position, model, weight, is_control, "
            f"options, created_at, updated_at) VALUES ('exp', 'a', 1, NULL, 1.0, true, '{{}}', "
            f"{now}, {now})",
        )
    )
    migrate.upgrade(empty_db_url, "0013")
    # An existing experiment keeps its version and has the autopilot off.
    assert asyncio.run(_read(empty_db_url, "SELECT name, version, autopilot FROM experiments")) == [
        ("exp", 7, None)
    ]
    decision = (
        "INSERT INTO autopilot_decisions (experiment, based_on, variant, control, action, "
        "reason, figures, decided_by, created_at) VALUES ('exp', 7, 'b', 'a', 'ACTION', 'r', "
        f"'{{}}', 'replica', {now})"
    )
    asyncio.run(_write(empty_db_url, decision.replace("ACTION", "promote")))
    # One decision per (experiment, version it was based on); only promote and rollback.
    for action in ("rollback", "pause"):
        try:
            asyncio.run(_write(empty_db_url, decision.replace("ACTION", action)))
        except IntegrityError:
            pass
        else:
            raise AssertionError(f"a second decision on version 7 ({action}) was stored")
    assert asyncio.run(_read(empty_db_url, "SELECT COUNT(*) FROM autopilot_decisions")) == [(1,)]
    migrate.downgrade(empty_db_url, before_0013)
    assert "autopilot_decisions" not in asyncio.run(table_names(empty_db_url))
    # The experiment and its variant stay (no cascade from a rebuilt table).
    assert asyncio.run(_read(empty_db_url, "SELECT name, version FROM experiments")) == [("exp", 7)]
    assert asyncio.run(_read(empty_db_url, "SELECT COUNT(*) FROM variants")) == [(1,)]


# --- 0014: the audit log ---------------------------------------------------------------------


def test_0014_adds_an_empty_audit_log_that_takes_only_known_sources(empty_db_url: str) -> None:
    from sqlalchemy.exc import IntegrityError

    migrate.upgrade(empty_db_url, "0013")
    now = "'2026-03-01 12:00:00.000000'"
    asyncio.run(
        _write(
            empty_db_url,
            f"INSERT INTO experiments (name, allocation, version, created_at, updated_at) "
            f"VALUES ('exp', 'weights', 4, {now}, {now})",
        )
    )
    migrate.upgrade(empty_db_url, "0014")
    assert asyncio.run(_read(empty_db_url, "SELECT COUNT(*) FROM audit_log")) == [(0,)]
    row = (
        "INSERT INTO audit_log (at, actor, source, action, target, details, result) "
        f"VALUES ({now}, 'alice', 'SOURCE', 'variants weight', 'b', '{{}}', 'ok')"
    )
    for source in ("cli", "telegram", "autopilot"):
        asyncio.run(_write(empty_db_url, row.replace("SOURCE", source)))
    try:
        asyncio.run(_write(empty_db_url, row.replace("SOURCE", "cron")))
    except IntegrityError:
        pass
    else:
        raise AssertionError("a row from an unknown source was stored")
    read = "SELECT id, source FROM audit_log ORDER BY id"
    ids = asyncio.run(_read(empty_db_url, read))
    assert [s for _, s in ids] == ["cli", "telegram", "autopilot"]
    assert [i for i, _ in ids] == sorted({i for i, _ in ids})  # ids increase
    migrate.downgrade(empty_db_url, "0013")
    assert "audit_log" not in asyncio.run(table_names(empty_db_url))
    assert asyncio.run(_read(empty_db_url, "SELECT name, version FROM experiments")) == [("exp", 4)]
    migrate.upgrade(empty_db_url)
    assert asyncio.run(_read(empty_db_url, "SELECT COUNT(*) FROM audit_log")) == [(0,)]
