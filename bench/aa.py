"""A/A and A/B experiments on simulated chat-clustered votes, watched the way an operator
watches: does the always-valid decision of `admin variants` keep its 5% false-positive rate
when it is read after every batch of new votes, and what does that cost against a fixed-horizon
test read once?

    python -m bench.aa [--quick] [--example]

Each experiment is a real SQLite database with the real schema (a template migrated once by the
project's migrations, bot/db/migrate.py, copied per experiment). Chats arrive in `--batches`
batches, each assigned to a or b with probability 1/2; every chat has its own 👍 propensity,
Beta(3, 2) (mean 60%, standard deviation 20 points: users differ), and casts 1 + Geometric
votes (mean `--votes`, so some chats pass the per-user cap of 10), spread over the batch it
arrived in and the next two (chats keep voting). One user per chat, as in private chats. In
the A/B experiments b's propensities are Beta(3.25, 1.75): the same spread, mean 65%, a true
lift of +5 pp. The rows (assignments, conversations, bot replies, votes) are inserted in bulk
after each batch; then the check reads them back the way the report does: `chat_vote_table`
(bot/reports/chat_votes.py: one (up, votes) pair per chat, the per-user cap) and
`always_valid_lift`, `chat_lift_test` and, for contrast, the vote-level `two_proportion_test`
the report used before (bot/reports/variant_stats.py). On a subsample of checks the full
`variant_report` runs as well, and its comparison must agree with this fast path exactly (the
run stops with an error if it does not).

Decisions, per experiment:
- always valid: stop at the first check whose always-valid p-value is below 0.05 (the bound
  excludes 0); the figure the report says may be read at any time;
- fixed horizon: the chat-level test read once, after the last batch;
- for contrast, the chat-level and the vote-level tests read after every batch ("peeking").

Prints the false-positive rates (A/A), the power and the median number of chats (with votes) at
the always-valid decision (A/B, +5 pp), against the fixed-horizon test, as `RESULT` lines;
writes bench/results/aa.json (aa-quick.json). `--quick` runs fewer and smaller experiments in a
few minutes; `--example` prints `admin variants` for one simulated A/B experiment and draws its
plot, bench/results/aa[-quick]-example.png (the example and image of docs/variants.md).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import shutil
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bench import common
from bot.db import migrate
from bot.db.engine import make_engine, make_sessionmaker
from bot.db.models import Assignment, Message, Rating, Session, Vote
from bot.engine.variants import Experiment, Variant
from bot.reports.chat_votes import chat_vote_table
from bot.reports.variant_stats import (
    PLANNED_CHATS,
    USER_VOTE_CAP,
    always_valid_lift,
    chat_lift_test,
    two_proportion_test,
    wilson_interval,
)
from bot.reports.variants import VariantReport, variant_report
from bot.reports.variants_text import format_variant_report, plot_variants

ALPHA = 0.05
EXPERIMENT = Experiment(
    "aa", (Variant("a", "zoo:x", 1.0, True), Variant("b", "zoo:x", 1.0, False)), "weights"
)
START = datetime(2026, 12, 1, tzinfo=UTC)
CONTROL_BETA = (3.0, 2.0)  # mean 0.6
LIFT_BETA = (3.25, 1.75)  # same concentration (5), mean 0.65: +5 pp
SPREAD = 3  # a chat votes over the batch it arrived in and the next two


@dataclass(frozen=True)
class Setup:
    """One run's sizes."""

    aa: int  # A/A experiments
    ab: int  # A/B experiments at +5 pp
    chats: int  # chats per experiment, both arms together
    batches: int  # checks per experiment
    votes: float  # mean votes per chat
    seed: int
    full_every: int  # the full variant_report on every n-th experiment (two checks each)
    name: str  # bench/results/<name>.json


