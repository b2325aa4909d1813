"""The autopilot on a staged database (SQLite and PostgreSQL, migrated): real chats, replies and
votes make a clear winner or a guard breach; the real check promotes or rolls back, stores the
decision with its figures, and changes the variants table; two checks at once decide once;
`admin variants autopilot on` reaches replicas' loops; the report shows the guards.

Every expected figure is worked out by hand from what is staged (see each stage's comment).
"""

from __future__ import annotations

import asyncio
import io
import json
import math
import re
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bot import texts
from bot.admin.cli import admin
from bot.config import Settings
from bot.db import audit
from bot.db import autopilot as autopilot_rows
from bot.db import variants as stored
from bot.db.engine import make_engine, make_sessionmaker
from bot.db.models import (
    Assignment,
    AutopilotDecision,
    Message,
    Outbox,
    OutboxKind,
    Session,
    Vote,
)
from bot.engine import live
from bot.engine.variants import Experiment, Variant
from bot.reports.variants import variant_report
from bot.reports.variants_json import report_json
from bot.reports.variants_text import format_variant_report
from bot.service import autopilot
from bot.service.autopilot import Policy
from tests.integration.admin.test_admin import parse_admin
from tests.integration.engine.test_variants_service import inline_ab_settings
from tests.support.fakebotapi import FakeBotAPI
from tests.support.service_harness import running_service
from tests.support.waits import until

EXP = "ap-test"
MODEL = "zoo:blender/blender_90M/model"
SEED = Experiment(EXP, (Variant("a", MODEL, 1.0, True), Variant("b", MODEL, 1.0, False)))
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
# min_replies 100: each side stages 40 chats x 5 replies = 200 replies.
POLICY = Policy(min_chats=30, min_replies=100)


@pytest.fixture
async def db(db_url: str, tmp_path: Path) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    engine = make_engine(db_url)
    sessionmaker = make_sessionmaker(engine)
    settings = _settings(db_url, tmp_path)
    await live.ensure_seeded(sessionmaker, SEED, settings)
    yield sessionmaker
    await engine.dispose()


def _settings(db_url: str, tmp_path: Path) -> Settings:
    return Settings(_env_file=None, database_url=db_url, data_dir=tmp_path)  # type: ignore[call-arg]


async def stage(
    sessionmaker: async_sessionmaker[AsyncSession],
    variant: str,
    chats: range,
    *,
    up_votes: Callable[[int], int],
    text: Callable[[int, int], str],
    replies: int = 5,
    latency_ms: float = 100.0,
    experiment: str = EXP,
) -> None:
    """Per chat: a hash assignment to `variant`, one conversation of `replies` turns (a user
    message, then the bot's reply `text(chat, i)` with `latency_ms`), and one vote by the chat's
    user on each reply: the first `up_votes(chat)` 👍, the rest 👎."""
    async with sessionmaker.begin() as db:
        for chat in chats:
            db.add(
                Assignment(
                    chat_id=chat,
                    experiment=experiment,
                    variant=variant,
                    source="hash",
                    assigned_at=T0,
                    probability=0.5,
                    allocation=json.dumps({"by": "weights", "split": {"a": 0.5, "b": 0.5}}),
                )
            )
            s = Session(chat_id=chat, user_id=chat, status="active", created_at=T0)
            db.add(s)
            await db.flush()
            for i in range(replies):
                at = T0 + timedelta(minutes=i)
                db.add(
                    Message(session_id=s.id, chat_id=chat, role="user", text="hi", created_at=at)
                )
                m = Message(
                    session_id=s.id,
                    chat_id=chat,
                    role="bot",
                    text=text(chat, i),
                    variant=variant,
                    latency_ms=latency_ms,
                    created_at=at,
                )
                db.add(m)
                await db.flush()
                db.add(
                    Vote(
                        chat_id=chat,
                        message_id=m.id,
                        user_id=chat,
                        value=1 if i < up_votes(chat) else -1,
                        source="button",
                        variant=variant,
                        created_at=at,
                        updated_at=at,
                    )
                )


def _varied(chat: int, i: int) -> str:
    return f"reply number {i} for chat {chat}"  # every reply distinct, no 3-gram twice


