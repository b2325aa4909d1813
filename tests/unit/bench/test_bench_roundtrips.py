"""bench.roundtrips counts what the service's database sees of a turn."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import roundtrips


async def test_a_turn_is_counted_until_its_reply_and_until_the_service_is_idle() -> None:
    raw = await roundtrips.count(2)
    assert len(raw["to_reply"]) == len(raw["whole"]) == 2
    for to_reply, whole in zip(raw["to_reply"], raw["whole"], strict=True):
        # at least the update's own commit (ingest) and the turn's (reply + outbox + close)
        assert to_reply["commits"] >= 2
        assert to_reply["checkouts"] >= to_reply["commits"]
        assert to_reply["statements"] >= to_reply["checkouts"]
        # after the reply: at least delivery's "sent" commit and the lease releases
        assert whole["commits"] > to_reply["commits"]
        # the connection is held while it works: some time, and no more than the whole turn's
        assert 0 < to_reply["held_ms"] <= whole["held_ms"]
    assert len(raw["bookkeeping_ms"]) == 480 and min(raw["bookkeeping_ms"]) > 0
    assert len(raw["turn_store_ms"]) == 480 and min(raw["turn_store_ms"]) > 0
    summary = roundtrips.summary(raw)
    kinds = {f"{k}_{w}" for k in roundtrips.KINDS for w in ("to_reply", "per_turn")}
    assert set(summary) == kinds | {"delivery_bookkeeping_ms", "turn_store_ms"}
    for key, times in (("delivery_bookkeeping_ms", "bookkeeping_ms"), ("turn_store_ms",) * 2):
        assert summary[key] == pytest.approx(roundtrips.median(raw[times]), abs=0.01)


def test_medians_and_a_bad_before_tree(tmp_path: Path) -> None:
    assert roundtrips.median([3, 1, 2]) == 2 and roundtrips.median([4, 1, 2, 3]) == 2.5
    with pytest.raises(SystemExit) as stop:
        roundtrips.main(["--before", str(tmp_path)])
    assert stop.value.code == 2
