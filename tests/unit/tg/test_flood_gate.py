"""The flood gate: a sliding window per chat, one notice, then quiet."""

from __future__ import annotations

from bot.tg.flood import FloodGate


def test_flood_gate_window_slides() -> None:
    gate = FloodGate(max_messages=2, window_s=10)
    verdicts = [gate.check(1, t).value for t in (0, 1, 2, 3, 10.5, 11, 11.5, 11.9)]
    assert verdicts == ["ok", "ok", "notice", "quiet", "ok", "ok", "quiet", "quiet"]
    assert gate.check(2, 3).value == "ok"  # other chats are unaffected
    assert gate.check(1, 21).value == "ok"


def test_a_retried_update_is_counted_once() -> None:
    # Found in review: an update whose first try failed was counted again on every retry, so
    # one failing command could push a chat over its limit.
    gate = FloodGate(max_messages=2, window_s=10)
    assert [gate.check(1, 0, update_id=7).value for _ in range(3)] == ["ok"] * 3
    assert gate.check(1, 1, update_id=8).value == "ok"  # the second message still fits
    assert gate.check(1, 2, update_id=9).value == "notice"
    assert gate.check(1, 2, update_id=9).value == "notice"  # its retry sends the notice again