async def _weights(sessionmaker: async_sessionmaker[AsyncSession]) -> dict[str, tuple[float, bool]]:
    async with sessionmaker() as db:
        row = await stored.load(db, EXP)
    assert row is not None
    return {v.name: (v.weight, v.control) for v in row.variants}


async def _decisions(sessionmaker: async_sessionmaker[AsyncSession]) -> list[AutopilotDecision]:
    async with sessionmaker() as db:
        return list(await db.scalars(select(AutopilotDecision).order_by(AutopilotDecision.id)))


async def _turn_on(sessionmaker: async_sessionmaker[AsyncSession], policy: Policy) -> int:
    async with sessionmaker.begin() as db:
        await autopilot_rows.set_policy(db, EXP, policy.to_json())
        version = await stored.bump(db, EXP)
    assert version is not None
    return version


async def stage_winner(
    sessionmaker: async_sessionmaker[AsyncSession], experiment: str = EXP
) -> None:
    """40 chats a side, 5 voted replies each. Control a: chats alternate 1 and 2 👍 of 5
    (30%); candidate b: 4 and 5 of 5 (90%): a lift of +60 pp, which the always-valid bound
    keeps far above 0 at 80 chats. Every reply distinct, same latency: no guard moves."""
    a, b = range(1, 41), range(101, 141)
    await stage(
        sessionmaker, "a", a, up_votes=lambda c: 1 + c % 2, text=_varied, experiment=experiment
    )
    await stage(
        sessionmaker, "b", b, up_votes=lambda c: 4 + c % 2, text=_varied, experiment=experiment
    )


async def test_a_clear_winner_is_promoted_and_the_decision_stored(
    db: async_sessionmaker[AsyncSession],
) -> None:
    await stage_winner(db)
    # Off: a check decides nothing.
    assert await autopilot.check(db, EXP, decided_by="r1") is None
    assert await _decisions(db) == []
    version = await _turn_on(db, POLICY)

    decision = await autopilot.check(db, EXP, decided_by="r1")

    assert decision is not None and decision.action == "promote" and decision.variant == "b"
    # b is the control now and takes every new chat; a keeps its chats but gets none new.
    assert await _weights(db) == {"a": (0.0, False), "b": (1.0, True)}
    [row] = await _decisions(db)
    assert (row.experiment, row.based_on, row.variant, row.control, row.action) == (
        EXP, version, "b", "a", "promote",
    )  # fmt: skip
    assert row.decided_by == "r1" and "no guard regressed" in row.reason
    figures = json.loads(row.figures)
    # The lift by hand: 90% - 30% (every chat has 5 votes, so the ratio estimators are the
    # plain shares: a = (20 x 2 + 20 x 1) / 200, b = (20 x 5 + 20 x 4) / 200).
    assert figures["lift"]["lift"] == pytest.approx(0.6)
    assert figures["lift"]["chats"] == [40, 40]
    assert 0.0 < figures["lift"]["low"] < 0.6 < figures["lift"]["high"]
    # Guards: all 200 replies distinct and none repetitive, no flags, no failures, p95 100 ms.
    for side in ("control", "candidate"):
        g = figures["guards"][side]
        assert (g["replies"], g["window"], g["distinct_share"], g["repetition_share"]) == (
            200, 200, 1.0, 0.0,
        )  # fmt: skip
        assert (g["safety_share"], g["failed_share"], g["latency_p95_ms"]) == (0.0, 0.0, 100.0)
    assert figures["weights_before"] == {"a": 1.0, "b": 1.0}
    assert figures["weights_after"] == {"a": 0.0, "b": 1.0}
    # The experiment moved on one version: every replica follows it.
    async with db() as s:
        assert await stored.version(s, EXP) == version + 1
    # The audit log holds it too, committed with the decision.
    async with db() as s:
        [entry] = await audit.recent(s)
    assert (entry.actor, entry.source, entry.action, entry.target, entry.result) == (
        "autopilot@r1", "autopilot", "variants promote", "b", "ok",
    )  # fmt: skip
    assert entry.details["based_on"] == version and entry.details["control"] == "a"
    assert entry.details["weights_after"] == {"a": 0.0, "b": 1.0}
    # Nothing left to judge: b is the control, a has no weight.
    assert await autopilot.check(db, EXP, decided_by="r1") is None
    assert len(await _decisions(db)) == 1


