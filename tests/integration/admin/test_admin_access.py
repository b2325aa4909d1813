"""`admin access`: the rules and quotas it stores, what it refuses, and its audit rows."""

from __future__ import annotations

import json

from bot.db import audit
from bot.db.engine import make_engine, make_sessionmaker
from tests.integration.admin.test_admin import run


async def test_access_changes_are_stored_listed_and_audited(db_url: str) -> None:
    for argv in (
        ["access", "allow", "123"],
        ["access", "allow", "@Alice"],
        ["access", "deny", "chat:-100"],
        ["access", "deny", "user:123"],  # replaces its allow
        ["access", "quota", "55", "--per-day", "10"],
    ):
        status, said = await run(db_url, *argv)
        assert status == 0, (argv, said)
    status, said = await run(db_url, "access", "list", "--json")
    assert status == 0
    listed = json.loads(said)
    assert listed["rules"] == {"@alice": "allow", "chat:-100": "deny", "user:123": "deny"}
    assert listed["quotas"] == [{"user": 55, "per_day": 10, "per_minute": None}]
    # Removing a rule that is not there changes nothing and says so (status 1).
    status, said = await run(db_url, "access", "remove", "@nobody")
    assert status == 1 and "had no rule" in said
    assert (await run(db_url, "access", "remove", "@alice"))[0] == 0
    assert (await run(db_url, "access", "quota", "55", "--clear"))[0] == 0
    # Neither a limit nor --clear: a usage error, exit 2, nothing stored.
    assert (await run(db_url, "access", "quota", "55"))[0] == 2
    listed = json.loads((await run(db_url, "access", "list", "--json"))[1])
    assert listed["rules"] == {"chat:-100": "deny", "user:123": "deny"}
    assert listed["quotas"] == []
    engine = make_engine(db_url)
    try:
        async with make_sessionmaker(engine)() as db:
            rows = await audit.recent(db, 100)
    finally:
        await engine.dispose()
    # Every change, newest first; `list` is a read and is not recorded.
    assert [(r.action, r.target, r.result) for r in rows] == [
        ("access quota", "55", "exit 2"),
        ("access quota", "55", "ok"),
        ("access remove", "@alice", "ok"),
        ("access remove", "@nobody", "exit 1"),
        ("access quota", "55", "ok"),
        ("access deny", "user:123", "ok"),
        ("access deny", "chat:-100", "ok"),
        ("access allow", "@alice", "ok"),
        ("access allow", "user:123", "ok"),
    ]
    assert rows[4].details == {"user": 55, "per_day": 10, "clear": False}  # None is left out


async def test_forget_deletes_a_chats_refusal_but_not_the_operators_rules(db_url: str) -> None:
    from sqlalchemy import select

    from bot.db import access, inbox
    from bot.db.models import AccessRefusal, InboxStatus

    engine = make_engine(db_url)
    sessionmaker = make_sessionmaker(engine)
    try:
        async with sessionmaker.begin() as db:
            assert await access.claim_refusal(db, 88, 3600)
            assert await access.claim_refusal(db, 89, 3600)
            assert not await access.claim_refusal(db, 88, 3600)  # within the quiet hour
            # What a refused update leaves: its closed inbox row, without its content.
            await inbox.insert(
                db,
                update_id=1,
                chat_id=88,
                user_id=88,
                kind="message",
                payload='{"update_id": 1, "refused": "access"}',
                status=InboxStatus.IGNORED,
            )
        assert (await run(db_url, "access", "deny", "chat:88"))[0] == 0
        assert (await run(db_url, "forget", "88", "--yes"))[0] == 0
        async with sessionmaker() as db:
            left = list(await db.scalars(select(AccessRefusal.chat_id)))
            rules = await access.rules(db)
    finally:
        await engine.dispose()
    assert left == [89]
    assert rules == {"chat:88": "deny"}
