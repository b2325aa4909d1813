"""What users see and what the model reads back are the model's own text (issue 33, part 1).

A cased byte-level BPE model (BlenderBot 400M-distill, 1B, 3B) keeps its case and spacing; a
lowercased, punctuation-splitting one (BlenderBot 90M, the tiny `re` model) keeps today's
detokenised display. Either way, a conversation goes on exactly as one ParlAI agent fed the
same turns would, also when its clone is evicted between turns and rebuilt from the database.
The reference is a fresh `create_agent_from_model_file` agent, never our own code."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from bot.config import Settings
from bot.conversations.store import ConversationStore
from bot.conversations.turn import Turn
from bot.conversations.usecases import UseCases
from bot.inference.batcher import chat_reply, reply_cleaner, verbatim_reply
from bot.inference.model import load_shared_agent
from bot.inference.responder import Responder
from bot.texts import ENGLISH

# Three turns; the cased model's replies carry capitals that lowercasing would lose.
TURNS = ["Hi, I'm Sarah from New York.", "Do you like Paris?", "What about Tom?"]
# The tiny `re` model's dictionary is lowercase words and punctuation.
LOWER_TURNS = ["hello how are you ?", "i like dogs .", "what is your name ?"]


def _settings(model_file: str, tmp_path: Path, scheduler: str) -> Settings:
    return Settings(  # type: ignore[call-arg]
        _env_file=None,
        bot_model=model_file,
        data_dir=tmp_path / "data",
        model_device="cpu",
        scheduler=scheduler,
        batch_max_wait_ms=0,
    )


def parlai_replies(
    model_file: str, turns: list[str], datapath: Path
) -> tuple[list[str], list[int]]:
    """What one ParlAI agent says to `turns`, fed with observe/act (its own self_observe), and
    the history it would read at its next turn (token ids)."""
    from bot.inference import compat

    compat.apply()
    from parlai.core.agents import create_agent_from_model_file
    from parlai.core.message import Message

    agent = create_agent_from_model_file(
        model_file,
        {"interactive_mode": True, "skip_generation": False, "no_cuda": True,
         "datapath": str(datapath)},
    )  # fmt: skip
    replies = []
    for turn in turns:
        agent.observe(Message({"text": turn, "episode_done": False}))
        replies.append(str(agent.act()["text"]))
    return replies, list(agent.history.get_history_vec())


@pytest.fixture(scope="module")
def cased_agent(cased_model_file: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("cased")
    return load_shared_agent(_settings(cased_model_file, tmp, "continuous"))


async def _responder(agent: Any, store: ConversationStore, settings: Settings) -> Responder:
    responder = Responder(agent, store, settings)
    await responder.batcher.start()
    return responder


@pytest.fixture(params=["continuous", "batch"])
async def cased(
    request: pytest.FixtureRequest,
    cased_agent: Any,
    cased_model_file: str,
    store: ConversationStore,
    tmp_path: Path,
) -> AsyncIterator[Responder]:
    settings = _settings(cased_model_file, tmp_path, request.param)
    responder = await _responder(cased_agent, store, settings)
    yield responder
    await responder.close()


@pytest.fixture(params=["continuous", "batch"])
async def lowercased(
    request: pytest.FixtureRequest,
    tiny_agent: Any,
    tiny_model_file: str,
    store: ConversationStore,
    tmp_path: Path,
) -> AsyncIterator[Responder]:
    settings = _settings(tiny_model_file, tmp_path, request.param)
    responder = await _responder(tiny_agent, store, settings)
    yield responder
    await responder.close()


async def converse(
    responder: Responder, store: ConversationStore, chat_id: int, turns: list[str], *, evict: bool
) -> tuple[list[str], list[str], list[str | None]]:
    """Each turn through the use case; the clone dropped after each when `evict` (the next is
    rebuilt from the database). Returns the stored replies, the texts queued for Telegram and
    the stored model texts."""
    cases = UseCases(store, responder, responder.settings)
    for turn in turns:
        await cases.chat.text(Turn(chat_id=chat_id, user_id=chat_id, texts=ENGLISH), turn)
        if evict:
            session = await store.active_session(chat_id)
            assert session is not None
            responder.evict(session.id)
    async with store.sessionmaker() as db:
        rows = list(
            await db.execute(
                text("SELECT text, model_text FROM messages WHERE chat_id = :c AND role = 'bot' "
                     "ORDER BY id"), {"c": chat_id},
            )
        )  # fmt: skip
        sent = await db.execute(
            text("SELECT text FROM outbox WHERE chat_id = :c AND kind = 'reply' ORDER BY id"),
            {"c": chat_id},
        )
        shown = [str(r[0]) for r in sent]
    return [str(r[0]) for r in rows], shown, [r[1] for r in rows]


async def _reads(responder: Responder, store: ConversationStore, chat_id: int) -> list[int]:
    """The token ids the chat's clone holds for the model's next turn (rebuilt from the
    database when it was evicted)."""
    session = await store.active_session(chat_id)
    assert session is not None
    return (await responder.inspect(session)).model_input


# --- the rule ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("opt", "cleaner"),
    [
        ({"dict_tokenizer": "bytelevelbpe", "dict_lower": False}, verbatim_reply),
        ({"dict_tokenizer": "bytelevelbpe"}, verbatim_reply),  # ParlAI's default: not lowered
        ({"dict_tokenizer": "slow_bytelevel_bpe", "dict_lower": False}, verbatim_reply),
        ({"dict_tokenizer": "gpt2", "dict_lower": False}, verbatim_reply),
        ({"dict_tokenizer": "bytelevelbpe", "dict_lower": True}, chat_reply),
        ({"dict_tokenizer": "bpe", "dict_lower": True}, chat_reply),  # BlenderBot 90M
        ({"dict_tokenizer": "re", "dict_lower": True}, chat_reply),
        ({"dict_tokenizer": "re", "dict_lower": False}, chat_reply),
        ({}, chat_reply),
    ],
)
def test_the_dictionary_decides_how_replies_are_shown(opt: dict[str, Any], cleaner: Any) -> None:
    assert reply_cleaner(opt) is cleaner


def test_cased_text_is_shown_as_it_is_and_tokenizer_text_is_detokenised() -> None:
    assert verbatim_reply(" Hi, I'm Sarah from New York. ") == "Hi, I'm Sarah from New York."
    assert verbatim_reply("  ") == "..."
    assert chat_reply("what ' s up ?") == "What's up?"


def test_each_tiny_model_gets_its_rule(cased_agent: Any, tiny_agent: Any) -> None:
    assert reply_cleaner(cased_agent.opt) is verbatim_reply
    assert reply_cleaner(tiny_agent.opt) is chat_reply


# --- the regressions ---------------------------------------------------------------------------


async def test_cased_model_reply_keeps_parlais_case(
    cased: Responder, store: ConversationStore, cased_model_file: str, tmp_path: Path
) -> None:
    """(a) The first reply users see and the database keeps is ParlAI's own text, case kept;
    it used to reach the user lowercased past sentence starts."""
    [reference], _ = parlai_replies(cased_model_file, TURNS[:1], tmp_path / "ref")
    assert chat_reply(reference) != reference.strip(), "the case must be at stake"
    stored, shown, _ = await converse(cased, store, 1, TURNS[:1], evict=False)
    assert stored == shown == [reference.strip()]


@pytest.mark.parametrize("evict", [True, False], ids=["rebuilt", "cached"])
async def test_cased_model_conversation_rebuilt_from_database_follows_parlai(
    cased: Responder, store: ConversationStore, cased_model_file: str, tmp_path: Path, evict: bool
) -> None:
    """(b) Three turns, the clone evicted between them (or kept): the model reads back what
    it said, so every reply is the one ParlAI's own agent gives to the same turns."""
    reference, history = parlai_replies(cased_model_file, TURNS, tmp_path / "ref")
    stored, shown, model_texts = await converse(cased, store, 2, TURNS, evict=evict)
    assert stored == shown == [r.strip() for r in reference]
    # Shown as the model said it: nothing else to keep.
    assert model_texts == [None if r == r.strip() else r for r in reference]
    # What the model reads at its next turn (rebuilt from the database when evicted) is
    # ParlAI's own history, token for token.
    assert await _reads(cased, store, 2) == history
    if evict:
        assert cased.cache.stats.misses >= len(TURNS)


@pytest.mark.parametrize("evict", [True, False], ids=["rebuilt", "cached"])
async def test_lowercased_model_keeps_todays_display_and_exact_rebuild(
    lowercased: Responder, store: ConversationStore, tiny_model_file: str, tmp_path: Path,
    evict: bool,
) -> None:  # fmt: skip
    """(c) A lowercased `re` dictionary's reply is still detokenised and capitalised for users,
    the model's tokenizer text is kept beside it, and a rebuilt conversation goes on as
    ParlAI's agent does."""
    reference, history = parlai_replies(tiny_model_file, LOWER_TURNS, tmp_path / "ref")
    stored, shown, model_texts = await converse(lowercased, store, 3, LOWER_TURNS, evict=evict)
    assert stored == shown == [chat_reply(r) for r in reference]
    assert await _reads(lowercased, store, 3) == history
    assert model_texts == [None if r == chat_reply(r) else r for r in reference]
    assert any(m is not None for m in model_texts), "the display must differ from the model's"