async def test_a_guard_breach_rolls_the_candidate_back_whatever_its_votes(
    db: async_sessionmaker[AsyncSession],
) -> None:
    # b wins the votes as in stage_winner, but says the same thing every time: 1 distinct
    # text in 200 (0.5%) against the control's 100%, far under 0.9 x 100%; and from its second
    # reply on each repeats the previous one (160 of 200 repetitive = 80% > 0% + 5 pp).
    await stage(db, "a", range(1, 41), up_votes=lambda c: 1 + c % 2, text=_varied)
    await stage(db, "b", range(101, 141), up_votes=lambda c: 4 + c % 2, text=lambda c, i: "Yes!")
    version = await _turn_on(db, POLICY)

    decision = await autopilot.check(db, EXP, decided_by="r2")

    assert decision is not None and decision.action == "rollback" and decision.variant == "b"
    assert await _weights(db) == {"a": (1.0, True), "b": (0.0, False)}
    [row] = await _decisions(db)
    assert (row.based_on, row.action, row.control) == (version, "rollback", "a")
    assert row.reason.startswith("guard breached: distinct replies 0.5% < 0.9 x")
    assert "repetitive replies 80.0% > the control's 0.0% + 5 pp" in row.reason
    figures = json.loads(row.figures)
    assert figures["guards"]["candidate"]["distinct_share"] == pytest.approx(1 / 200)
    assert figures["guards"]["candidate"]["repetition_share"] == pytest.approx(160 / 200)
    assert len(figures["breaches"]) == 2
    # A candidate with weight 0 is not judged again.
    assert await autopilot.check(db, EXP, decided_by="r2") is None


async def test_failed_turns_and_latency_breach_too_and_wait_below_min_replies(
    db: async_sessionmaker[AsyncSession],
) -> None:
    # Same votes for both (no lift); b is 3x slower (p95 300 vs 100 ms > 1.5 x), and 20 of its
    # chats were told NO_REPLY once: 20 / (200 + 20) = 9.1% > 0% + 2 pp.
    await stage(db, "a", range(1, 41), up_votes=lambda c: 3, text=_varied)
    await stage(db, "b", range(101, 141), up_votes=lambda c: 3, text=_varied, latency_ms=300.0)
    async with db.begin() as s:
        for chat in range(101, 121):
            s.add(
                Outbox(chat_id=chat, kind=OutboxKind.NOTICE, text=texts.for_language("en").NO_REPLY)
            )
    # Below min_replies nothing is judged: the guards wait, and so does the promotion.
    await _turn_on(db, Policy(min_chats=30, min_replies=201))
    assert await autopilot.check(db, EXP, decided_by="r3") is None
    await _turn_on(db, POLICY)
    decision = await autopilot.check(db, EXP, decided_by="r3")
    assert decision is not None and decision.action == "rollback"
    assert "failed turns 9.1% > the control's 0.0% + 2 pp" in decision.reason
    assert "latency p95 300 ms > 1.5 x the control's 100 ms" in decision.reason
    assert await _weights(db) == {"a": (1.0, True), "b": (0.0, False)}