@dataclass
class Outcome:
    """What the checks of one experiment decided."""

    lift: float  # the true lift simulated
    av_batch: int | None = None  # first check with always-valid p < alpha (1-based)
    av_chats: int | None = None  # chats with votes at that check
    av_sign: int = 0  # +1: b better, -1: b worse
    fixed_p: float = 1.0  # chat-level fixed horizon, read once at the end
    fixed_sign: int = 0
    fixed_chats: int = 0
    vote_peek: bool = False  # vote-level z-test p < alpha at any check
    fixed_peek: bool = False  # chat-level fixed test p < alpha at any check
    full_checks: int = 0  # checks where the full report ran and agreed


@dataclass
class Simulated:
    """The chats of one experiment, drawn up front."""

    arm: list[str]
    propensity: list[float]
    votes_by_batch: list[list[tuple[int, int]]]  # batch -> (chat index, value)
    ratings: list[int | None]


def simulate(rng: np.random.Generator, setup: Setup, lift: float) -> Simulated:
    """Chats, their arms and propensities, and when each of their votes comes in."""
    n = setup.chats
    arm = ["b" if b else "a" for b in rng.random(n) < 0.5]
    a_prop = rng.beta(*CONTROL_BETA, size=n)
    b_prop = rng.beta(*(LIFT_BETA if lift else CONTROL_BETA), size=n)
    propensity = [float(b_prop[i] if arm[i] == "b" else a_prop[i]) for i in range(n)]
    counts = rng.geometric(1.0 / setup.votes, size=n)
    per_batch = n / setup.batches
    votes_by_batch: list[list[tuple[int, int]]] = [[] for _ in range(setup.batches)]
    for i in range(n):
        first = int(i / per_batch)
        when = first + rng.integers(0, SPREAD, size=int(counts[i]))
        ups = rng.random(int(counts[i])) < propensity[i]
        for b, up in zip(when, ups, strict=True):
            votes_by_batch[min(int(b), setup.batches - 1)].append((i, 1 if up else -1))
    # A quarter of the chats rate their conversation, higher where they like the replies.
    rates = rng.random(n) < 0.25
    scores = np.clip(np.rint(1.0 + 4.0 * np.asarray(propensity) + rng.normal(0, 0.8, n)), 1, 5)
    ratings = [int(scores[i]) if rates[i] else None for i in range(n)]
    return Simulated(arm, propensity, votes_by_batch, ratings)


async def insert_batch(
    sm: async_sessionmaker[AsyncSession],
    sim: Simulated,
    batch: int,
    setup: Setup,
    next_message: list[int],
) -> None:
    """The batch's new chats (assignment, conversation, rating) and its votes, in bulk."""
    per_batch = setup.chats / setup.batches
    at = START + timedelta(hours=batch)
    new = [i for i in range(setup.chats) if int(i / per_batch) == batch]
    messages: list[dict[str, Any]] = []
    votes: list[dict[str, Any]] = []
    for i, value in sim.votes_by_batch[batch]:
        next_message[0] += 1
        mid = next_message[0]
        chat = i + 1
        messages.append(
            {
                "id": mid,
                "session_id": chat,
                "chat_id": chat,
                "role": "bot",
                "text": "reply",
                "variant": sim.arm[i],
                "created_at": at,
            }
        )
        votes.append(
            {
                "chat_id": chat,
                "message_id": mid,
                "user_id": chat,
                "value": value,
                "source": "button",
                "variant": sim.arm[i],
                "created_at": at,
                "updated_at": at,
            }
        )
    async with sm.begin() as db:
        if new:
            await db.execute(
                insert(Assignment.__table__),
                [
                    {
                        "chat_id": i + 1,
                        "experiment": EXPERIMENT.name,
                        "variant": sim.arm[i],
                        "source": "hash",
                        "assigned_at": at,
                        "probability": 0.5,
                    }
                    for i in new
                ],
            )
            await db.execute(
                insert(Session.__table__),
                [{"id": i + 1, "chat_id": i + 1, "user_id": i + 1, "created_at": at} for i in new],
            )
            rated = [i for i in new if sim.ratings[i] is not None]
            if rated:
                await db.execute(
                    insert(Rating.__table__),
                    [
                        {
                            "chat_id": i + 1,
                            "session_id": i + 1,
                            "user_id": i + 1,
                            "value": sim.ratings[i],
                            "variant": sim.arm[i],
                            "created_at": at,
                        }
                        for i in rated
                    ],
                )
        if messages:
            await db.execute(insert(Message.__table__), messages)
            await db.execute(insert(Vote.__table__), votes)


