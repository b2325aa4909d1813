"""LRU cache of cloned agents, one per conversation; a miss rebuilds the clone from storage."""

from __future__ import annotations

import contextlib
import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from bot.inference.model_input import PersonaHistory
from bot.persona import join_turns


@dataclass
class CacheStats:
    """Counters for the admin and the benchmarks."""

    hits: int = 0
    misses: int = 0
    evictions: int = 0
    # Evictions already handed to the metrics (AgentCache.take_evictions).
    reported_evictions: int = 0


@dataclass
class Conversation:
    """A cached clone and what it was built for."""

    session_id: int
    clone: Any
    persona: str
    chat_id: int | None = None
    # The newest stored message this clone's history includes (None: none yet). The clone is
    # only used while that is the conversation's newest message in the database.
    last_message_id: int | None = None
    # Requests using the clone now (AgentCache.checkout); a held clone is never evicted.
    holds: int = field(default=0)
    # How long building this clone from the stored messages took (AgentCache.rebuild).
    rebuild_ms: float | None = None

    @property
    def busy(self) -> bool:
        """Whether a request is using the clone."""
        return self.holds > 0

    def user_turn(self, text: str) -> str:
        """The text of the next user turn: the model cannot take two user turns in a row, so a
        stored message that got no reply (flood limit, a failed generation) joins this one."""
        unanswered = self.clone.history.pop_user_turn()
        return text if unanswered is None else f"{unanswered}\n{text}"


def wrapping_tokens(agent: Any) -> int:
    """Tokens the agent adds around the history's vector when it vectorizes a turn.

    BART wraps the context in START ... END and, when the two do not fit, cuts the context's
    *first* tokens (BartAgent._set_text_vec truncates to text_truncate - 2, keeping the end):
    the pinned persona would lose its head exactly when the conversation fills the context
    (found by tests/integration/inference/test_shapes.py). The history leaves them room.
    """
    from parlai.agents.bart.bart import BartAgent

    return 2 if isinstance(agent, BartAgent) else 0


def new_clone(shared_agent: Any, persona: str) -> Any:
    """A clone of the shared agent (weights shared) whose history pins `persona`."""
    clone = shared_agent.clone()
    history = clone.history
    maxlen = history.max_len
    if maxlen is not None:
        maxlen = max(int(maxlen) - wrapping_tokens(shared_agent), 1)
    pinned = PersonaHistory(
        clone.opt,
        maxlen=maxlen,
        size=history.size,
        p1_token=history.p1_token,
        p2_token=history.p2_token,
        dict_agent=clone.dict,
    )
    pinned.set_persona(persona)
    clone.history = pinned
    return clone


class AgentCache:
    """Clones keyed by session id, least recently used evicted beyond `capacity`."""

    def __init__(self, shared_agent: Any, capacity: int) -> None:
        self.shared_agent = shared_agent
        self.capacity = capacity
        self.stats = CacheStats()
        self._entries: OrderedDict[int, Conversation] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._entries

    @property
    def tail_limit(self) -> int | None:
        """How many stored messages can reach the model at most (each is at least one token)."""
        budget = getattr(self.shared_agent, "text_truncate", None)
        return None if budget is None else int(budget) + 1

    def get(self, session_id: int) -> Conversation | None:
        """The cached conversation, marked most recently used; None on a miss."""
        entry = self._entries.get(session_id)
        if entry is None:
            self.stats.misses += 1
            return None
        self.stats.hits += 1
        self._entries.move_to_end(session_id)
        return entry

    def peek(self, session_id: int) -> Conversation | None:
        """The cached conversation without counting a hit or touching its LRU position."""
        return self._entries.get(session_id)

    def rebuild(
        self,
        session_id: int,
        persona: str,
        messages: Iterable[tuple[str, str]],
        chat_id: int | None = None,
        last_message_id: int | None = None,
    ) -> Conversation:
        """Build a clone from stored `(role, text)` messages and cache it.

        `messages` are the conversation's newest, at most `tail_limit` of them (the store's
        load_context): fewer than that is the whole conversation, whose first message carries
        the persona in ParlAI's own input (bot/inference/model_input.py). `tail_limit` of them may
        be a cut tail and are taken as one; that changes nothing, since so many messages (a
        token each at least) exceed the context, where the persona is pinned anyway.
        """
        started = time.perf_counter()
        clone = new_clone(self.shared_agent, persona)
        messages = list(messages)
        limit = self.tail_limit
        complete = limit is None or len(messages) < limit
        clone.history.fill(join_turns(messages), complete=complete)
        entry = Conversation(session_id, clone, persona, chat_id, last_message_id=last_message_id)
        entry.rebuild_ms = (time.perf_counter() - started) * 1000.0
        self._entries[session_id] = entry
        self._entries.move_to_end(session_id)
        self._shrink()
        return entry

    def set_persona(self, session_id: int, persona: str) -> None:
        """Switch a cached conversation's persona (takes effect on its next turn)."""
        entry = self._entries.get(session_id)
        if entry is not None:
            entry.clone.history.set_persona(persona)
            entry.persona = persona

    @contextlib.contextmanager
    def checkout(self, entry: Conversation) -> Iterator[Conversation]:
        """Hold a conversation's clone while a request uses it: it is not evicted meanwhile,
        and the cache shrinks back to its capacity once it is released."""
        entry.holds += 1
        try:
            yield entry
        finally:
            entry.holds -= 1
            self._shrink()

    def take_evictions(self) -> int:
        """Evictions since the last call (the metrics count them with the next reply)."""
        new = self.stats.evictions - self.stats.reported_evictions
        self.stats.reported_evictions = self.stats.evictions
        return new

    def evict(self, session_id: int) -> None:
        """Drop a conversation; it is rebuilt from storage when next needed."""
        if self._entries.pop(session_id, None) is not None:
            self.stats.evictions += 1

    def _shrink(self) -> None:
        # A conversation with a request in flight is skipped; it goes on a later call.
        for session_id in list(self._entries):
            if len(self._entries) <= self.capacity:
                break
            if not self._entries[session_id].busy:
                del self._entries[session_id]
                self.stats.evictions += 1
