"""The dashboard's test database and a dashboard served from it, for the HTTP and browser tests.

The seed is the admin tests' own (tests/integration/admin/test_admin.py: stats with delivery
trouble; test_admin_variants.py: two variants with votes and ratings), plus one hostile conversation
whose persona and messages hold HTML and script, chat leases, and two replicas' heartbeats
(one live, one dead).
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from pydantic import SecretStr

from bot.config import Settings
from bot.conversations.store import ConversationStore
from bot.db.conversations import ReplyFacts
from bot.db.engine import make_engine, make_sessionmaker
from bot.db.models import ChatLease, Replica, utcnow
from tests.integration.admin.test_admin import seed
from tests.integration.admin.test_admin_variants import VARIANTS_TOML, seed_variants

PASSWORD = "correct horse battery staple"
HOSTILE_CHAT = 6660
HOSTILE_PERSONA = 'I am <b>bold</b> <img src=x onerror="window.__pwned=2">'
HOSTILE_TEXT = "<script>window.__pwned=1</script> hi & bye"
HOSTILE_REPLY = "</div><script>window.__pwned=3</script>"


@dataclass(frozen=True)
class DashboardSeed:
    """Ids a test looks for."""

    admin_sessions: tuple[int, int, int, int]  # test_admin.seed's s1..s4
    hostile_session: int


async def seed_dashboard(url: str) -> DashboardSeed:
    """Fill a migrated database (the tests' read-write connection, not the dashboard's)."""
    engine = make_engine(url)
    try:
        store = ConversationStore(make_sessionmaker(engine))
        s = await seed(store)
        await seed_variants(store.sessionmaker)
        hostile = (
            await store.set_persona(HOSTILE_CHAT, HOSTILE_CHAT, HOSTILE_PERSONA, notice="ok")
        ).id
        await store.record_turn(
            hostile,
            HOSTILE_CHAT,
            HOSTILE_TEXT,
            HOSTILE_REPLY,
            facts=ReplyFacts(latency_ms=321.0, variant="beam"),
        )
        await store.vote(HOSTILE_CHAT, HOSTILE_CHAT, None, 1)
        now = utcnow()
        async with store.sessionmaker.begin() as db:
            soon, gone = now + timedelta(seconds=30), now - timedelta(seconds=30)
            for chat_id, kind, owner, until in (
                (1001, "inbox", "hostA:11:aa", soon),
                (1002, "outbox", "hostA:11:aa", soon),
                (1003, "inbox", "hostB:22:bb", gone),
            ):
                db.add(ChatLease(chat_id=chat_id, kind=kind, owner=owner, lease_until=until))
        await _replicas(store, now)
        return DashboardSeed((s.s1, s.s2, s.s3, s.s4), hostile)
    finally:
        await engine.dispose()


async def _replicas(store: ConversationStore, now: datetime) -> None:
    info_a = {
        "mode": "polling",
        "poller": True,
        "ready": True,
        "problems": [],
        "workers": [
            {
                "variant": "beam",
                "pid": 111,
                "alive": True,
                "restarts": 2,
                "cache": {"cached": 5, "hits": 30, "misses": 10, "evictions": 1},
            }
        ],
    }
    info_b = {
        "mode": "polling",
        "poller": False,
        "ready": False,
        "problems": ["model worker nucleus is restarting"],
        "workers": [
            {
                "variant": "nucleus",
                "pid": 222,
                "alive": False,
                "restarts": 7,
                "cache": {"cached": 1, "hits": 1000, "misses": 1000, "evictions": 0},
            }
        ],
    }
    rows = [
        # A live replica beats every second; one beat an hour ahead keeps this one alive for
        # as long as a test runs, without a task that keeps writing.
        ("hostA:11:aa", "hostA", 11, now - timedelta(hours=1), now + timedelta(hours=1), info_a),
        # silent for a minute: dead, and its cache does not count
        ("hostB:22:bb", "hostB", 22, now - timedelta(hours=2), now - timedelta(minutes=1), info_b),
    ]
    async with store.sessionmaker.begin() as db:
        for owner, host, pid, started, beat, info in rows:
            db.add(
                Replica(
                    owner=owner,
                    host=host,
                    pid=pid,
                    started_at=started,
                    heartbeat_at=beat,
                    info=json.dumps(info),
                )
            )


def dashboard_settings(
    tmp_path: Path, db_url: str, readonly_url: str, **overrides: object
) -> Settings:
    """Settings for a dashboard over `db_url`, reading through `readonly_url` (and any other
    settings given by field name)."""
    variants = tmp_path / "variants.toml"
    variants.write_text(VARIANTS_TOML, encoding="utf-8")
    return Settings(  # type: ignore[call-arg]
        _env_file=None,
        data_dir=tmp_path / "data",
        database_url=SecretStr(db_url),
        admin_database_url=SecretStr(readonly_url) if readonly_url != db_url else None,
        variants_file=variants,
        dashboard_password=SecretStr(PASSWORD),
        dashboard_listen="127.0.0.1",
        dashboard_port=free_port(),
        **overrides,
    )


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
