"""Drafts over the worker pipe: a real model worker process (tiny model) streams the best
hypothesis so far of a turn that asks for it, and nothing for one that does not."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path

from bot.config import Settings
from bot.db.conversations import SessionRow
from bot.engine.backends.local import ModelProcess, process_spec
from bot.engine.protocol import ConversationContext


class NoHistory:
    """A ContextSource for sessions with no stored messages yet."""

    async def load_context(
        self, session_id: int, tail: int | None, upto: int | None = None
    ) -> ConversationContext:
        return ConversationContext(session_id, session_id, "My name is Tom.", [])


def _session(session_id: int) -> SessionRow:
    return SessionRow(
        session_id, session_id, session_id, "My name is Tom.", "active", datetime.now(UTC), None
    )


@asynccontextmanager
async def tiny_worker(model_file: str, tmp_path: Path) -> AsyncIterator[ModelProcess]:
    """A started model worker process on `model_file`, with no stored history; closed at the
    end."""
    settings = Settings(  # type: ignore[call-arg]
        _env_file=None, bot_model=model_file, data_dir=tmp_path / "data"
    )
    handle = ModelProcess(process_spec("tiny", settings, {}, 1, ()), NoHistory())
    await handle.start()
    try:
        yield handle
    finally:
        await handle.close()


async def test_a_streamed_turn_gets_drafts_over_the_pipe(
    tiny_model_file: str, tmp_path: Path
) -> None:
    async with tiny_worker(tiny_model_file, tmp_path) as handle:
        drafts: list[str] = []
        streamed = await handle.generate(
            _session(1), "hello how are you today", on_draft=drafts.append
        )
        quiet = await handle.generate(_session(2), "hello how are you today")
        stats = await handle.stats()
        memory = await handle.stats(memory=True)
    assert drafts and all(drafts)  # whole words: never an empty preview
    assert len(set(drafts)) == len(drafts)  # only when the text changed
    assert streamed.text and quiet.text == streamed.text  # same input, same reply
    assert stats["requests"] == 2
    # Memory only when asked: measuring it pauses the worker's inference (pipe.StatsRequest),
    # and the heartbeat's status, every few seconds, does not read it.
    assert "rss" not in stats and "pss" not in stats
    assert memory["rss"] > 0 and memory["pss"] > 0 and memory["requests"] == 2
