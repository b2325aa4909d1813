"""Chat settings: what a chat chose for itself (its language, /lang)."""

from __future__ import annotations

from sqlalchemy import bindparam, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from bot.db.dialect import insert_unless_present
from bot.db.engine import Prepared
from bot.db.models import ChatSetting, utcnow


async def language_of(db: AsyncSession, chat_id: int) -> str | None:
    """The language a chat chose with /lang; None: it follows each sender's."""
    return (await _LANGUAGE_OF.execute(db, {"p_chat_id": chat_id})).scalar()


# Built once, on the session's connection (bot.db.engine): read for every update.
_LANGUAGE_OF = Prepared(
    lambda dialect: select(ChatSetting.language).where(
        ChatSetting.chat_id == bindparam("p_chat_id")
    )
)


async def set_language(db: AsyncSession, chat_id: int, language: str | None) -> None:
    """Store a chat's language (None: back to each sender's Telegram language)."""
    changed = await db.execute(
        update(ChatSetting)
        .where(ChatSetting.chat_id == chat_id)
        .values(language=language, updated_at=utcnow())
    )
    if not getattr(changed, "rowcount", 0):
        await insert_unless_present(
            db,
            ChatSetting,
            {"chat_id": chat_id, "language": language, "updated_at": utcnow()},
            ["chat_id"],
        )
