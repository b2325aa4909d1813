"""`admin variants`, `admin assign`, the variant lines of `/stats`, and the per-variant SQL of
docs/administration.md, against a seeded database on SQLite and PostgreSQL alike.

Every expected figure is a literal worked out by hand from the seed (the arithmetic is in the
comments), not recomputed with the code under test.
"""

from __future__ import annotations

import asyncio
import io
import json
import math
import subprocess
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bot.admin.cli import admin, run_admin
from bot.config import ConfigError, Settings
from bot.db.engine import make_engine, make_sessionmaker
from bot.db.models import Assignment, Message, Rating, Session, Vote
from bot.engine.variants import Experiment, Variant
from bot.reports import stats as service_stats
from bot.reports.admin import AdminError
from bot.reports.variant_stats import ALWAYS_VALID_NOTE, FIXED_SAMPLE_NOTE
from bot.reports.variants import REPORT_NOTE, variant_report
from bot.reports.variants_json import report_json
from bot.reports.variants_text import format_variant_report, plot_variants
from tests.integration.admin.test_admin import parse_admin
from tests.integration.admin.test_admin import sql_url as sql_url  # the fixture: a read-only role
from tests.integration.admin.test_admin_docs import DocQuery, assert_doc_queries_return
from tests.integration.admin.test_admin_docs import doc_queries as admin_doc_queries
from tests.support.cli import cli_env, run_cli

ROOT = Path(__file__).resolve().parents[3]
DOC = ROOT / "docs" / "administration.md"
DOC_START, DOC_END = "<!-- variants-sql:start -->", "<!-- variants-sql:end -->"

EXPERIMENT = Experiment(
    "decoding-test",
    (
        Variant("beam", "zoo:blender/blender_90M/model", 1.0, True),
        Variant("nucleus", "zoo:blender/blender_90M/model", 1.0, False),
    ),
)
VARIANTS_TOML = """\
experiment = "decoding-test"

[[variants]]
name = "beam"
model = "zoo:blender/blender_90M/model"
weight = 1
control = true

[[variants]]
name = "nucleus"
model = "zoo:blender/blender_90M/model"
weight = 1
inference = "nucleus"
topp = 0.9
"""

DAY1 = datetime(2026, 1, 10, 10, 0, tzinfo=UTC)
DAY2 = datetime(2026, 1, 11, 10, 0, tzinfo=UTC)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@dataclass(frozen=True)
class VSeed:
    """What `seed_variants` stored."""

    old_replies: tuple[int, int]  # message ids of chat 42's two replies