async def test_two_checks_at_once_make_one_decision(
    db: async_sessionmaker[AsyncSession], db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await stage_winner(db)
    version = await _turn_on(db, POLICY)
    # Two replicas: each its own engine. Both read the figures and reach the claim before
    # either claims (a barrier in front of the real claim), so both try to decide on the same
    # version at the same moment.
    arrived = 0
    both = asyncio.Event()
    real_claim = autopilot_rows.claim

    async def claim_together(session: AsyncSession, experiment: str, seen: int) -> bool:
        nonlocal arrived
        arrived += 1
        if arrived == 2:
            both.set()
        await asyncio.wait_for(both.wait(), timeout=30)
        return await real_claim(session, experiment, seen)

    monkeypatch.setattr(autopilot_rows, "claim", claim_together)
    engines = [make_engine(db_url), make_engine(db_url)]
    try:
        results = await asyncio.gather(
            *(
                autopilot.check(make_sessionmaker(e), EXP, decided_by=f"replica-{i}")
                for i, e in enumerate(engines)
            )
        )
    finally:
        for e in engines:
            await e.dispose()
    assert arrived == 2
    made = [r for r in results if r is not None]
    assert len(made) == 1 and made[0].action == "promote"
    [row] = await _decisions(db)
    assert row.decided_by == f"replica-{results.index(made[0])}"
    async with db() as s:  # one audit row: the loser's rolled back with its claim
        assert [e.actor for e in await audit.recent(s)] == [f"autopilot@{row.decided_by}"]
    async with db() as s:
        assert await stored.version(s, EXP) == version + 1
    assert await _weights(db) == {"a": (0.0, False), "b": (1.0, True)}


async def test_autopilot_on_reaches_every_replica_loop_and_off_stops_it(
    db: async_sessionmaker[AsyncSession], db_url: str, tmp_path: Path
) -> None:
    # Two replicas' loops run (as Service.start runs them), off at first. The admin command
    # turns the autopilot on: one of them promotes b, once, within a few polls.
    await stage_winner(db)
    settings = _settings(db_url, tmp_path)
    engines = [make_engine(db_url), make_engine(db_url)]
    loops = [
        asyncio.create_task(
            autopilot.run_forever(make_sessionmaker(e), EXP, owner=f"replica-{i}", poll_s=0.1)
        )
        for i, e in enumerate(engines)
    ]
    try:
        out = io.StringIO()
        args = parse_admin(
            "variants", "autopilot", "on", "--min-chats", "30", "--min-replies", "100"
        )
        args.settings = settings
        assert await admin(db_url, args, out, experiment=SEED) == 0
        assert "autopilot on: min_chats 30" in out.getvalue()

        async def decided() -> bool:
            return len(await _decisions(db)) == 1

        await until(decided, within_s=20, what="a replica promoted b")
        await asyncio.sleep(0.5)  # more polls of both: nothing more to decide
        [row] = await _decisions(db)
        assert row.action == "promote" and row.decided_by in ("replica-0", "replica-1")

        off = parse_admin("variants", "autopilot", "off")
        off.settings = settings
        assert await admin(db_url, off, io.StringIO(), experiment=SEED) == 0
        async with db() as s:
            state = await autopilot_rows.policy(s, EXP)
        assert state is not None and state[1] is None
    finally:
        for task in loops:
            task.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        for e in engines:
            await e.dispose()
    assert all(t.cancelled() for t in loops)  # the loops ran to the end without failing


async def test_admin_rejects_a_bad_policy_and_check_changes_nothing(
    db: async_sessionmaker[AsyncSession], db_url: str, tmp_path: Path
) -> None:
    from bot.admin.common import UsageError

    await stage_winner(db)
    settings = _settings(db_url, tmp_path)
    bad = parse_admin("variants", "autopilot", "on", "--distinct-ratio", "1.5")
    bad.settings = settings
    with pytest.raises(UsageError, match="distinct_ratio must lie in"):
        await admin(db_url, bad, io.StringIO(), experiment=SEED)
    dry = parse_admin("variants", "autopilot", "check", "--min-replies", "100", "--json")
    dry.settings = settings
    out = io.StringIO()
    assert await admin(db_url, dry, out, experiment=SEED) == 0
    [candidate] = json.loads(out.getvalue())["candidates"]
    assert (candidate["variant"], candidate["action"]) == ("b", "promote")
    assert candidate["lift"]["lift"] == pytest.approx(0.6)
    assert await _decisions(db) == []
    assert await _weights(db) == {"a": (1.0, True), "b": (1.0, False)}


async def test_report_shows_guards_by_hand_and_the_decisions(
    db: async_sessionmaker[AsyncSession],
) -> None:
    # Variant a, one conversation of 4 replies (latency 100..400 ms):
    #   "Hello there", "hello  there" (the same text, and the same as its previous reply),
    #   "I like dogs and I like dogs" (a 3-gram twice), "Fine." (flagged by the safety gate)
    # distinct 3/4, repetitive 2/4, safety 1/4, p95 = 300 + 0.85 x 100 = 385 (linear);
    # its chat was told NO_REPLY (English) and APOLOGY (German): 2 / (4 + 2) failed.
    said = ["Hello there", "hello  there", "I like dogs and I like dogs", "Fine."]
    async with db.begin() as s:
        s.add(Assignment(chat_id=7, experiment=EXP, variant="a", source="hash", assigned_at=T0))
        conv = Session(chat_id=7, user_id=7, status="active", created_at=T0)
        s.add(conv)
        await s.flush()
        for i, text in enumerate(said):
            s.add(
                Message(
                    session_id=conv.id,
                    chat_id=7,
                    role="bot",
                    text=text,
                    variant="a",
                    latency_ms=100.0 * (i + 1),
                    safety="flagged" if i == 3 else None,
                    created_at=T0,
                )
            )
        for notice in (texts.for_language("en").NO_REPLY, texts.for_language("de").APOLOGY):
            s.add(Outbox(chat_id=7, kind=OutboxKind.NOTICE, text=notice))
        # A notice that is not a failure does not count.
        s.add(Outbox(chat_id=7, kind=OutboxKind.NOTICE, text=texts.for_language("en").ENDED))
        await autopilot_rows.record(
            s,
            experiment=EXP,
            based_on=1,
            variant="b",
            control="a",
            action="rollback",
            reason="guard breached: staged",
            figures={"lift": {"lift": 0.1}},
            decided_by="replica-x",
        )
    await _turn_on(db, POLICY)
    report = await variant_report(db, SEED)
    a = report.get("a")
    assert a is not None
    assert (a.guard_window, a.distinct_share, a.repetition_share) == (4, 0.75, 0.5)
    assert (a.safety_share, a.failed_turns) == (0.25, 2)
    assert a.latency_p95_ms == pytest.approx(385.0)
    assert a.failed_share == pytest.approx(1 / 3)
    b = report.get("b")
    assert b is not None and math.isnan(b.distinct_share) and b.failed_turns == 0
    text = format_variant_report(report)
    assert re.search(r"\na \(control\) +4 +75\.0% +50\.0% +25\.0% +33\.3% \(2\) +385\n", text)
    assert "autopilot: on (distinct_ratio 0.9, failed_margin 0.02, interval_s 60" in text
    assert "rollback b (control a, version 1, by replica-x): guard breached: staged" in text
    data = report_json(report)
    assert data["autopilot"] == POLICY.to_json()
    [d] = data["decisions"]
    assert (d["action"], d["variant"], d["figures"]) == ("rollback", "b", {"lift": {"lift": 0.1}})
    json.dumps(data, allow_nan=False)  # JSON-ready: no NaN, no datetime


def test_policy_reads_back_what_it_stores_and_ignores_unknown_keys() -> None:
    p = Policy(min_chats=50, latency_ratio=2.0)
    assert Policy.from_json({**p.to_json(), "from_a_later_release": 1}) == p
    with pytest.raises(ValueError, match="min_chats must be at least 5"):
        Policy(min_chats=4)
    with pytest.raises(ValueError, match="safety_margin"):
        Policy(safety_margin=float("nan"))


async def test_a_running_service_decides_and_serves_the_decision(
    db_url: str,
    tmp_path: Path,
    api: FakeBotAPI,
    tiny_model_file: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The service's own loop (Service.start) on a staged experiment "default" with a and b:
    # `admin variants autopilot on` reaches it, it promotes b, and its router serves b as the
    # control with all the weight, the decision's change followed like any admin change.
    monkeypatch.setattr(autopilot, "POLL_S", 0.2)
    settings = inline_ab_settings(db_url, api, tmp_path, tiny_model_file)
    async with running_service(settings, None) as service:
        engine = make_engine(db_url)
        try:
            sm = make_sessionmaker(engine)
            await stage_winner(sm, experiment="default")
            args = parse_admin("variants", "autopilot", "on", "--min-replies", "100")
            args.settings = settings
            seed = service.responder.experiment  # type: ignore[attr-defined]
            assert await admin(db_url, args, io.StringIO(), experiment=seed) == 0

            def follows() -> bool:
                served = service.responder.experiment  # type: ignore[attr-defined]
                return served.control.name == "b" and served.weights == {"a": 0.0, "b": 1.0}

            await until(follows, within_s=20, what="the service serves b as the control")
            [row] = await _decisions(sm)
            assert (row.experiment, row.action, row.variant) == ("default", "promote", "b")
            assert row.decided_by == service.owner
        finally:
            await engine.dispose()
