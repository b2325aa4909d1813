"""The per-chat flood gate: at most so many answered messages per sliding window."""

from __future__ import annotations

from collections import OrderedDict, deque
from enum import Enum

from bot.texts import Texts


class Flood(Enum):
    """What the flood gate says about a message."""

    OK = "ok"
    NOTICE = "notice"  # over the limit, and the chat has not been told in this window
    QUIET = "quiet"  # over the limit, already told


# How many recent verdicts are remembered (updates are retried within seconds).
JUDGED_KEPT = 10_000


class FloodGate:
    """A per-chat sliding window: at most `max_messages` answered per `window_s` seconds.

    Time is the message's own date, so a backlog processed after a restart is judged by when
    the user sent it, not by how fast we catch up. Messages over the limit do not count.
    """

    def __init__(self, max_messages: int, window_s: float) -> None:
        self.max_messages = max_messages
        self.window_s = window_s
        self._accepted: dict[int, deque[float]] = {}
        self._told_until: dict[int, float] = {}
        # Verdicts by update_id: a retried update (its first try failed) is judged once.
        self._judged: OrderedDict[int, Flood] = OrderedDict()

    def check(self, chat_id: int, now: float, update_id: int | None = None) -> Flood:
        """Count a message of `chat_id` sent at `now` (epoch seconds) and judge it; the same
        `update_id` again gets the same verdict without counting twice."""
        if update_id is not None and update_id in self._judged:
            return self._judged[update_id]
        verdict = self._judge(chat_id, now)
        if update_id is not None:
            self._judged[update_id] = verdict
            if len(self._judged) > JUDGED_KEPT:
                self._judged.popitem(last=False)
        return verdict

    def _judge(self, chat_id: int, now: float) -> Flood:
        accepted = self._accepted.setdefault(chat_id, deque())
        while accepted and accepted[0] <= now - self.window_s:
            accepted.popleft()
        if len(accepted) < self.max_messages:
            accepted.append(now)
            self._prune(now)
            return Flood.OK
        if now >= self._told_until.get(chat_id, float("-inf")):
            self._told_until[chat_id] = now + self.window_s
            return Flood.NOTICE
        return Flood.QUIET

    def notice(self, language: Texts) -> str:
        """The one message a flooding chat gets per window, in its language."""
        return language.flooding(self.max_messages, self.window_s)

    def _prune(self, now: float) -> None:
        # Keep memory bounded by the chats active within the last window.
        if len(self._accepted) > 10_000:
            for chat_id in [
                c for c, q in self._accepted.items() if not q or q[-1] <= now - self.window_s
            ]:
                self._accepted.pop(chat_id, None)
                self._told_until.pop(chat_id, None)
