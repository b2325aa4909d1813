"""Every message between the service and a model process (bot/engine/pipe.py) crosses a real
multiprocessing pipe unchanged, carries its tag and version, and the set of tags is complete."""

from __future__ import annotations

import multiprocessing
from dataclasses import fields
from datetime import UTC, datetime

import pytest

from bot.db.conversations import MessageRow, SessionRow
from bot.engine import pipe
from bot.engine.protocol import ConversationContext, Generated, ModelView

SESSION = SessionRow(7, -100123, 42, "My name is Tom.", "active", datetime.now(UTC), None, 99, "b")
CONTEXT = ConversationContext(
    7,
    -100123,
    "My name is Tom.",
    [
        MessageRow(98, 7, "user", "hi"),
        MessageRow(99, 7, "bot", "Hi!"),
        MessageRow(100, 7, "bot", "What's up?", model_text="what ' s up ?"),
    ],
)
EXAMPLES: list[pipe.Message] = [
    pipe.TurnRequest(1, SESSION, "hello \u202e there", True, CONTEXT),
    pipe.TurnRequest(2, SESSION, "no context yet", False),
    pipe.Inspect(3, SESSION, CONTEXT),
    pipe.StatsRequest(4),
    pipe.StatsRequest(5, memory=True),
    pipe.Evict(7),
    pipe.Stored(7, 99),
    pipe.Stored(7, 99, "rep1ica"),
    pipe.Ping(),
    pipe.Stop(),
    pipe.Ready({"pid": 123, "model": "zoo:blender/blender_90M/model", "beam_size": 10}),
    pipe.Failed("loading x failed: FileNotFoundError"),
    pipe.ReplyMessage(1, Generated("Hi!", [5, 6, 7], 3, 12.5, ("Hi!", "Hello!"), True, None, 2)),
    pipe.ReplyMessage(1, Generated("What's up?", [5], 1, 3.0, model_text="what ' s up ?")),
    pipe.ReplyMessage(3, ModelView([1, 2], "your persona: my name is tom.", 0)),
    pipe.NeedContext(2, 24),
    pipe.NeedContext(2, None),
    pipe.Draft(1, "Hi there"),
    pipe.Error(1, "generation failed: RuntimeError: boom"),
    pipe.Stats(4, {"cached": 3, "rss": 10_000_000}),
    pipe.Pong(0.25),
]


def test_every_message_kind_has_one_class_and_an_example() -> None:
    assert sorted(m.kind for m in pipe.MESSAGES) == sorted(pipe.Kind)
    assert {type(m) for m in EXAMPLES} == set(pipe.MESSAGES)


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: type(m).__name__)
def test_a_message_crosses_a_real_pipe_unchanged(message: pipe.Message) -> None:
    ours, theirs = multiprocessing.get_context("spawn").Pipe()
    try:
        ours.send(message)
        got = theirs.recv()
    finally:
        ours.close()
        theirs.close()
    assert type(got) is type(message) and got == message
    assert got.kind == type(message).kind and got.version == pipe.PROTOCOL_VERSION
    assert [f.name for f in fields(got)] == [f.name for f in fields(message)]


def test_messages_are_immutable() -> None:
    with pytest.raises(AttributeError):
        pipe.Evict(1).session_id = 2  # type: ignore[misc]


def test_a_stale_versions_message_is_recognisable() -> None:
    """A process of another install says so in every message (the service refuses it)."""
    assert pipe.Ready({}, version=1).version != pipe.PROTOCOL_VERSION


def test_the_service_refuses_a_model_process_of_another_protocol_version() -> None:
    from bot.engine.backends.local import _first_message

    ctx = multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe()
    try:
        theirs.send(pipe.Ready({"pid": 1}, version=1))
        answer = _first_message(ours, ctx.Process())
        theirs.send(pipe.Ready({"pid": 1}))
        accepted = _first_message(ours, ctx.Process())
    finally:
        ours.close()
        theirs.close()
    assert isinstance(answer, pipe.Failed)
    assert "speaks pipe protocol 1" in answer.reason and "make install" in answer.reason
    assert accepted == pipe.Ready({"pid": 1})
