"""What /stats and the admin commands print, from given numbers and rows."""

from __future__ import annotations

from datetime import UTC, datetime

from bot.admin.common import format_table
from bot.reports import stats as service_stats


def test_format_stats_shows_every_number() -> None:
    stats = service_stats.Stats(
        chats=3,
        sessions_active=2,
        sessions_ended=5,
        messages_today=6,
        messages_total=14,
        latency_p50_ms=512.4,
        latency_p95_ms=987.6,
        latency_samples=33,
        latency_window_s=86400,
        undelivered_replies=7,
        replies_given_up=4,
        inbox_pending=8,
        inbox_failed=9,
        generated_at=datetime(2026, 1, 2, 3, 4, tzinfo=UTC),
    )
    text = service_stats.format_stats(stats)
    for fragment in (
        "2026-01-02 03:04 UTC",
        "Chats: 3",
        "2 active, 5 ended",
        "6 today (UTC), 14 in total",
        "24 h, 33 replies",
        "p50 512 ms, p95 988 ms",
        "Undelivered replies: 7 (4 given up)",
        "8 pending, 9 failed",
    ):
        assert fragment in text


def test_table_formatter_keeps_one_line_per_row() -> None:
    text = format_table(["id", "text"], [(1, "short"), (22, "two\nlines " + "x" * 100)])
    lines = text.splitlines()
    assert len(lines) == 4
    assert lines[2].startswith(" 1  short")  # numbers right-aligned
    assert "two ↵ lines" in lines[3] and lines[3].endswith("…")
    assert len(lines[3]) <= 2 + 2 + 60