async def seed_variants(sessionmaker: async_sessionmaker[AsyncSession]) -> VSeed:
    """Assignments, replies, votes and ratings with figures that are easy to work out by hand.

    assignments: chats 1-30 beam (hash), 31-40 nucleus (hash), 41 nucleus (admin),
                 42-43 old (hash; "old" is not in the variants file any more)
    beam    (chat 1): 8 replies, latency 100..800 ms, model time half of it, lengths 1..8;
                      votes +1 +1 +1 -1 (day 1), +1 +1 +1 -1 (day 2): 6 up, 2 down;
                      ratings 4, 5, 3
    nucleus (chat 31): 9 replies: 8 with latency 1000..8000 ms (model time half), length 10,
                      and one of length 19 with no timings and no vote;
                      votes +1 -1 -1 -1 (day 1), +1 -1 -1 -1 (day 2): 2 up, 6 down;
                      ratings 2, 4
    old     (chat 42): 2 replies, "old" (50 ms, model 20 ms; one 👍 on day 2), "older" (70, 30)
    """
    async with sessionmaker.begin() as db:
        chats = (
            [(c, "beam", "hash") for c in range(1, 31)]
            + [(c, "nucleus", "hash") for c in range(31, 41)]
            + [(41, "nucleus", "admin"), (42, "old", "hash"), (43, "old", "hash")]
        )
        for chat_id, variant, source in chats:
            db.add(
                Assignment(
                    chat_id=chat_id,
                    experiment="decoding-test",
                    variant=variant,
                    source=source,
                    assigned_at=DAY1,
                )
            )

        async def conversation(chat_id: int) -> int:
            s = Session(chat_id=chat_id, user_id=chat_id, status="done", created_at=DAY1)
            db.add(s)
            await db.flush()
            return s.id

        async def reply(
            session_id: int,
            chat_id: int,
            variant: str,
            text: str,
            latency: float | None,
            model: float | None,
        ) -> int:
            turn = {"session_id": session_id, "chat_id": chat_id, "created_at": DAY1}
            db.add(Message(**turn, role="user", text="hi?"))
            m = Message(
                **turn, role="bot", text=text, latency_ms=latency, model_ms=model, variant=variant
            )
            db.add(m)
            await db.flush()
            return m.id

        def vote(chat_id: int, message_id: int, variant: str, value: int, at: datetime) -> None:
            db.add(
                Vote(
                    chat_id=chat_id,
                    message_id=message_id,
                    user_id=chat_id,
                    value=value,
                    source="button",
                    variant=variant,
                    created_at=at,
                    updated_at=at,
                )
            )

        beam = [await conversation(1) for _ in range(3)]
        for k, value in enumerate([1, 1, 1, -1, 1, 1, 1, -1]):
            mid = await reply(beam[0], 1, "beam", "b" * (k + 1), 100.0 * (k + 1), 50.0 * (k + 1))
            vote(1, mid, "beam", value, DAY1 if k < 4 else DAY2)
        nucleus = [await conversation(31) for _ in range(2)]
        for k, value in enumerate([1, -1, -1, -1, 1, -1, -1, -1]):
            latency = 1000.0 * (k + 1)
            mid = await reply(nucleus[0], 31, "nucleus", "n" * 10, latency, latency / 2)
            vote(31, mid, "nucleus", value, DAY1 if k < 4 else DAY2)
        await reply(nucleus[0], 31, "nucleus", "n" * 19, None, None)
        old = await conversation(42)
        old1 = await reply(old, 42, "old", "old", 50.0, 20.0)
        old2 = await reply(old, 42, "old", "older", 70.0, 30.0)
        vote(42, old1, "old", 1, DAY2)

        for session_id, value, variant in (
            (beam[0], 4, "beam"),
            (beam[1], 5, "beam"),
            (beam[2], 3, "beam"),
            (nucleus[0], 2, "nucleus"),
            (nucleus[1], 4, "nucleus"),
        ):
            db.add(
                Rating(
                    chat_id=1 if variant == "beam" else 31,
                    session_id=session_id,
                    user_id=1,
                    value=value,
                    variant=variant,
                    created_at=DAY2,
                )
            )
    return VSeed((old1, old2))


async def run(db_url: str, *argv: str, experiment: Experiment = EXPERIMENT) -> tuple[int, str]:
    """An admin subcommand in this process; returns (status, stdout)."""
    out = io.StringIO()
    status = await admin(db_url, parse_admin(*argv), out, experiment=experiment)
    return status, out.getvalue()


# --- the hand-computed figures -----------------------------------------------------------------

# Every variant's votes (and ratings) come from one chat: the chat is the unit, and one chat
# is fewer than MIN_CHATS (5), so there is no interval and no evidence (p 1.0) however many
# votes it cast. (The vote-level z-test used to call 6/8 against 2/8 significant, p = 0.046,
# from two chats.) tests/integration/reports/test_report_chat_level.py has a seed with enough
# chats for intervals, worked out by hand.
# SRM over hash-assigned chats: beam 30, nucleus 10 (chat 41 was an admin's move; "old" has
# weight 0): expected 20 and 20, chi² = 10²/20 + 10²/20 = 10, 1 degree of freedom,
# p = P(χ²₁ > 10) = erfc(sqrt(10/2))
SRM_P = 0.0015654022580025488


def close(a: float | None, b: float) -> bool:
    return a is not None and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


