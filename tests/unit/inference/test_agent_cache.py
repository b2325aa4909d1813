"""AgentCache: least recently used evicted beyond capacity, a clone in use never, and the
counters the admin reads. On clones of the tiny model's shared agent."""

from __future__ import annotations

from typing import Any

import pytest

from bot.inference.cache import AgentCache


@pytest.fixture
def cache(tiny_agent: Any) -> AgentCache:
    return AgentCache(tiny_agent, capacity=3)


def _ids(cache: AgentCache) -> list[int]:
    """Cached session ids, least recently used first."""
    return list(cache._entries)


def test_the_least_recently_used_goes_first(cache: AgentCache) -> None:
    for session_id in (1, 2, 3):
        cache.rebuild(session_id, "", [])
    assert cache.get(1) is not None  # 1 is now the most recent
    cache.rebuild(4, "", [])
    assert _ids(cache) == [3, 1, 4]
    assert 2 not in cache and len(cache) == 3
    assert (cache.stats.hits, cache.stats.misses, cache.stats.evictions) == (1, 0, 1)
    cache.rebuild(5, "", [])
    cache.rebuild(6, "", [])
    assert _ids(cache) == [4, 5, 6]
    assert cache.stats.evictions == 3


def test_get_counts_hits_and_misses(cache: AgentCache) -> None:
    assert cache.get(9) is None
    entry = cache.rebuild(9, "I love cats.", [("user", "hello")], chat_id=90, last_message_id=7)
    assert cache.get(9) is entry
    assert cache.get(9) is entry
    assert (cache.stats.hits, cache.stats.misses) == (2, 1)
    assert (entry.session_id, entry.chat_id, entry.persona, entry.last_message_id) == (
        9, 90, "I love cats.", 7,
    )  # fmt: skip
    assert entry.clone.history.history_raw_strings == ["hello"]


def test_peek_counts_nothing_and_keeps_the_lru_order(cache: AgentCache) -> None:
    for session_id in (1, 2, 3):
        cache.rebuild(session_id, "", [])
    assert cache.peek(1) is not None
    assert cache.peek(8) is None
    assert (cache.stats.hits, cache.stats.misses) == (0, 0)
    cache.rebuild(4, "", [])
    assert 1 not in cache  # peeking did not make it recent
    assert _ids(cache) == [2, 3, 4]


def test_a_busy_conversation_is_never_evicted(cache: AgentCache) -> None:
    held = cache.rebuild(1, "", [])
    with cache.checkout(held):
        assert held.busy
        for session_id in (2, 3, 4, 5):
            cache.rebuild(session_id, "", [])
        assert 1 in cache and len(cache) == 3
        assert _ids(cache) == [1, 4, 5]
    assert not held.busy
    cache.rebuild(6, "", [])
    assert 1 not in cache  # released: the least recently used again


def test_when_every_other_clone_is_in_use_the_new_one_is_not_kept(tiny_agent: Any) -> None:
    cache = AgentCache(tiny_agent, capacity=2)
    first, second = cache.rebuild(1, "", []), cache.rebuild(2, "", [])
    with cache.checkout(first), cache.checkout(second):
        third = cache.rebuild(3, "I love cats.", [("user", "hello")])
        # The request still gets its clone; the cache just does not keep it.
        assert third.clone.history.get_history_str() == "your persona: I love cats.\nhello"
        assert _ids(cache) == [1, 2] and cache.stats.evictions == 1
    cache.rebuild(4, "", [])
    assert _ids(cache) == [2, 4]  # released, 1 is the least recently used again


def test_a_clone_held_by_two_requests_is_busy_until_both_are_done(cache: AgentCache) -> None:
    entry = cache.rebuild(1, "", [])
    with cache.checkout(entry):
        with cache.checkout(entry):
            assert entry.holds == 2
        assert entry.busy
        for session_id in (2, 3, 4):
            cache.rebuild(session_id, "", [])
        assert 1 in cache
    assert entry.holds == 0 and not entry.busy


def test_evict_drops_and_counts_only_what_was_there(cache: AgentCache) -> None:
    cache.rebuild(1, "", [])
    cache.evict(1)
    cache.evict(1)
    cache.evict(42)
    assert 1 not in cache and cache.stats.evictions == 1
    assert cache.get(1) is None  # a miss: it is rebuilt from storage


def test_set_persona_changes_a_cached_clone_and_ignores_others(cache: AgentCache) -> None:
    entry = cache.rebuild(1, "I love dogs.", [("user", "hello")])
    cache.set_persona(1, "I love cats.")
    cache.set_persona(2, "I am not cached.")
    assert entry.persona == "I love cats."
    assert entry.clone.history.get_history_str() == "your persona: I love cats.\nhello"
    assert 2 not in cache


def test_clones_share_the_weights_but_not_the_history(cache: AgentCache, tiny_agent: Any) -> None:
    a = cache.rebuild(1, "I love dogs.", [("user", "hello")])
    b = cache.rebuild(2, "I love cats.", [("user", "hi there")])
    assert a.clone.model is b.clone.model is tiny_agent.model
    assert a.clone.history is not b.clone.history
    assert a.clone.history.get_history_str() == "your persona: I love dogs.\nhello"
    assert b.clone.history.get_history_str() == "your persona: I love cats.\nhi there"


def test_an_unanswered_message_joins_the_next_user_turn(cache: AgentCache) -> None:
    entry = cache.rebuild(1, "", [("user", "hello"), ("bot", "hi"), ("user", "are you there")])
    assert entry.user_turn("hello?") == "are you there\nhello?"
    assert entry.user_turn("again") == "again"  # nothing unanswered any more


def test_tail_limit_follows_the_model_context(cache: AgentCache, tiny_agent: Any) -> None:
    assert cache.tail_limit == tiny_agent.text_truncate + 1
