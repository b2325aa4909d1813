"""PersonaHistory: the persona pinned at the head of the model input, the oldest turns dropped
first, and a rebuild (`fill`) that gives exactly the input of the turns observed one by one.

On the tiny model's real dictionary (text_truncate 64), through `new_clone` as the cache makes
every conversation's history.
"""

from __future__ import annotations

from typing import Any

import pytest

from bot.inference.cache import new_clone
from bot.inference.model_input import PERSONA_SHARE, PersonaHistory

PERSONA = "My name is Sarah. I love hiking."
PERSONA_TEXT = "your persona: My name is Sarah.\nyour persona: I love hiking."
WORDS = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]


def _history(agent: Any, persona: str = PERSONA) -> PersonaHistory:
    history = new_clone(agent, persona).history
    assert isinstance(history, PersonaHistory)
    return history


def _say(history: PersonaHistory, role: str, text: str) -> None:
    """A turn the way a clone gets it: observe() for the user, self_observe() for the bot."""
    if role == "user":
        history.update_history({"text": text, "episode_done": False})
    else:
        history.add_reply(text)


def _turns(n: int) -> list[tuple[str, str]]:
    """`n` alternating turns, user first, each a different text."""
    return [
        ("user" if i % 2 == 0 else "bot", f"{WORDS[i % 10]} {WORDS[i // 10 % 10]} do you like dogs")
        for i in range(n)
    ]


def test_the_model_input_is_the_persona_lines_then_the_turns(tiny_agent: Any) -> None:
    history = _history(tiny_agent)
    assert history.get_history_vec() is None  # nothing said yet
    _say(history, "user", "hello how are you")
    _say(history, "bot", "i am fine")
    text = f"{PERSONA_TEXT}\nhello how are you\ni am fine"
    assert history.get_history_str() == text
    assert history.get_history_vec() == tiny_agent.dict.txt2vec(text)


def test_without_a_persona_the_input_is_the_turns_alone(tiny_agent: Any) -> None:
    history = _history(tiny_agent, persona="")
    _say(history, "user", "hello")
    assert history.persona_vec == []
    assert history.get_history_str() == "hello"
    assert history.get_history_vec() == tiny_agent.dict.txt2vec("hello")


def test_trim_keeps_the_persona_at_the_head_and_drops_the_oldest_turns_first(
    tiny_agent: Any,
) -> None:
    history = _history(tiny_agent)
    turns = _turns(60)
    for role, text in turns:
        _say(history, role, text)
    max_len = int(history.max_len)
    vec = history.get_history_vec()
    assert vec is not None and len(vec) <= max_len
    # The persona first, then the newest turns that fit, whole.
    fitting = max(
        m
        for m in range(1, len(turns) + 1)
        if len(tiny_agent.dict.txt2vec("\n".join([PERSONA_TEXT] + [t for _, t in turns[-m:]])))
        <= max_len
    )
    assert 1 < fitting < len(turns)
    kept = [PERSONA_TEXT] + [t for _, t in turns[-fitting:]]
    assert vec == tiny_agent.dict.txt2vec("\n".join(kept))
    # Only the turns that can still reach the model under any persona are kept: the newest
    # ones, in order, as many as fill the context with no persona at all (so a shorter persona
    # set later finds the turns it has room for), and none more.
    kept_raw = history.history_raw_strings
    assert kept_raw == [t for _, t in turns[-len(kept_raw) :]]
    budget = max_len - (history._global_end_token is not None)
    texts = [t for _, t in turns]
    needed = min(
        m
        for m in range(1, len(turns) + 1)
        if len(tiny_agent.dict.txt2vec("\n".join(texts[-m:]))) >= budget
    )
    assert len(kept_raw) == needed > fitting


@pytest.mark.parametrize("n", [1, 2, 7, 60])
def test_fill_gives_the_model_input_of_the_turns_observed_one_by_one(
    tiny_agent: Any, n: int
) -> None:
    observed = _history(tiny_agent)
    turns = _turns(n)
    for role, text in turns:
        _say(observed, role, text)
    rebuilt = _history(tiny_agent)
    rebuilt.fill(turns)
    assert rebuilt.get_history_vec() == observed.get_history_vec()
    assert rebuilt.get_history_str() == observed.get_history_str()
    assert rebuilt.history_raw_strings == observed.history_raw_strings
    assert rebuilt.last_role == observed.last_role == turns[-1][0]


def test_fill_tokenizes_only_the_turns_that_fit(
    tiny_agent: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    history = _history(tiny_agent)
    parse = history.parse
    parsed: list[str] = []

    def counting_parse(text: str) -> Any:
        parsed.append(text)
        return parse(text)

    monkeypatch.setattr(history, "parse", counting_parse)
    turns = _turns(1000)
    history.fill(turns)
    assert len(parsed) == len(history.history_vecs) < 40
    assert parsed == [t for _, t in reversed(turns[-len(parsed) :])]  # newest first


def test_fill_replaces_what_was_there_and_keeps_the_persona(tiny_agent: Any) -> None:
    history = _history(tiny_agent)
    _say(history, "user", "an old conversation")
    history.fill([("user", "hello"), ("bot", "hi")])
    assert history.get_history_str() == f"{PERSONA_TEXT}\nhello\nhi"
    history.fill([])
    assert history.get_history_vec() is None and history.last_role is None


def test_a_long_persona_leaves_room_for_the_dialogue(tiny_agent: Any) -> None:
    persona = " ".join(f"I love {w} dogs and {w} cats." for w in WORDS)
    history = _history(tiny_agent, persona=persona)
    max_len = int(history.max_len)
    assert len(history.persona_vec) == int(max_len * PERSONA_SHARE)
    _say(history, "user", "what do you like")
    vec = history.get_history_vec()
    assert vec is not None and len(vec) <= max_len
    assert vec[: len(history.persona_vec)] == history.persona_vec
    assert vec[-4:] == tiny_agent.dict.txt2vec("what do you like")


def test_a_turn_longer_than_the_budget_keeps_its_end(tiny_agent: Any) -> None:
    history = _history(tiny_agent)
    words = [f"{w} {x}" for w in WORDS for x in WORDS]
    _say(history, "user", " ".join(words))
    vec = history.get_history_vec()
    max_len = int(history.max_len)
    assert vec is not None and len(vec) == max_len
    head = tiny_agent.dict.txt2vec(PERSONA_TEXT + "\n")
    assert vec[: len(head)] == head
    tail = tiny_agent.dict.txt2vec(" ".join(words))[-(max_len - len(head)) :]
    assert vec[len(head) :] == tail


def test_a_new_persona_shows_from_the_next_input_on(tiny_agent: Any) -> None:
    history = _history(tiny_agent)
    _say(history, "user", "hello")
    history.set_persona("I love cats.")
    assert history.get_history_str() == "your persona: I love cats.\nhello"
    assert history.persona == "I love cats."


def test_pop_user_turn_takes_back_only_an_unanswered_message(tiny_agent: Any) -> None:
    history = _history(tiny_agent)
    assert history.pop_user_turn() is None
    _say(history, "user", "hello")
    _say(history, "bot", "hi")
    assert history.pop_user_turn() is None  # answered
    _say(history, "user", "are you there")
    assert history.pop_user_turn() == "are you there"
    assert history.history_raw_strings == ["hello", "hi"]
    assert history.last_role == "bot"
    assert history.get_history_str() == f"{PERSONA_TEXT}\nhello\nhi"