async def run_experiment(
    template: Path, workdir: Path, setup: Setup, lift: float, rng: np.random.Generator, full: bool
) -> tuple[Outcome, VariantReport | None]:
    """One experiment on its own database: insert each batch, check, decide."""
    path = workdir / "experiment.sqlite3"
    shutil.copyfile(template, path)
    engine = make_engine(f"sqlite+aiosqlite:///{path}")
    sm = make_sessionmaker(engine)
    sim = simulate(rng, setup, lift)
    out = Outcome(lift=lift)
    next_message = [0]
    shown = None
    try:
        for batch in range(setup.batches):
            await insert_batch(sm, sim, batch, setup, next_message)
            async with sm() as db:
                table = await chat_vote_table(db)
            a, b = table.get("a", {}), table.get("b", {})
            pa, pb = [v.pair for v in a.values()], [v.pair for v in b.values()]
            seq = always_valid_lift(pa, pb, ALPHA)
            fixed = chat_lift_test(pa, pb)
            up_a, n_a = sum(v.up for v in a.values()), sum(v.up + v.down for v in a.values())
            up_b, n_b = sum(v.up for v in b.values()), sum(v.up + v.down for v in b.values())
            vote = two_proportion_test(up_a, n_a, up_b, n_b)
            if seq.p_value < ALPHA and out.av_batch is None:
                out.av_batch, out.av_chats = batch + 1, sum(seq.chats)
                out.av_sign = 1 if seq.low > 0 else -1
            out.vote_peek |= vote.p_value < ALPHA
            out.fixed_peek |= fixed.p_value < ALPHA
            last = batch == setup.batches - 1
            if last:
                out.fixed_p, out.fixed_chats = fixed.p_value, sum(fixed.chats)
                out.fixed_sign = (1 if fixed.lift > 0 else -1) if fixed.p_value < ALPHA else 0
            if full and (last or batch == setup.batches // 2):
                report = await variant_report(sm, EXPERIMENT)
                (c,) = report.comparisons
                mine = (seq.low, seq.high, seq.p_value, fixed.p_value, fixed.lift, fixed.low)
                theirs = (
                    c.always_valid_low,
                    c.always_valid_high,
                    c.always_valid_p,
                    c.p_value,
                    c.lift,
                    c.lift_low,
                )
                if not all(
                    (math.isnan(x) and math.isnan(y)) or math.isclose(x, y, abs_tol=1e-12)
                    for x, y in zip(mine, theirs, strict=True)
                ):
                    raise SystemExit(
                        f"the full report disagrees with the fast path: {theirs} != {mine}"
                    )
                out.full_checks += 1
                if last:
                    shown = report
    finally:
        await engine.dispose()
    return out, shown


@dataclass
class Summary:
    """The figures of one group of experiments."""

    experiments: int
    av_rate: float  # share decided by the always-valid test (in the right direction for A/B)
    av_rate_ci: tuple[float, float]
    av_wrong_sign: float  # A/B: decided the wrong way
    av_chats_median: float  # chats with votes at the always-valid decision (NaN: none)
    av_chats_quartiles: tuple[float, float]
    fixed_rate: float  # the fixed-horizon chat-level test read once at the end
    fixed_rate_ci: tuple[float, float]
    fixed_chats_median: float
    fixed_peek_rate: float  # the same test read after every batch
    vote_peek_rate: float  # the vote-level z-test read after every batch
    full_report_checks: int = 0
    extra: dict[str, float] = field(default_factory=dict)


def summarise(outcomes: Sequence[Outcome], *, null: bool) -> Summary:
    n = max(1, len(outcomes))
    if null:
        av = [o for o in outcomes if o.av_batch is not None]
        fixed = sum(o.fixed_p < ALPHA for o in outcomes)
        wrong = 0.0
    else:
        av = [o for o in outcomes if o.av_batch is not None and o.av_sign > 0]
        fixed = sum(o.fixed_sign > 0 for o in outcomes)
        wrong = sum(o.av_batch is not None and o.av_sign < 0 for o in outcomes) / n
    chats = [float(o.av_chats) for o in av if o.av_chats is not None]
    quart = (
        (float(np.percentile(chats, 25)), float(np.percentile(chats, 75))) if chats else (0.0, 0.0)
    )
    return Summary(
        experiments=len(outcomes),
        av_rate=len(av) / n,
        av_rate_ci=wilson_interval(len(av), n),
        av_wrong_sign=wrong,
        av_chats_median=statistics.median(chats) if chats else math.nan,
        av_chats_quartiles=quart,
        fixed_rate=fixed / n,
        fixed_rate_ci=wilson_interval(fixed, n),
        fixed_chats_median=statistics.median([o.fixed_chats for o in outcomes] or [0]),
        fixed_peek_rate=sum(o.fixed_peek for o in outcomes) / n,
        vote_peek_rate=sum(o.vote_peek for o in outcomes) / n,
        full_report_checks=sum(o.full_checks for o in outcomes),
    )


def scratch() -> str | None:
    """Where the experiments' databases go: a tmpfs where there is one. They are real SQLite
    files either way; the checks should not wait on the disk syncs of other jobs."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() else None


async def run(setup: Setup, example: bool, base: str | None) -> dict[str, Any]:
    """All experiments; returns the summaries."""
    rng = np.random.default_rng(setup.seed)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-aa-", dir=base) as tmp:
        workdir = Path(tmp)
        template = workdir / "template.sqlite3"
        await asyncio.to_thread(migrate.upgrade, f"sqlite+aiosqlite:///{template}")
        groups: dict[str, list[Outcome]] = {"aa": [], "ab": []}
        shown = None
        for name, count, lift in (("aa", setup.aa, 0.0), ("ab", setup.ab, 0.05)):
            for k in range(count):
                full = k % setup.full_every == 0
                outcome, last = await run_experiment(template, workdir, setup, lift, rng, full)
                groups[name].append(outcome)
                if name == "ab" and last is not None and shown is None:
                    shown = last
                if (k + 1) % max(1, count // 10) == 0:
                    print(
                        f"  {name}: {k + 1}/{count} experiments, "
                        f"{time.perf_counter() - started:.0f} s",
                        flush=True,
                    )
    if example and shown is not None:
        print("\n$ python -m bot admin variants\n" + format_variant_report(shown) + "\n")
        common.RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        png = common.RESULTS_DIR / f"{setup.name}-example.png"
        await asyncio.to_thread(plot_variants, shown, png)
        print(f"wrote {png.relative_to(common.ROOT)}")
    return {
        "setup": asdict(setup),
        "aa": asdict(summarise(groups["aa"], null=True)),
        "ab": asdict(summarise(groups["ab"], null=False)),
        "wall_s": time.perf_counter() - started,
    }


def report(results: dict[str, Any]) -> None:
    """Tables and RESULT lines."""
    s, aa, ab = results["setup"], results["aa"], results["ab"]

    def ci(pair: Sequence[float]) -> str:
        return f"{100 * pair[0]:.1f}-{100 * pair[1]:.1f}%"

    common.print_table(
        f"A/A: {aa['experiments']} experiments, {s['chats']} chats each, checked after each of "
        f"{s['batches']} batches (false-positive rate; goal <= 5%)",
        ["decision", "read", "false positives", "95% interval"],
        [
            ("always valid (chat level)", "every batch", aa["av_rate"], ci(aa["av_rate_ci"])),
            ("fixed horizon (chat level)", "once, at the end", aa["fixed_rate"],
             ci(aa["fixed_rate_ci"])),
            ("fixed horizon (chat level)", "every batch", aa["fixed_peek_rate"], "-"),
            ("vote-level z-test (old report)", "every batch", aa["vote_peek_rate"], "-"),
        ],
    )  # fmt: skip
    common.print_table(
        f"A/B at +5 pp: {ab['experiments']} experiments (power: decided for b)",
        ["decision", "power", "95% interval", "median chats", "quartiles", "wrong way"],
        [
            (
                "always valid, stop at first",
                ab["av_rate"],
                ci(ab["av_rate_ci"]),
                ab["av_chats_median"],
                f"{ab['av_chats_quartiles'][0]:.0f}-{ab['av_chats_quartiles'][1]:.0f}",
                ab["av_wrong_sign"],
            ),
            (
                "fixed horizon, read once",
                ab["fixed_rate"],
                ci(ab["fixed_rate_ci"]),
                ab["fixed_chats_median"],
                "-",
                "-",
            ),
        ],
    )
    common.emit_results(
        {
            "aa_false_positive_rate": aa["av_rate"],
            "aa_power": ab["av_rate"],
            "aa_chats_to_decision": ab["av_chats_median"],
        }
    )
    common.emit_results(
        {
            "aa_fixed_false_positive_rate": aa["fixed_rate"],
            "aa_fixed_power": ab["fixed_rate"],
            "aa_fixed_chats": ab["fixed_chats_median"],
            "aa_fixed_peeking_false_positive_rate": aa["fixed_peek_rate"],
            "aa_vote_peeking_false_positive_rate": aa["vote_peek_rate"],
            "aa_wrong_way_rate": ab["av_wrong_sign"],
            "aa_experiments": aa["experiments"],
            "aa_ab_experiments": ab["experiments"],
            "aa_full_report_checks": aa["full_report_checks"] + ab["full_report_checks"],
            "aa_wall_s": results["wall_s"],
        }
    )


def parse(argv: Sequence[str] | None = None) -> tuple[Setup, bool]:
    parser = argparse.ArgumentParser(
        prog="python -m bench.aa",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="fewer, smaller experiments")
    parser.add_argument("--example", action="store_true", help="print one A/B report")
    parser.add_argument("--aa", type=int, default=None, help="A/A experiments")
    parser.add_argument("--ab", type=int, default=None, help="A/B experiments at +5 pp")
    parser.add_argument("--chats", type=int, default=None, help="chats per experiment")
    parser.add_argument("--batches", type=int, default=20, help="checks per experiment")
    parser.add_argument("--votes", type=float, default=6.0, help="mean votes per chat")
    parser.add_argument("--seed", type=int, default=34)
    args = parser.parse_args(argv)
    quick = bool(args.quick)
    setup = Setup(
        aa=1000 if args.aa is None else args.aa,
        ab=(200 if quick else 1000) if args.ab is None else args.ab,
        chats=(400 if quick else PLANNED_CHATS) if args.chats is None else args.chats,
        batches=args.batches,
        votes=args.votes,
        seed=args.seed,
        full_every=50 if not quick else 25,
        name="aa-quick" if quick else "aa",
    )
    return setup, bool(args.example)


def main(argv: Sequence[str] | None = None) -> None:
    setup, example = parse(argv)
    print(
        f"bench.aa: {setup.aa} A/A + {setup.ab} A/B experiments, {setup.chats} chats, "
        f"{setup.batches} checks, ~{setup.votes:g} votes per chat (cap {USER_VOTE_CAP}), "
        f"always-valid bound tuned for {PLANNED_CHATS} chats",
        flush=True,
    )
    results = asyncio.run(run(setup, example, scratch()))
    report(results)
    common.write_json(setup.name, results)


if __name__ == "__main__":
    main()
