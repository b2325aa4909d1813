"""Floods: one chat sends 100 messages in 10 s while 20 others chat.

Outcome: the flooder is limited with one notice, everyone else is answered, and the service's
queues and per-chat state stay bounded. The others' latencies, alone and during the flood, are
printed rather than asserted (2 shared cores make timing asserts flaky).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path

from bot.app import Service
from tests.support.fakebotapi import FakeBotAPI
from tests.support.service_harness import EchoResponder, make_settings, rows, running_service
from tests.support.waits import until

FLOODER = 4000
OTHERS = list(range(4001, 4021))
PER_OTHER = 3


async def _round(api: FakeBotAPI, svc: Service, tag: str, flood: bool) -> tuple[list[float], int]:
    """Each other chat sends PER_OTHER messages over ~1 s (and the flooder 100, if `flood`);
    returns the others' latencies and the peak number of chats in flight."""
    t0 = int(time.time())
    asked: dict[tuple[int, str], float] = {}
    before = {chat: len(api.texts(chat)) for chat in OTHERS}
    peak = 0
    for i in range(100):
        if flood:
            # 100 messages whose Telegram dates span 10 seconds, sent as fast as they come.
            api.user_message(FLOODER, f"flood {i}", extra={"date": t0 + i // 10})
        if i < len(OTHERS) * PER_OTHER:
            chat, text = OTHERS[i % len(OTHERS)], f"{tag} {i // len(OTHERS)}"
            api.user_message(chat, text)
            asked[(chat, text)] = time.time()
        peak = max(peak, svc.inbox_worker.busy)
        await asyncio.sleep(0.01)
    for chat in OTHERS:
        await api.wait_for_texts(chat, before[chat] + PER_OTHER, timeout_s=60)
    await api.wait_for(lambda: svc.inbox_worker.busy == 0, 60, "the backlog to be worked off")
    for chat in OTHERS:
        assert api.texts(chat)[before[chat] :] == [
            f"echo {chat}: {tag} {n}" for n in range(PER_OTHER)
        ]
    latencies = sorted(
        next(s.at for s in api.sent if s.chat_id == chat and s.text.endswith(text)) - at
        for (chat, text), at in asked.items()
    )
    return latencies, peak


def _summary(latencies: list[float]) -> str:
    p50 = statistics.median(latencies)
    p95 = latencies[int(0.95 * (len(latencies) - 1))]
    return f"p50={p50 * 1000:.0f} ms p95={p95 * 1000:.0f} ms (n={len(latencies)})"


async def test_a_flooder_is_limited_with_one_notice_and_the_others_are_unaffected(
    sqlite_url: str, tmp_path: Path, api: FakeBotAPI
) -> None:
    settings = make_settings(sqlite_url, api, tmp_path, log_level="INFO")
    limit = settings.flood_max_messages
    async with running_service(settings, EchoResponder(delay_s=0.02)) as svc:
        alone, _ = await _round(api, svc, "calm", flood=False)
        flooded, peak = await _round(api, svc, "busy", flood=True)
        stored = await rows(
            svc, "SELECT count(*) FROM messages WHERE chat_id = :c AND role = 'user'",
            c=FLOODER,
        )  # fmt: skip
        # Bounded state: the flood gate keeps at most `limit` stamps per chat; no queue or
        # sender is left behind.
        assert len(svc.handlers.flood._accepted[FLOODER]) <= limit
        await until(
            lambda: svc.inbox_worker.busy == 0 and svc.delivery.busy == 0,
            within_s=5,
            what="the workers going idle",
        )
        assert svc.inbox_worker.busy == 0 and svc.delivery.busy == 0
    flooder = api.texts(FLOODER)
    notices = [t for t in flooder if t.startswith("You're writing faster")]
    assert len(notices) == 1
    assert len(flooder) - 1 <= limit  # replies only within the limit
    assert stored == [(100,)]  # nothing the flooder wrote was lost
    print(
        f"others' reply latency alone: {_summary(alone)}; during the flood: "
        f"{_summary(flooded)}; peak chats in flight: {peak}"
    )


async def test_commands_and_edits_count_against_the_flood_limit_but_forget_always_works(
    sqlite_url: str, tmp_path: Path, api: FakeBotAPI
) -> None:
    # Issue 11.4: 150 commands and 30 edits from one chat got 180 replies and no notice.
    chat = 4100
    settings = make_settings(sqlite_url, api, tmp_path, log_level="INFO")
    limit = settings.flood_max_messages
    async with running_service(settings, EchoResponder()) as svc:
        t0 = int(time.time())
        api.user_message(chat, "hello")  # a conversation whose /forget has work to do
        for i in range(150):
            api.user_message(chat, "/help" if i % 2 else "/persona", extra={"date": t0 + i // 50})
        for i in range(30):
            api.user_message(chat, f"edit {i}", kind="edited_message", extra={"date": t0 + 2})
        for _ in range(600):  # every update closed and every text queued has gone out
            closed = await rows(svc, "SELECT count(*) FROM inbox WHERE status != 'pending'")
            unsent = await rows(svc, "SELECT count(*) FROM outbox WHERE sent_at IS NULL")
            if closed == [(181,)] and unsent == [(0,)]:
                break
            await asyncio.sleep(0.05)
        flooded = api.texts(chat)
        # Still within the window, and over the limit: /forget is exempt.
        api.user_message(chat, "/forget", extra={"date": t0 + 3})
        await api.wait_for_texts(chat, len(flooded) + 1)
        statuses = await rows(svc, "SELECT status, count(*) FROM inbox GROUP BY status")
    notices = [t for t in flooded if t.startswith("You're writing faster")]
    assert len(notices) == 1
    # "hello" and the commands within the limit, and one notice.
    assert len(flooded) == limit + 1, flooded
    assert api.texts(chat)[-1].startswith("Done: I deleted everything")
    assert dict(statuses).get("pending", 0) == 0
