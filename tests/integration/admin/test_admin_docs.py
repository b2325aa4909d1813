"""Every example query in docs/administration.md runs, read-only, and returns what it says.

The queries are parsed out of docs/administration.md (between its admin markers) on every
run, so the documentation and this test cannot drift apart: a new query without an
expectation here fails, and so does a changed one that returns something else.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import make_url

from bot.admin.sql import readonly_sql
from bot.conversations.store import ConversationStore
from tests.integration.admin.test_admin import CATS, PIRATE, Seed, seed
from tests.integration.admin.test_admin import sql_url as sql_url  # the fixture: a read-only role

DOC = Path(__file__).resolve().parents[3] / "docs" / "administration.md"
START, END = "<!-- admin:start -->", "<!-- admin:end -->"
BACKEND_LABELS = {"-- sqlite": "sqlite", "-- postgres": "postgresql"}


@dataclass(frozen=True)
class DocQuery:
    """One ```sql block: the heading above it, and the backend its first line names (if any)."""

    title: str
    sql: str
    backend: str | None


def doc_queries(start: str = START, end: str = END) -> list[DocQuery]:
    """The ```sql blocks between two markers of docs/administration.md (by default the admin
    ones; test_admin_variants reads its own section the same way)."""
    text = DOC.read_text(encoding="utf-8")
    assert text.count(start) == 1 and text.count(end) == 1, (
        f"markers {start} / {end} missing in docs/administration.md"
    )
    section = text[text.index(start) : text.index(end)]
    found = []
    title = ""
    for match in re.finditer(r"^(#+) ([^\n]+)$|^```sql\n(.*?)^```$", section, re.M | re.S):
        if match.group(2) is not None:
            title = match.group(2).strip()
            continue
        sql = match.group(3)
        first = sql.splitlines()[0].strip().lower()
        found.append(DocQuery(title, sql, BACKEND_LABELS.get(first)))
    return found


# For each heading: the columns to compare and the rows they must hold, in order. Columns left
# out hold timestamps, which the two backends return in different Python types.
def expected(s: Seed) -> dict[str, tuple[tuple[str, ...], list[tuple[Any, ...]]]]:
    """What each documented query returns for the seed."""
    return {
        "Transcript of one chat": (
            ("session_id", "status", "persona", "role", "text", "reply_persona"),
            [
                (s.s1, "done", CATS, "user", "hi", None),
                (s.s1, "done", CATS, "bot", "hello there", CATS),
                (s.s1, "done", CATS, "user", "do you like cats?", None),
                (s.s1, "done", CATS, "bot", "i love cats.", CATS),
                (s.s1, "done", CATS, "user", "bye", None),
                (s.s1, "done", CATS, "bot", "goodbye", CATS),
                (s.s2, "active", PIRATE, "user", "ahoy", None),
                (s.s2, "active", PIRATE, "bot", "arr matey", PIRATE),
            ],
        ),
        "Active chats per day": (
            ("day", "chats", "user_messages"),
            [(s.day(3), 1, 3), (s.day(2), 1, 1), (s.day(0), 2, 3)],
        ),
        "Messages per session": (
            ("session_id", "chat_id", "status", "messages", "from_user", "from_bot"),
            [
                (s.s1, 1001, "done", 6, 3, 3),
                (s.s2, 1001, "active", 2, 1, 1),
                (s.s3, 1002, "active", 4, 2, 2),
                (s.s4, 1003, "done", 2, 1, 1),
            ],
        ),
        "Longest conversations": (
            ("session_id", "chat_id", "persona", "messages"),
            [
                (s.s1, 1001, CATS, 6),
                (s.s3, 1002, PIRATE, 4),
                (s.s2, 1001, PIRATE, 2),
                (s.s4, 1003, "", 2),
            ],
        ),
        "Personas in use": (
            ("persona", "active_sessions", "sessions", "chats"),
            [(PIRATE, 2, 2, 2), ("", 0, 1, 1), (CATS, 0, 1, 1)],
        ),
        "Reply latency percentiles": (
            # 100, 200, 300, 400, 500, 600, 1000: ranks 4 (p50) and 7 (p95, p99).
            ("replies", "p50_ms", "p95_ms", "p99_ms", "max_ms"),
            [(7, 400.0, 1000.0, 1000.0, 1000.0)],
        ),
        "Undelivered replies": (
            ("chat_id", "text", "attempts", "state"),
            [(1001, "arr matey", 5, "given up"), (1002, "buried", 2, "queued")],
        ),
        "Failed inbox rows": (
            ("update_id", "chat_id", "kind", "error"),
            [(13, 1002, "message", "model crashed"), (15, 1001, "message", "boom")],
        ),
        "Busiest chats today": (
            ("chat_id", "messages", "from_user"),
            [(1002, 4, 2), (1001, 2, 1)],
        ),
        "Work waiting: inbox backlog and outbox queue": (
            ("inbox_pending", "outbox_queued", "outbox_given_up"),
            [(1, 1, 1)],
        ),
    }


def test_docs_document_8_to_10_queries_each_with_an_expectation() -> None:
    queries = doc_queries()
    titles = {q.title for q in queries}
    assert 8 <= len(titles) <= 10, sorted(titles)
    placeholder = Seed(today=datetime(2026, 1, 10, tzinfo=UTC), s1=1, s2=2, s3=3, s4=4)
    assert titles == set(expected(placeholder)), "documented queries and expectations differ"
    # A query with backend variants must have exactly one for each backend.
    for title in titles:
        labels = sorted(str(q.backend) for q in queries if q.title == title)
        assert labels in (["None"], ["postgresql", "sqlite"]), (title, labels)


async def assert_doc_queries_return(
    queries: list[DocQuery],
    want: dict[str, tuple[tuple[str, ...], list[tuple[Any, ...]]]],
    db_url: str,
    sql_url: str,
) -> None:
    """Each query for db_url's backend, run as `admin sql` runs it (its read-only connection),
    returns the rows `want` has under its title, in those columns; every title ran."""
    backend = make_url(db_url).get_backend_name()
    ran = set()
    failures = []
    for q in queries:
        if q.backend not in (None, backend):
            continue
        result = await readonly_sql(sql_url, q.sql)
        columns, rows = want[q.title]
        missing = [c for c in columns if c not in result.columns]
        if missing:
            failures.append(f"{q.title}: no column(s) {missing} in {result.columns}")
            continue
        index = [result.columns.index(c) for c in columns]
        got = [tuple(row[i] for i in index) for row in result.rows]
        if got != rows:
            failures.append(f"{q.title}:\n  got  {got}\n  want {rows}")
        ran.add(q.title)
    assert not failures, "\n".join(failures)
    assert ran == set(want)


async def test_every_documented_query_returns_the_expected_rows(
    store: ConversationStore, db_url: str, sql_url: str
) -> None:
    s = await seed(store)
    await assert_doc_queries_return(doc_queries(), expected(s), db_url, sql_url)


@pytest.mark.parametrize("label", ["-- sqlite", "-- postgres"])
def test_variant_labels_are_recognised(label: str) -> None:
    assert any(q.sql.startswith(label) for q in doc_queries()), label
