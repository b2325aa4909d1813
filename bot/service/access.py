"""Who may talk to the bot, and how much: the access gate at ingest and the reply quotas.

Access is decided when an update is stored (bot/tg/ingest.py), so a stranger's message is
never kept: its inbox row is closed at once ("ignored") with nothing of what they sent (the
row only keeps the update_id, so a redelivery stays a no-op), and it never reaches a handler,
the model or the history. A private chat gets one polite refusal, then silence for
REFUSAL_QUIET_S (the last refusal's time is in the database, so replicas agree); a group that
is not allowed gets none (most of a group's traffic is not for the bot at all).

Allowed: an admin (ADMIN_USER_IDS); else not when a `deny` rule names the user, the chat or
either's @username; else when nothing is on the allow-list (ALLOWED_USERS, ALLOWED_CHATS and
the `allow` rules of `admin access`), or something on it names the user, the chat or either's
@username. The rules are read from the database at most every RULES_TTL_S seconds, so
`admin access allow` reaches every replica within that time, without a restart; so are the
users' own quotas (`admin access quota`).

Quotas (QUOTA_PER_DAY, QUOTA_PER_MINUTE, or the user's own from `admin access quota`) are
counted in the database per reply (bot/db/access.py) when a text is about to be answered
(bot/tg/handlers.py); admins have none.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bot import texts
from bot.config import Settings
from bot.db import access, inbox, outbox
from bot.db.access import Over
from bot.db.models import InboxStatus, OutboxKind
from bot.service.metrics import Metrics

log = logging.getLogger(__name__)

# How long a replica trusts the access rules it read (seconds).
RULES_TTL_S = 3.0
# After a refusal, a chat hears nothing more for this long (seconds).
REFUSAL_QUIET_S = 3600.0


@dataclass(frozen=True, slots=True)
class Sender:
    """Who an update is from, as the access rules name them."""

    user_id: int | None
    username: str | None
    chat_id: int | None
    chat_username: str | None
    private: bool

    def subjects(self) -> set[str]:
        """Every name a rule could give this sender: user:<id>, chat:<id>, @names."""
        names = set()
        if self.user_id is not None:
            names.add(f"user:{self.user_id}")
        if self.chat_id is not None:
            names.add(f"chat:{self.chat_id}")
        for name in (self.username, self.chat_username):
            if name:
                names.add("@" + name.lower())
        return names


def settings_subjects(settings: Settings) -> frozenset[str]:
    """ALLOWED_USERS and ALLOWED_CHATS as rule subjects."""
    names = {f"user:{v}" if not v.startswith("@") else v for v in settings.allowed_users}
    names |= {f"chat:{v}" if not v.startswith("@") else v for v in settings.allowed_chats}
    return frozenset(names)


class Access:
    """The access gate and the quotas of one replica (the state is in the database)."""

    def __init__(
        self,
        settings: Settings,
        sessionmaker: async_sessionmaker[AsyncSession],
        metrics: Metrics | None = None,
        *,
        rules_ttl_s: float = RULES_TTL_S,
        quiet_s: float = REFUSAL_QUIET_S,
    ) -> None:
        self.sessionmaker = sessionmaker
        self.metrics = metrics
        self.admins = frozenset(settings.admin_user_ids)
        self.allowed = settings_subjects(settings)
        self.quota_per_day = settings.quota_per_day
        self.quota_per_minute = settings.quota_per_minute
        self.rules_ttl_s = rules_ttl_s
        self.quiet_s = quiet_s
        self._rules: dict[str, str] = {}
        self._quotas: dict[int, dict[str, int | None]] = {}  # user_id -> their own limits
        self._read_at = float("-inf")

    async def rules(self) -> dict[str, str]:
        """The `admin access` rules, read again once RULES_TTL_S old."""
        await self._read()
        return self._rules

    async def _read(self) -> None:
        """Read the rules and the users' own quotas again once RULES_TTL_S old (both are
        small tables; one read replaces a read per update and one per reply)."""
        if time.monotonic() - self._read_at < self.rules_ttl_s:
            return
        async with self.sessionmaker() as db:
            self._rules = await access.rules(db)
            self._quotas = {
                q.user_id: {"day": q.per_day, "minute": q.per_minute}
                for q in await access.all_quotas(db)
            }
        self._read_at = time.monotonic()

    async def allows(self, sender: Sender) -> bool:
        """Whether the sender may talk to the bot (see the module's docstring)."""
        if sender.user_id is not None and sender.user_id in self.admins:
            return True
        rules = await self.rules()
        names = sender.subjects()
        if any(rules.get(name) == access.DENY for name in names):
            return False
        allowed = self.allowed | {s for s, rule in rules.items() if rule == access.ALLOW}
        return not allowed or bool(names & allowed)

    async def refuse(
        self, db: AsyncSession, sender: Sender, *, update_id: int, kind: str, language: str | None
    ) -> bool:
        """Store the update closed, keeping nothing it said, and refuse the chat if it is a
        private one due a refusal, in the caller's transaction (the batch of updates being
        stored, bot/tg/ingest.py); False if it was stored before. Count it with `refused`
        once that transaction has committed."""
        new = await inbox.insert(
            db,
            update_id=update_id,
            chat_id=sender.chat_id,
            user_id=sender.user_id,
            kind=kind,
            payload=json.dumps({"update_id": update_id, "refused": "access"}),
            status=InboxStatus.IGNORED,
        )
        if (
            new
            and sender.private
            and sender.chat_id is not None
            and kind == "message"
            and await access.claim_refusal(db, sender.chat_id, self.quiet_s)
        ):
            await outbox.enqueue(
                db,
                chat_id=sender.chat_id,
                kind=OutboxKind.NOTICE,
                text=texts.for_language(texts.choose(None, language)).NOT_ALLOWED,
                update_id=update_id,
            )
            log.info("refused chat %s (not allowed)", sender.chat_id)
        return new

    def refused(self) -> None:
        """Count a refused update (once: not again on a redelivery), after its commit."""
        if self.metrics is not None:
            self.metrics.access_refused()

    async def limits(self, user_id: int) -> dict[str, int | None]:
        """The user's limits per window: their own (`admin access quota`, read at most
        RULES_TTL_S ago), else the global."""
        await self._read()
        own = self._quotas.get(user_id)
        if own is not None:
            return dict(own)
        return {"day": self.quota_per_day, "minute": self.quota_per_minute}

    async def take_reply(self, user_id: int | None) -> Over | None:
        """Count a reply against the user's quota; the full window if there is no room."""
        if user_id is None or user_id in self.admins:
            return None
        over = await access.take_reply(self.sessionmaker, user_id, await self.limits(user_id))
        if over is not None and self.metrics is not None:
            self.metrics.quota_hit(over.span)
        return over