async def test_report_figures_match_the_hand_computed_values(
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    await seed_variants(sessionmaker)
    report = await variant_report(sessionmaker, EXPERIMENT)
    assert (report.experiment, report.control) == ("decoding-test", "beam")
    assert [v.name for v in report.variants] == ["beam", "nucleus", "old"]  # file order, then DB
    beam, nucleus, old = report.variants

    assert (beam.weight, beam.control, beam.served) == (1.0, True, True)
    assert (beam.chats, beam.chats_hash, beam.turns) == (30, 30, 8)
    assert (beam.votes_up, beam.votes_down, beam.up_rate) == (6, 2, 0.75)  # 6/8
    assert (beam.vote_chats, beam.votes_counted) == (1, 8.0)  # user 1's 8 votes: under the cap
    assert math.isnan(beam.up_low) and math.isnan(beam.up_high)  # one chat: too few
    assert beam.ratings == 3
    assert close(beam.rating_mean, 4.0)  # (4 + 5 + 3) / 3
    assert math.isnan(beam.rating_low) and math.isnan(beam.rating_high)  # one rated chat
    # 100..800: p50 halfway between 400 and 500; p95 at rank 0.95·7 = 6.65: 700 + 0.65·100
    assert close(beam.latency_p50_ms, 450.0) and close(beam.latency_p95_ms, 765.0)
    assert close(beam.model_p50_ms, 225.0)  # half of 450
    assert close(beam.reply_chars, 4.5)  # (1 + 2 + ... + 8)/8 = 36/8

    assert (nucleus.weight, nucleus.control, nucleus.served) == (1.0, False, True)
    assert (nucleus.chats, nucleus.chats_hash, nucleus.turns) == (11, 10, 9)
    assert (nucleus.votes_up, nucleus.votes_down, nucleus.up_rate) == (2, 6, 0.25)  # 2/8
    assert math.isnan(nucleus.up_low) and math.isnan(nucleus.up_high)
    assert nucleus.ratings == 2 and close(nucleus.rating_mean, 3.0)
    # the old t-interval gave 3 -+ 12.7 on a 1..5 scale from two ratings
    assert math.isnan(nucleus.rating_low) and math.isnan(nucleus.rating_high)
    # the reply without timings is left out: 1000..8000 gives 4500 and 7000 + 0.65·1000
    assert close(nucleus.latency_p50_ms, 4500.0) and close(nucleus.latency_p95_ms, 7650.0)
    assert close(nucleus.model_p50_ms, 2250.0)
    assert close(nucleus.reply_chars, 11.0)  # (8·10 + 19)/9 = 99/9

    assert (old.weight, old.control, old.served) == (0.0, False, False)
    assert (old.chats, old.turns, old.votes_up, old.votes_down, old.up_rate) == (2, 2, 1, 0, 1.0)
    assert math.isnan(old.up_low) and math.isnan(old.up_high)
    assert old.ratings == 0 and math.isnan(old.rating_mean)
    # 50 and 70: p50 60, p95 50 + 0.95·20 = 69; model 20 and 30: p50 25; lengths 3 and 5
    assert close(old.latency_p50_ms, 60.0) and close(old.latency_p95_ms, 69.0)
    assert close(old.model_p50_ms, 25.0) and close(old.reply_chars, 4.0)

    vs_nucleus, vs_old = report.comparisons
    assert (vs_nucleus.variant, vs_nucleus.control) == ("nucleus", "beam")
    assert close(vs_nucleus.up_rate_diff, -0.5)  # 0.25 - 0.75
    assert close(vs_nucleus.lift, -0.5) and math.isnan(vs_nucleus.lift_low)
    assert (vs_nucleus.z, vs_nucleus.p_value) == (0.0, 1.0)  # one chat a side: nothing known
    assert (vs_nucleus.always_valid_low, vs_nucleus.always_valid_high) == (-1.0, 1.0)
    assert vs_nucleus.always_valid_p == 1.0
    assert (vs_nucleus.control_chats, vs_nucleus.variant_chats) == (1, 1)
    assert close(vs_nucleus.rating_diff, -1.0)  # 3 - 4
    assert vs_old.variant == "old" and close(vs_old.up_rate_diff, 0.25)  # 1/1 - 6/8
    assert math.isnan(vs_old.rating_diff)  # "old" has no ratings

    assert (report.srm.dof, report.srm.warn) == (1, True)
    assert close(report.srm.chi2, 10.0) and close(report.srm.p_value, SRM_P)
    assert report.note == REPORT_NOTE


async def test_report_text_shows_the_table_comparisons_srm_and_note(
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    await seed_variants(sessionmaker)
    text = format_variant_report(await variant_report(sessionmaker, EXPERIMENT))
    lines = text.splitlines()
    assert lines[0] == "experiment decoding-test, control beam"
    header = next(i for i, line in enumerate(lines) if line.startswith("variant "))
    rows = lines[header + 2 : header + 5]
    # fixed width: every row of the table is as wide as its rule
    assert all(len(r) <= len(lines[header + 1]) for r in rows)
    assert rows[0].split()[:11] == [
        "beam",
        "(control)",
        "1",
        "30",
        "8",
        "6",
        "2",
        "75.0%",
        "n/a",
        "(too",
        "few)",
    ]
    assert rows[0].split()[11:] == ["3", "4.00", "n/a", "(too", "few)", "450", "765", "225", "4.5"]
    assert rows[1].split()[:10] == [
        "nucleus",
        "1",
        "11",
        "9",
        "2",
        "6",
        "25.0%",
        "n/a",
        "(too",
        "few)",
    ]
    assert rows[2].split()[:4] == ["old", "(not", "served)", "0"]
    assert rows[2].split()[-7:-3] == ["0", "n/a", "n/a", "60"]  # no ratings: n/a
    at = lines.index(
        "nucleus vs beam: up rate -50.0 pp (25.0% vs 75.0%), chats with votes 1 vs 1; "
        "mean rating -1.00 (3.00 vs 4.00)"
    )
    assert lines[at + 1] == (
        "  always valid and fixed horizon: n/a (too few): "
        "no decision (fewer than 5 chats with votes on a side)"
    )
    assert any(line.startswith("old vs beam: up rate +25.0 pp") for line in lines)
    srm = next(i for i, line in enumerate(lines) if line.startswith("sample ratio"))
    assert lines[srm].endswith("chi2 = 10.00, df 1, p = 0.002")
    assert lines[srm + 1].startswith("  WARNING: sample ratio mismatch (p < 0.01)")
    # The note ends the report (after the guards and the autopilot's lines).
    note = "\n".join(lines[next(i for i, line in enumerate(lines) if line.startswith("Note: ")) :])
    assert note.startswith("Note: ") and " ".join(note.split()) == f"Note: {REPORT_NOTE}"
    assert f"{ALWAYS_VALID_NOTE} {FIXED_SAMPLE_NOTE}" == REPORT_NOTE


async def test_report_on_an_empty_database_has_no_numbers_to_show(
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    report = await variant_report(sessionmaker, EXPERIMENT)
    assert [(v.name, v.chats, v.turns, v.votes) for v in report.variants] == [
        ("beam", 0, 0, 0),
        ("nucleus", 0, 0, 0),
    ]
    assert math.isnan(report.variants[0].up_rate)
    assert report.comparisons[0].p_value == 1.0 and not report.srm.warn
    text = format_variant_report(report)
    assert "nucleus vs beam: up rate n/a (votes: 0 vs 0); mean rating n/a" in text
    data = report_json(report)
    assert data["variants"][0]["up_rate"] is None  # NaN becomes null
    json.dumps(data, allow_nan=False)


@pytest.fixture
async def seeded_url(sessionmaker: async_sessionmaker[AsyncSession], db_url: str) -> str:
    """db_url, the test's database, with seed_variants's chats and votes in it."""
    await seed_variants(sessionmaker)
    return db_url


async def test_admin_variants_json_and_plot(
    seeded_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db_url = seeded_url
    plot = tmp_path / "rates.png"
    status, out = await run(db_url, "variants", "--json", "--plot", str(plot))
    assert status == 0
    data = json.loads(out, parse_constant=lambda c: pytest.fail(f"{c} in the JSON"))
    assert (data["experiment"], data["control"]) == ("decoding-test", "beam")
    by_name = {v["name"]: v for v in data["variants"]}
    assert list(by_name) == ["beam", "nucleus", "old"]
    assert (by_name["beam"]["votes_up"], by_name["beam"]["votes"]) == (6, 8)
    assert by_name["beam"]["up_rate"] == 0.75
    assert by_name["nucleus"]["up_low"] is None  # one chat: no interval (NaN, written as null)
    assert by_name["nucleus"]["vote_chats"] == 1
    assert by_name["old"]["served"] is False and by_name["old"]["weight"] == 0.0
    assert by_name["old"]["rating_mean"] is None  # no ratings: NaN, written as null
    (vs_nucleus, vs_old) = data["comparisons"]
    assert vs_nucleus["variant"] == "nucleus" and vs_nucleus["p_value"] == 1.0
    assert (vs_nucleus["always_valid_low"], vs_nucleus["always_valid_high"]) == (-1.0, 1.0)
    assert vs_nucleus["lift_low"] is None and close(vs_nucleus["lift"], -0.5)
    assert vs_old["rating_diff"] is None
    assert close(data["srm"]["chi2"], 10.0) and data["srm"]["warn"] is True
    assert data["note"] == REPORT_NOTE

    png = plot.read_bytes()
    assert png.startswith(PNG_SIGNATURE) and len(png) > 1000
    assert f"wrote {plot}" in capsys.readouterr().err

    status, out = await run(db_url, "variants")
    assert status == 0 and out.startswith("experiment decoding-test, control beam\n")
    with pytest.raises(AdminError, match=r"cannot write .*no-such-dir"):
        await run(db_url, "variants", "--plot", str(tmp_path / "no-such-dir" / "x.png"))


def test_plot_without_matplotlib_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    report_placeholder: Any = None
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    with pytest.raises(RuntimeError, match="pip install matplotlib"):
        plot_variants(report_placeholder, tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


# --- admin assign ------------------------------------------------------------------------------


async def _assignment(
    sessionmaker: async_sessionmaker[AsyncSession], chat_id: int
) -> tuple[str, str, str] | None:
    async with sessionmaker() as db:
        row = (
            await db.execute(
                select(Assignment.experiment, Assignment.variant, Assignment.source).where(
                    Assignment.chat_id == chat_id
                )
            )
        ).first()
    return None if row is None else (row[0], row[1], row[2])


async def test_admin_assign_moves_a_chat_and_refuses_an_unknown_variant(
    sessionmaker: async_sessionmaker[AsyncSession], db_url: str
) -> None:
    await seed_variants(sessionmaker)
    assert await _assignment(sessionmaker, 5) == ("decoding-test", "beam", "hash")

    status, out = await run(db_url, "assign", "5", "nucleus")
    assert status == 0
    assert out == "chat 5: moved from beam to nucleus (its next reply comes from the new variant)\n"
    assert await _assignment(sessionmaker, 5) == ("decoding-test", "nucleus", "admin")

    # A chat without an assignment gets one.
    status, out = await run(db_url, "assign", "777", "beam", "--json")
    assert status == 0
    assert json.loads(out) == {
        "chat_id": 777,
        "experiment": "decoding-test",
        "variant": "beam",
        "previous": None,
        "source": "admin",
    }
    assert await _assignment(sessionmaker, 777) == ("decoding-test", "beam", "admin")

    # Unknown (and no longer served) variants are refused, naming the valid ones.
    for name in ("greedy", "old"):
        with pytest.raises(
            AdminError,
            match=r"unknown variant '.*'; the variants of experiment decoding-test are: "
            r"beam, nucleus$",
        ):
            await run(db_url, "assign", "6", name)
    assert await _assignment(sessionmaker, 6) == ("decoding-test", "beam", "hash")

    report = await variant_report(sessionmaker, EXPERIMENT)
    beam, nucleus, _ = report.variants
    # 30 - 1 + 1 (chat 777) and 11 + 1; the admin's moves are not hash-assigned
    assert (beam.chats, beam.chats_hash, nucleus.chats, nucleus.chats_hash) == (30, 29, 12, 10)


async def test_run_admin_reads_the_variants_file(
    seeded_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db_url = seeded_url
    good = tmp_path / "variants.toml"
    good.write_text(VARIANTS_TOML, encoding="utf-8")
    settings = Settings(database_url=SecretStr(db_url), variants_file=good)
    status = await asyncio.to_thread(run_admin, settings, parse_admin("assign", "3", "bogus"))
    err = capsys.readouterr().err
    assert status == 1
    assert err == (
        "error: unknown variant 'bogus'; the variants of experiment decoding-test are: "
        "beam, nucleus\n"
    )
    status = await asyncio.to_thread(run_admin, settings, parse_admin("assign", "3", "nucleus"))
    assert status == 0 and "moved from beam to nucleus" in capsys.readouterr().out

    bad = tmp_path / "bad.toml"
    bad.write_text("[[variants]]\nname = 'x'\nweight = -1\n", encoding="utf-8")
    settings = Settings(database_url=SecretStr(db_url), variants_file=bad)
    with pytest.raises(ConfigError, match="weight must not be negative"):
        run_admin(settings, parse_admin("variants"))


def test_cli_variants_and_a_broken_variants_file(sqlite_url: str, tmp_path: Path) -> None:
    """The real command line: the report, and exit status 2 for a broken VARIANTS_FILE."""

    async def seed() -> None:
        engine = make_engine(sqlite_url)
        try:
            await seed_variants(make_sessionmaker(engine))
        finally:
            await engine.dispose()

    asyncio.run(seed())
    good, bad = tmp_path / "variants.toml", tmp_path / "bad.toml"
    good.write_text(VARIANTS_TOML, encoding="utf-8")
    bad.write_text("[[variants]]\nname = 'beam'\ncontrol = 'yes'\n", encoding="utf-8")
    env = cli_env(tmp_path, DATABASE_URL=sqlite_url)

    def cli(variants_file: Path, *argv: str) -> subprocess.CompletedProcess[str]:
        return run_cli(
            "admin", *argv, cwd=tmp_path, env={**env, "VARIANTS_FILE": str(variants_file)}
        )

    proc = cli(good, "variants", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert [(v["name"], v["chats"], v["turns"]) for v in data["variants"]] == [
        ("beam", 30, 8),
        ("nucleus", 11, 9),
        ("old", 2, 2),
    ]
    proc = cli(bad, "variants")
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: VARIANTS_FILE ")
    assert "control must be true or false" in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout == ""


# --- /stats and admin stats ----------------------------------------------------------------


async def test_stats_show_one_line_per_variant_once_chats_are_assigned(
    sessionmaker: async_sessionmaker[AsyncSession], db_url: str
) -> None:
    before = await service_stats.stats(sessionmaker)
    assert before.variants == ()
    assert "variant" not in service_stats.format_stats(before)

    await seed_variants(sessionmaker)
    got = await service_stats.stats(sessionmaker)
    assert [(v.name, v.chats, v.replies, v.votes_up, v.votes_down) for v in got.variants] == [
        ("beam", 30, 8, 6, 2),
        ("nucleus", 11, 9, 2, 6),
        ("old", 2, 2, 1, 0),
    ]  # most chats first
    text = service_stats.format_stats(got).splitlines()
    assert text[-3:] == [  # the figures of admin variants: one chat each, too few for intervals
        "variant beam: 30 chats, 8 replies, 👍 75% (8 votes in 1 chats; too few for a CI)",
        "variant nucleus: 11 chats, 9 replies, 👍 25% (8 votes in 1 chats; too few for a CI)",
        "variant old: 2 chats, 2 replies, 👍 100% (1 votes in 1 chats; too few for a CI)",
    ]

    status, out = await run(db_url, "stats", "--json")
    assert status == 0
    data = json.loads(out)
    assert data["messages_total"] == 38  # 19 replies, each after a user message
    assert data["variants"][1] == {
        "name": "nucleus",
        "chats": 11,
        "replies": 9,
        "votes_up": 2,
        "votes_down": 6,
        "up_rate": 0.25,
        "up_low": None,
        "up_high": None,
        "vote_chats": 1,
    }


def test_variant_line_formats_thousands_and_no_votes() -> None:
    line = service_stats.format_variant_line(
        service_stats.VariantStats("beam", 120, 3400, 0, 0, None)
    )
    assert line == "variant beam: 120 chats, 3,400 replies, 👍 n/a (no votes)"
    line = service_stats.format_variant_line(
        service_stats.VariantStats("beam", 120, 3400, 1500, 500, 0.75, 0.7012, 0.7951, 40)
    )
    assert line == (
        "variant beam: 120 chats, 3,400 replies, 👍 75% (2,000 votes in 40 chats; 95% CI 70-80%)"
    )


# --- the per-variant SQL of docs/administration.md -------------------------------------------


def doc_queries() -> list[DocQuery]:
    """The ```sql blocks between the variants-sql markers."""
    return admin_doc_queries(DOC_START, DOC_END)


def doc_expected(s: VSeed) -> dict[str, tuple[tuple[str, ...], list[tuple[Any, ...]]]]:
    old1, old2 = s.old_replies
    return {
        "👍 rate per variant": (
            ("variant", "up", "down", "votes", "up_pct"),
            [("beam", 6, 2, 8, 75.0), ("nucleus", 2, 6, 8, 25.0), ("old", 1, 0, 1, 100.0)],
        ),
        "Ratings per variant": (
            # 4, 5, 3 and 2, 4
            ("variant", "ratings", "mean_rating", "four_or_five"),
            [("beam", 3, 4.0, 2), ("nucleus", 2, 3.0, 1)],
        ),
        "Votes per day per variant": (
            ("day", "variant", "up", "down"),
            [
                ("2026-01-10", "beam", 3, 1),
                ("2026-01-10", "nucleus", 1, 3),
                ("2026-01-11", "beam", 3, 1),
                ("2026-01-11", "nucleus", 1, 3),
                ("2026-01-11", "old", 1, 0),
            ],
        ),
        "Replies of one chat with their votes": (
            ("message_id", "variant", "text", "latency_ms", "up", "down"),
            [(old1, "old", "old", 50.0, 1, 0), (old2, "old", "older", 70.0, 0, 0)],
        ),
    }


def test_docs_per_variant_queries_each_have_an_expectation() -> None:
    queries = doc_queries()
    titles = {q.title for q in queries}
    assert titles == set(doc_expected(VSeed((0, 0))))
    for title in titles:
        labels = sorted(str(q.backend) for q in queries if q.title == title)
        assert labels in (["None"], ["postgresql", "sqlite"]), (title, labels)


async def test_docs_per_variant_queries_return_the_expected_rows(
    sessionmaker: async_sessionmaker[AsyncSession], db_url: str, sql_url: str
) -> None:
    s = await seed_variants(sessionmaker)
    await assert_doc_queries_return(doc_queries(), doc_expected(s), db_url, sql_url)


async def test_docs_show_the_real_output_of_admin_variants_for_this_seed(
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    """The example in the docs is this seed's report, character for character."""
    await seed_variants(sessionmaker)
    text = DOC.read_text(encoding="utf-8")
    prompt = "$ python -m bot admin variants\n"
    assert text.count(prompt) == 1
    shown = text[text.index(prompt) + len(prompt) :].split("\n```", 1)[0]
    assert shown == format_variant_report(await variant_report(sessionmaker, EXPERIMENT))
