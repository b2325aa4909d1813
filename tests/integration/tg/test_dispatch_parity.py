"""`dispatch()` (bot/tg/handlers.py) re-implements PTB's handler-group loop so that a handler's
exception reaches the inbox worker. Pinned here: over the service's real handler table, the same
updates run exactly the handlers PTB's own `Application.process_update` runs, in the same order,
including a group -1 handler that stops an update (ApplicationHandlerStop)."""

from __future__ import annotations

from itertools import count
from pathlib import Path
from typing import Any

from telegram import Update
from telegram.ext import ApplicationHandlerStop, BaseHandler

from bot.app import build_application
from bot.conversations.turn import Turn
from bot.service.budget import SendBudget
from bot.tg.handlers import Handlers
from bot.tg.runner import dispatch
from tests.support.fakebotapi import FakeBotAPI
from tests.support.service_harness import make_settings

_ids = count(1)


def _message(chat_id: int, text: str | None = None, **extra: Any) -> dict[str, Any]:
    message: dict[str, Any] = {
        "message_id": next(_ids),
        "date": 1_700_000_000,
        "chat": {"id": chat_id, "type": "private" if chat_id > 0 else "group", "title": "g"},
        "from": {"id": abs(chat_id), "is_bot": False, "first_name": "U"},
        **extra,
    }
    if text is not None:
        message["text"] = text
        if text.startswith("/"):
            length = len(text.split()[0])
            message["entities"] = [{"type": "bot_command", "offset": 0, "length": length}]
    return message


def _updates() -> list[dict[str, Any]]:
    """One update of every kind the handlers tell apart (odd chat ids are stopped in group -1)."""
    bodies: list[dict[str, Any]] = [
        {"message": _message(2, "/start")},
        {"message": _message(2, "/persona My name is Sarah.")},
        {"message": _message(2, "/start@loopback_test_bot")},
        {"message": _message(2, "/nonsense")},
        {"message": _message(2, "/start@another_bot")},
        {"message": _message(2, "hello there")},
        {"message": _message(3, "hello there")},  # stopped by the gate
        {"edited_message": _message(2, "hello again")},
        {
            "message": _message(
                2,
                sticker={
                    "file_id": "x",
                    "file_unique_id": "y",
                    "width": 1,
                    "height": 1,
                    "is_animated": False,
                    "is_video": False,
                    "type": "regular",
                },
            )
        },
        {"message": _message(-4, new_chat_members=[{"id": 9, "is_bot": False, "first_name": "N"}])},
        {"channel_post": {**_message(-6, "a post"), "chat": {"id": -6, "type": "channel"}}},
        {
            "callback_query": {
                "id": "1",
                "from": {"id": 2, "is_bot": False, "first_name": "U"},
                "chat_instance": "c",
                "data": "vote:up:1",
                "message": _message(2, "a reply"),
            }
        },
        {
            "message_reaction": {
                "chat": {"id": 2, "type": "private", "first_name": "U"},
                "message_id": 5,
                "date": 1_700_000_000,
                "user": {"id": 2, "is_bot": False, "first_name": "U"},
                "old_reaction": [],
                "new_reaction": [{"type": "emoji", "emoji": "👍"}],
            }
        },
    ]
    return [{"update_id": 100 + i, **body} for i, body in enumerate(bodies)]


async def test_dispatch_runs_what_ptbs_process_update_runs(api: FakeBotAPI, tmp_path: Path) -> None:
    settings = make_settings(f"sqlite+aiosqlite:///{tmp_path / 'x.sqlite3'}", api, tmp_path)
    budget = SendBudget()
    application = build_application(settings, budget)
    Handlers(None, settings, None, budget).register(application)  # type: ignore[arg-type]
    ran: list[tuple[int, str]] = []

    def recorder(group: int, index: int, handler: BaseHandler[Any, Any, Any]) -> Any:
        name = f"{type(handler).__name__}#{index}:{getattr(handler.callback, '__name__', '?')}"

        async def record(update: Update, context: object) -> None:
            ran.append((update.update_id, name))
            if group == -1 and update.effective_chat is not None and update.effective_chat.id % 2:
                raise ApplicationHandlerStop

        return record

    for group, handlers in application.handlers.items():
        for index, handler in enumerate(handlers):
            handler.callback = recorder(group, index, handler)
    await application.initialize()
    try:
        updates = [Update.de_json(u, application.bot) for u in _updates()]
        for update in updates:
            await application.process_update(update)
        by_ptb, ran[:] = list(ran), []
        for update in updates:
            await dispatch(application, update, Turn(chat_id=0, update_id=update.update_id))
        ours = list(ran)
    finally:
        await application.shutdown()
    assert ours == by_ptb
    # The comparison covered every kind: each update ran something, the stopped one only the gate.
    assert {u for u, _ in by_ptb} == {u["update_id"] for u in _updates()}
    assert [name for u, name in by_ptb if u == 106] == ["TypeHandler#0:gate"]
    assert len({name for _, name in by_ptb}) >= 8
