"""The persona each reply was generated with: a /persona change reaches the model from the next
reply on, and the ParlAI export, the dashboard's transcript, /context and a conversation rebuilt
from the database all say the persona the model read, on a real (tiny) ParlAI model.

"What the model read" is captured inside ParlAI: the observation (`text_vec`) every observe() of
the agent's class returned while the chat went on. The export is read back by ParlAI's own
`fromfile` teacher and fed to a plain ParlAI clone (ParlAI's History, none of ours), the way a
fine-tune reads it; each example must give that clone exactly the input the live reply had.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from bot.config import Settings
from bot.conversations.store import ConversationStore
from bot.conversations.turn import Turn
from bot.conversations.usecases import UseCases
from bot.db.engine import make_engine, make_sessionmaker
from bot.db.models import Role
from bot.inference.model import load_shared_agent
from bot.inference.responder import Responder
from bot.reports import dashboard
from bot.texts import ENGLISH
from tests.integration.admin.test_export_episodes import export, read_with_fromfile_teacher
from tests.support.store_rows import pending_outbox

CHAT = 31
PIRATE = "I love the sea."
DOG = "I have a dog. My dog is my friend."
SUN = "I love the sun."


def _settings(model_file: str, tmp_path: Path) -> Settings:
    return Settings(  # type: ignore[call-arg]
        _env_file=None,
        bot_model=model_file,
        data_dir=tmp_path / "data",
        batch_max_wait_ms=5,
        model_device="cpu",
    )


@pytest.fixture(scope="module")
def shared_agent(tiny_model_file: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    return load_shared_agent(_settings(tiny_model_file, tmp_path_factory.mktemp("agent")))


@pytest.fixture
async def responder(
    shared_agent: Any, store: ConversationStore, tmp_path: Path, tiny_model_file: str
) -> AsyncIterator[Responder]:
    eng = Responder(shared_agent, store, _settings(tiny_model_file, tmp_path))
    await eng.batcher.start()
    yield eng
    await eng.close()


def _vec(obs: Any) -> list[int]:
    vec = obs.get("text_vec")
    return [] if vec is None else [int(t) for t in vec]


@pytest.fixture
def observed(shared_agent: Any, monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """Every model input the agent's class observed from now on (the live clones are clones of
    `shared_agent`, so they are of its class), in order."""
    seen: list[list[int]] = []
    cls = type(shared_agent)
    original: Callable[[Any, Any], Any] = cls.observe

    def observe(self: Any, observation: Any) -> Any:
        obs = original(self, observation)
        seen.append(_vec(obs))
        return obs

    monkeypatch.setattr(cls, "observe", observe)
    return seen


def _trained_inputs(shared_agent: Any, episodes: list[list[dict[str, Any]]]) -> list[list[int]]:
    """The model input of every example as a ParlAI fine-tune builds it from the export: a
    plain clone (ParlAI's own History) observes each example and hears its label."""
    from parlai.core.message import Message

    inputs: list[list[int]] = []
    for episode in episodes:
        clone = shared_agent.clone()
        clone.history.reset()
        for msg in episode:
            obs = clone.observe(Message(msg))
            inputs.append(_vec(obs))
            clone.self_observe(Message({"text": msg["labels"][0]}))
    return inputs


async def _notices(store: ConversationStore) -> list[str]:
    return [row.text for row in await pending_outbox(store, CHAT)]


async def test_export_uses_persona_the_model_read(
    store: ConversationStore,
    db_url: str,
    responder: Responder,
    shared_agent: Any,
    observed: list[list[int]],
    tmp_path: Path,
) -> None:
    cases = UseCases(store, responder, responder.settings)

    def turn() -> Turn:
        return Turn(chat_id=CHAT, user_id=CHAT, texts=ENGLISH)

    await cases.chat.text(turn(), "hello")  # no persona yet
    await cases.personas.set_persona(turn(), PIRATE)  # set after the first reply
    await cases.chat.text(turn(), "how are you")
    await cases.personas.set_persona(turn(), DOG)  # changed
    session = await store.active_session(CHAT)
    responder.evict(session.id)  # the next reply's clone is rebuilt from the database
    await cases.chat.context(turn())
    await cases.chat.text(turn(), "what do you like")
    await cases.personas.set_persona(turn(), "clear")  # cleared
    await cases.chat.text(turn(), "bye")
    await cases.personas.set_persona(turn(), SUN)  # after the last reply: it carries over /done
    await cases.chat.done(turn())
    await cases.chat.text(turn(), "hi")
    live = list(observed)
    assert len(live) == 5, "one observation per reply"
    budget = int(shared_agent.text_truncate)
    assert all(len(v) < budget for v in live), "nothing was cut to fit: the inputs compare whole"

    # The export, read by ParlAI's teacher, gives a fine-tune the inputs the replies had.
    path = tmp_path / "export.txt"
    status, _ = await export(db_url, "--format", "parlai", "-o", str(path))
    assert status == 0
    episodes = read_with_fromfile_teacher(path)
    assert _trained_inputs(shared_agent, episodes) == live

    # One episode per persona the replies read: none, the pirate, the dog, none; then /done,
    # and the next conversation starts with the persona that carried over.
    s1, s2 = session.id, (await store.active_session(CHAT)).id
    heads = [(int(e[0]["session_id"]), str(e[0]["text"]).split("\n")[0]) for e in episodes]
    assert heads == [
        (s1, "hello"),
        (s1, "your persona: I love the sea."),
        (s1, "your persona: I have a dog."),
        (s1, "hello"),
        (s2, "your persona: I love the sun."),
    ]
    personas = ["", PIRATE, DOG, "", SUN]
    read = {int(m["message_id"]): p for e, p in zip(episodes, personas, strict=True) for m in e}

    # The dashboard's transcript shows the persona each reply read, and where it changed.
    engine = make_engine(db_url)
    try:
        async with make_sessionmaker(engine)() as db:
            views = [await dashboard.transcript(db, sid) for sid in (s1, s2)]
    finally:
        await engine.dispose()
    replies = [line for v in views if v is not None for line in v.lines if line.role == Role.BOT]
    assert {line.id: line.reply_persona for line in replies} == read
    assert [line.persona_changed for line in replies] == [False, True, True, True, True]
    assert [v.persona for v in views if v is not None] == [SUN, SUN]  # the next reply's

    # /context (asked before the third reply, on a rebuilt clone) showed the persona the
    # third reply then read: its lines open that reply's observed input.
    context = next(text for text in await _notices(store) if text.startswith("What I read"))
    lines = context.split("\n")
    shown = lines[2 : lines.index("", 2)]
    assert shown == ["your persona: I have a dog.", "your persona: My dog is my friend."]
    head = shared_agent.dict.txt2vec("\n".join(shown))
    assert live[2][: len(head)] == head
