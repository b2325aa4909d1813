"""Run in a fresh process: rebuild a chat's agent from the database and print the model input.

Usage: python -m tests.support.rebuild_probe MODEL_FILE DATABASE_URL DATA_DIR CHAT_ID TEXT
"""

from __future__ import annotations

import asyncio
import json
import sys

from bot.config import Settings
from bot.conversations.store import ConversationStore
from bot.db.engine import make_engine, make_sessionmaker
from bot.inference.responder import Responder


async def main(model_file: str, db_url: str, data_dir: str, chat_id: int, text: str) -> None:
    """Print `INPUT=<json token ids>` for the next turn of `chat_id`."""
    settings = Settings(  # type: ignore[call-arg]
        _env_file=None, bot_model=model_file, database_url=db_url, data_dir=data_dir
    )
    db = make_engine(settings.db_url)
    store = ConversationStore(make_sessionmaker(db))
    responder = await Responder.start(settings, store)
    try:
        session = await store.active_session(chat_id)
        out = await responder.generate(session, text)
    finally:
        await responder.close()
        await db.dispose()
    print("INPUT=" + json.dumps(out.model_input))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]))
