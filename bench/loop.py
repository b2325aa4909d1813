"""The learning loop, end to end, on simulated users whose preference we know, against ONE
running service: the candidate joins it live, as an operator adds it, without a restart.

    python -m bench.loop [--quick] [--allocation thompson]

Three arms: the control, a 👍+👎 candidate (`train --from-feedback`'s default: unlikelihood on
the disliked replies beside likelihood on the liked ones, with its collapse guard) and a 👍-only
candidate (`--negatives none --min-distinct-ratio 0`: the liked replies only and no guard, what
the command did before), both fine-tuned from the same export and added live beside the control.

`python -m bot run` starts once, serving the control (the shipped model by default) against the
loopback Bot API with a real SQLite database, and runs until every step is done:

1. Collect: simulated users set a persona, chat, and press 👍 under a reply that asks a question
   back (it contains "?") and 👎 under any other, each vote flipped with probability `--noise`
   (seeded per chat and turn).
2. Export, while the service runs: `python -m bot admin export --format parlai`.
3. Fine-tune, while the service runs, twice from the same export: `python -m bot train
   --from-feedback ... --base CONTROL` (👍+👎) and the same with `--negatives none
   --min-distinct-ratio 0` (👍 only).
4. Add, live: `python -m bot admin variants add candidate --model OUT/model --weight 1`, then
   `... add likes-only ...` (the control keeps its weight 1: a third of the new chats each).
   After each add, new "probe" chats, a few at a time, send one message each until one of them
   is answered by the new variant: the service picked it up. `loop_candidate_live_s` = that
   reply's arrival at the loopback server minus the moment the add command returned (the
   change is committed by then). Probe chats do not vote and are left out of every figure.
5. Compare: a fresh set of users (chat ids never seen before) chats with the same preference.
6. Decide: `python -m bot admin variants --json --plot`: each candidate's 👍-rate lift over the
   control and its always-valid 95% lower bound (`always_valid_low`, chat-level: see
   docs/variants.md), the fixed-horizon test, the sample-ratio check; and each variant's share
   of distinct replies among the new chats' replies (`loop_distinct_ratio`: the 👍+👎
   candidate's over the control's). Where the report has no `always_valid_low` yet, the bench
   computes it with the same code the report uses (bot.reports.chat_votes.chat_votes and
   bot.reports.variant_stats.always_valid_lift) on the same snapshot.

Only new chats count. The experiment stays the one the service runs (a new experiment would
need a new VARIANTS_FILE, i.e. a restart), and `admin variants` has no filter by time, so the
bench decides on a snapshot of the database (SQLite's backup, taken while the service runs)
from which every row of the other chats was deleted: what is left are the chats of the users
who first wrote after the add (checked: each of their assignments is later than the add), and
the real `admin variants` report reads it. Without this the control's figures would include the
collect phase's votes.

With `--allocation thompson` the comparison runs once more, still on the same service:
`python -m bot admin variants allocation thompson`, probe chats until one is assigned by the
bandit (`loop_thompson_followed_s`; users who came sooner would still get the weights, the
service polls every 2 s), then another fresh set of users; only their chats count, each checked
to be assigned after the switch and by thompson. The bandit's posteriors count every vote on each
variant's replies (bot.engine.bandit), so it starts from what the collect and weighted phases
said; the candidate's share of these chats and the split recorded at assignment are printed.

Output: `RESULT loop_*` lines, bench/results/loop.json and loop.png (loop-quick.* for
`--quick`, a smoke run of a few minutes whose p-value means little).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import operator
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import common, e2e

EXPERIMENT = "bench-loop"
CONTROL, CANDIDATE, LIKES_ONLY = "control", "candidate", "likes-only"
# The candidates: name -> `train --from-feedback` options beyond the shared ones.
ARMS: dict[str, list[str]] = {
    CANDIDATE: [],  # the default: --negatives unlikelihood, the collapse guard on
    LIKES_ONLY: ["--negatives", "none", "--min-distinct-ratio", "0"],
}
SHIPPED = common.ROOT / "models" / "chitchat" / "model"
DB_FILE = "bot.sqlite3"
# Chat ids of each group of users: never reused, so that every group's chats are new.
COLLECT_CHATS, PROBE_CHATS, COMPARE_CHATS, THOMPSON_CHATS = 0, 5_000, 10_000, 20_000
PROBES_AT_ONCE = 4
PROBE_PAUSE_S = 0.5  # between rounds of probes: the figure's resolution, a few probe chats


@dataclass
class Setup:
    """One invocation (the command line, after --quick)."""

    model: str
    collect_users: int
    compare_users: int
    messages: int
    minutes: float
    noise: float
    allocation: str
    seed: int
    wait_s: float
    quick: bool
    keep: Path | None
    log_level: str = "WARNING"


@dataclass
class Phase:
    """What one group of simulated users saw and did."""

    replies: int = 0
    up: int = 0
    down: int = 0
    questions: int = 0  # replies that asked a question back
    errors: list[str] = field(default_factory=list)
    wall_s: float = 0.0


def likes(reply: str) -> bool:
    """The simulated users' preference: a reply that asks a question back."""
    return "?" in reply


def vote_data(markup: Mapping[str, Any] | None, value: int) -> str | None:
    """The callback_data of the 👍 (1) or 👎 (-1) button of a reply's keyboard."""
    for row in (markup or {}).get("inline_keyboard", []):
        for button in row:
            data = str(button.get("callback_data", ""))
            if data.startswith("v:") and data.endswith(f":{value}"):
                return data
    return None


def chats(group: int, n: int) -> list[int]:
    """The chat ids of `n` users of a group (COLLECT_CHATS, PROBE_CHATS, ...)."""
    return [e2e.FIRST_CHAT + group + u for u in range(n)]


async def _user(
    replies: e2e.Replies, chat: int, user: int, setup: Setup, phase: Phase, rng: random.Random
) -> None:
    api = replies.api
    api.user_message(chat, "/persona " + common.persona(user))
    if not await replies.wait(chat, 1, setup.wait_s):
        phase.errors.append(f"chat {chat}: no answer to /persona")
        return
    for k in range(setup.messages):
        api.user_message(chat, common.user_message(user, k))
        if not await replies.wait(chat, k + 2, setup.wait_s):
            phase.errors.append(f"chat {chat}: no reply to message {k + 1}")
            return
        sent = next(s for s in reversed(api.sent) if s.chat_id == chat)
        liked = likes(sent.text)
        phase.replies += 1
        phase.questions += liked
        if rng.random() < setup.noise:
            liked = not liked
        data = vote_data(sent.reply_markup, 1 if liked else -1)
        if data is None:
            phase.errors.append(f"chat {chat}: reply {k + 1} has no vote buttons")
            continue
        _, query = api.press(chat, sent.message_id, data)
        answered = functools.partial(operator.contains, api.callback_answers, query)
        await e2e.wait_until(answered, setup.wait_s, "a vote")
        phase.up += liked
        phase.down += not liked


async def users(replies: e2e.Replies, group: Sequence[int], setup: Setup, seed: int) -> Phase:
    """Let the users of `group` talk and vote, all at once, on the running service."""
    phase = Phase()
    started = time.monotonic()
    await asyncio.gather(
        *(
            _user(replies, chat, chat, setup, phase, random.Random(seed * 1_000_003 + chat))
            for chat in group
        )
    )
    phase.wall_s = time.monotonic() - started
    if phase.errors:
        raise RuntimeError("simulated users got no answer: " + "; ".join(phase.errors[:5]))
    return phase


def variants_file(path: Path, model: str) -> None:
    """The seed of the experiment: the control alone (the candidate is added live)."""
    quoted = json.dumps  # a JSON string is a valid TOML basic string
    lines = [f"experiment = {quoted(EXPERIMENT)}", "", "[[variants]]"]
    lines += [f"name = {quoted(CONTROL)}", f"model = {quoted(model)}", "weight = 1"]
    path.write_text("\n".join([*lines, "control = true"]) + "\n", encoding="utf-8")


def add_argv(model: str, weight: float = 1.0, name: str = CANDIDATE) -> list[str]:
    """`python -m bot` arguments that add a candidate to the running experiment."""
    return ["admin", "variants", "add", name, "--model", model, "--weight", f"{weight:g}"]


def allocation_argv(allocation: str) -> list[str]:
    """`python -m bot` arguments that change how the experiment splits new chats."""
    return ["admin", "variants", "allocation", allocation]


def bot(env: Mapping[str, str], *argv: str, timeout: float = 3600) -> str:
    """`python -m bot ARGV` as an operator runs it; its stdout (stderr shown on failure)."""
    proc = subprocess.run(
        [sys.executable, "-m", "bot", *argv],
        cwd=common.ROOT,
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"`python -m bot {' '.join(argv)}` failed:\n{proc.stderr[-3000:]}")
    return proc.stdout


async def bot_async(env: Mapping[str, str], *argv: str) -> str:
    """`bot` off the event loop: the loopback server (and so the service) keeps running."""
    return await asyncio.to_thread(bot, env, *argv)


def env_for(
    tmp: Path, variants: Path, model: str, db: Path | None = None, log_level: str = "WARNING"
) -> dict[str, str]:
    """The service's environment: a real database file, the variants file, one thread each
    (2 shared cores), no flood gate in the way of the simulated users."""
    env = e2e.bot_env(
        tmp,
        model,
        log_level=log_level,
        extra={
            "VARIANTS_FILE": str(variants),
            "DATABASE_URL": f"sqlite+aiosqlite:///{db or tmp / DB_FILE}",
            "TORCH_THREADS": "1",
            "WORKER_THREADS": "1",
            "FLOOD_MAX_MESSAGES": "1000",
        },
    )
    return env


def read_only(db: Path) -> sqlite3.Connection:
    """A read-only connection (the service keeps writing; WAL lets both go on)."""
    return sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)


Assigned = dict[int, tuple[str, str | None]]  # chat -> (variant, how: "weights"/"thompson")


def assignments_of(db: Path, chat_ids: Iterable[int]) -> Assigned:
    """Each of these chats' variant and the allocation that chose it, where it has one."""
    ids = list(chat_ids)
    marks = ",".join("?" * len(ids))
    with closing(read_only(db)) as conn:
        rows = conn.execute(
            f"SELECT chat_id, variant, allocation FROM assignments WHERE chat_id IN ({marks})",
            ids,
        ).fetchall()
    return {int(chat): (str(variant), allocated_by(how)) for chat, variant, how in rows}


def allocated_by(allocation: str | None) -> str | None:
    """`by` of an assignments.allocation JSON ("weights", "thompson"), or None."""
    return None if allocation is None else json.loads(allocation).get("by")


def on_candidate(variant: str, by: str | None) -> bool:
    """The service picked up the add: a new chat went to the candidate."""
    return variant == CANDIDATE


def on_likes_only(variant: str, by: str | None) -> bool:
    """The service picked up the add: a new chat went to the 👍-only candidate."""
    return variant == LIKES_ONLY


ON_ARM = {CANDIDATE: on_candidate, LIKES_ONLY: on_likes_only}


def by_bandit(variant: str, by: str | None) -> bool:
    """The service picked up `admin variants allocation thompson`."""
    return by == "thompson"


def first_reply_where(
    sent_at: Mapping[int, Sequence[float]],
    assigned: Assigned,
    served: Callable[[str, str | None], bool],
) -> float | None:
    """When the first reply to a chat whose assignment is `served` reached the server."""
    times = [
        ts[0] for chat, ts in sent_at.items() if ts and chat in assigned and served(*assigned[chat])
    ]
    return min(times) if times else None


async def wait_until_served(
    replies: e2e.Replies,
    db: Path,
    changed_at: float,
    setup: Setup,
    served: Callable[[str, str | None], bool],
    probes: list[int],
) -> float:
    """New probe chats, PROBES_AT_ONCE at a time (PROBE_PAUSE_S apart), one message each,
    until one's assignment is `served` (the running service followed the change); seconds
    from `changed_at` to that chat's reply. The chats used are appended to `probes`."""
    deadline = time.monotonic() + setup.wait_s
    used: list[int] = []
    while time.monotonic() < deadline:
        batch = chats(PROBE_CHATS + len(probes), PROBES_AT_ONCE)
        probes += batch
        used += batch
        for chat in batch:
            replies.api.user_message(chat, "hello there")
        for chat in batch:
            if not await replies.wait(chat, 1, setup.wait_s):
                raise RuntimeError(f"no reply to probe chat {chat}")
        sent_at = {chat: replies.sent_at.get(chat, []) for chat in used}
        first = first_reply_where(sent_at, assignments_of(db, used), served)
        if first is not None:
            return first - changed_at
        await asyncio.sleep(PROBE_PAUSE_S)
    raise RuntimeError(
        f"the running service did not follow the change within {setup.wait_s:g}s "
        f"({served.__doc__}; {len(used)} probe chats; see bot.log)"
    )


def snapshot(db: Path, out: Path) -> None:
    """A consistent copy of the service's database while it runs (SQLite's backup API)."""
    with closing(sqlite3.connect(db, timeout=30)) as src, closing(sqlite3.connect(out)) as dst:
        src.backup(dst)


def keep_only_chats(db: Path, keep: Iterable[int]) -> dict[str, int]:
    """Delete every row of every other chat from each table with a chat_id column (a copy
    of the service's database, for the report); rows deleted per table."""
    ids = sorted(set(keep))
    deleted: dict[str, int] = {}
    conn = sqlite3.connect(db)
    try:
        conn.execute("CREATE TEMP TABLE keep_chats (chat_id INTEGER PRIMARY KEY)")
        conn.executemany("INSERT INTO keep_chats VALUES (?)", [(i,) for i in ids])
        tables = [
            str(row[0])
            for row in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
            )
        ]
        for table in tables:
            columns = {str(c[1]) for c in conn.execute(f'PRAGMA table_info("{table}")')}
            if "chat_id" not in columns:
                continue
            cur = conn.execute(
                f'DELETE FROM "{table}" WHERE chat_id IS NULL '
                "OR chat_id NOT IN (SELECT chat_id FROM keep_chats)"
            )
            deleted[table] = cur.rowcount
        conn.commit()
    finally:
        conn.close()
    return deleted


def stored_time(value: str) -> datetime:
    """A timestamp as SQLite holds the service's (naive UTC text)."""
    when = datetime.fromisoformat(str(value))
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def check_new(db: Path, since: float, by: str | None = None) -> int:
    """Every chat left in the (trimmed) copy was assigned after `since` (time.time()), and
    by the allocation `by` where given; the number of chats."""
    with closing(sqlite3.connect(db)) as conn:
        rows = conn.execute("SELECT chat_id, assigned_at, allocation FROM assignments").fetchall()
    limit = datetime.fromtimestamp(since, UTC)
    old = [int(chat) for chat, at, _ in rows if stored_time(at) < limit]
    if old:
        raise RuntimeError(f"chats assigned before the change counted as new: {old[:5]}")
    other = [int(chat) for chat, _, how in rows if by is not None and allocated_by(how) != by]
    if other:
        raise RuntimeError(f"chats not assigned by {by} counted as such: {other[:5]}")
    return len(rows)


def recorded_share(db: Path, variant: str) -> float | None:
    """The mean probability the hash-assigned chats had of getting `variant` (the split
    recorded at assignment), or None where none is recorded."""
    with closing(sqlite3.connect(db)) as conn:
        rows = conn.execute(
            "SELECT allocation FROM assignments WHERE source = 'hash' AND allocation IS NOT NULL"
        ).fetchall()
    return mean_split([str(r[0]) for r in rows], variant)


def mean_split(allocations: Sequence[str], variant: str) -> float | None:
    """The mean of `variant`'s share over recorded splits (assignments.allocation JSON)."""
    shares = [float(json.loads(a).get("split", {}).get(variant, 0.0)) for a in allocations]
    return sum(shares) / len(shares) if shares else None


def always_valid_from_rows(db: Path) -> dict[str, dict[str, float]]:
    """Per candidate, the always-valid lift over the control from the snapshot's rows, with
    the report's own code (chat_votes, always_valid_lift): for a report that does not show it."""
    from bot.db.engine import make_engine, make_sessionmaker
    from bot.reports.chat_votes import chat_votes
    from bot.reports.variant_stats import always_valid_lift

    async def read() -> dict[str, list[tuple[float, float]]]:
        engine = make_engine(f"sqlite+aiosqlite:///{db}")
        try:
            async with make_sessionmaker(engine)() as session:
                return await chat_votes(session)
        finally:
            await engine.dispose()

    pairs = asyncio.run(read())
    out = {}
    for arm in ARMS:
        lift = always_valid_lift(pairs.get(CONTROL, []), pairs.get(arm, []))
        out[arm] = {"always_valid_low": lift.low, "always_valid_high": lift.high,
                    "always_valid_p": lift.p_value, "lift": lift.lift}  # fmt: skip
    return out


def decide(env: Mapping[str, str], plot: Path | None, db: Path | None = None) -> dict[str, Any]:
    """`admin variants --json` (and `--plot`): the control and each candidate, compared;
    `db` (the snapshot the report read) for the always-valid bound where the report has none."""
    report = json.loads(
        bot(env, "admin", "variants", "--json", *(["--plot", str(plot)] if plot else []))
    )
    figures = {v["name"]: v for v in report["variants"]}
    control = figures[CONTROL]
    out: dict[str, Any] = {
        "control_up_rate": control["up_rate"],
        "control_interval": [control["up_low"], control["up_high"]],
        "control_votes": control["votes_up"] + control["votes_down"],
        "control_chats": control["chats"],
        "allocation": report.get("allocation"),
        "always_valid_from": "admin variants --json",
    }
    computed: dict[str, dict[str, float]] | None = None
    all_chats = sum(int(figures[n]["chats"]) for n in (CONTROL, *ARMS) if n in figures)
    for arm in ARMS:
        candidate = figures.get(arm)
        if candidate is None:
            continue
        comparison = next(c for c in report["comparisons"] if c["variant"] == arm)
        if "always_valid_low" not in comparison:
            if computed is None and db is not None:
                computed = always_valid_from_rows(db)
                out["always_valid_from"] = "chat_votes + always_valid_lift on the snapshot"
            comparison = {**comparison, **(computed or {}).get(arm, {})}
        out[arm] = {
            "up_rate": candidate["up_rate"],
            "interval": [candidate["up_low"], candidate["up_high"]],
            "votes": candidate["votes_up"] + candidate["votes_down"],
            "chats": candidate["chats"],
            "vote_diff_pp": 100 * comparison["up_rate_diff"],
            "p": comparison["p_value"],
            # chat-level: the lift, its fixed-horizon interval, the always-valid bounds
            "lift_pp": _pp(comparison.get("lift", comparison["up_rate_diff"])),
            "lift_interval_pp": [_pp(comparison.get("lift_low")), _pp(comparison.get("lift_high"))],
            "always_valid_low_pp": _pp(comparison.get("always_valid_low")),
            "always_valid_high_pp": _pp(comparison.get("always_valid_high")),
            "always_valid_p": float(comparison.get("always_valid_p", float("nan"))),
            "chat_share": candidate["chats"] / max(1, all_chats),
            "guards": candidate.get("guards"),
        }
    return out


def distinct_shares(db: Path) -> dict[str, float]:
    """Per variant, distinct replies / replies: a candidate that learnt one question and asks
    it every time would win the vote and fail its users."""
    with closing(sqlite3.connect(db)) as conn:
        rows = conn.execute(
            "SELECT variant, count(DISTINCT text) * 1.0 / count(*) FROM messages "
            "WHERE role = 'bot' GROUP BY variant"
        ).fetchall()
    return {str(name): float(share) for name, share in rows}


@dataclass
class Window:
    """One comparison: its users, their chats, since when they count, the snapshot."""

    label: str
    chats: list[int]
    since: float  # time.time() when the change (add, allocation) was committed
    phase: Phase
    copy: Path
    by: str  # the allocation every one of its chats must have been assigned by
    followed_s: float | None = None  # the change (allocation) to its first chat assigned by it


async def fine_tune(
    env: Mapping[str, str], setup: Setup, export: Path, out: Path, extra: Sequence[str]
) -> dict[str, Any]:
    """`train --from-feedback` while the service runs; its recipe.json (written also when the
    collapse guard refused the candidate: `installed` false)."""
    argv = ["train", "--from-feedback", str(export), "--base", setup.model, "--out", str(out)]
    argv += ["--minutes", str(setup.minutes), *extra]
    try:
        await bot_async(env, *argv)
    except RuntimeError:
        if not (out / "recipe.json").is_file():
            raise
    recipe: dict[str, Any] = json.loads((out / "recipe.json").read_text())
    return recipe


async def serve_loop(
    setup: Setup, tmp: Path, env: Mapping[str, str]
) -> tuple[Phase, dict[str, dict[str, Any]], Path, dict[str, float], int, list[Window]]:
    """Steps 1-5 on one running service; (collected, recipe per arm, candidates' dir, live_s
    per arm, probe chats, windows)."""
    db = tmp / DB_FILE
    windows: list[Window] = []
    async with e2e.loopback_bot(env, tmp) as replies:
        collect = chats(COLLECT_CHATS, setup.collect_users)
        print(f"1. collect: {len(collect)} users x {setup.messages} messages", flush=True)
        collected = await users(replies, collect, setup, setup.seed)
        print(
            f"   {collected.replies} replies, {collected.questions} asked a question, "
            f"{collected.up} 👍 / {collected.down} 👎 ({collected.wall_s:.0f}s)",
            flush=True,
        )

        export = tmp / "feedback.txt"
        await bot_async(env, "admin", "export", "--format", "parlai", "-o", str(export))
        print(f"2. export (service running): {len(export.read_text().splitlines())} replies")

        out = tmp / "candidates"
        recipes: dict[str, dict[str, Any]] = {}
        print(f"3. fine-tune the control, {setup.minutes:g} minutes per arm (service running)")
        for arm, extra in ARMS.items():
            t0 = time.monotonic()
            recipe = recipes[arm] = await fine_tune(env, setup, export, out / arm, extra)
            ppl, guard = recipe["perplexity"], recipe.get("guard", {})
            print(
                f"   {arm} ({' '.join(extra) or 'defaults'}): {recipe['data']['train_examples']} "
                f"liked, {recipe['data'].get('negative_examples', 0)} disliked trained on, "
                f"{time.monotonic() - t0:.0f}s; held-out liked ppl "
                f"{ppl['heldout_feedback']['before'].get('ppl')} -> "
                f"{ppl['heldout_feedback']['after'].get('ppl')}; guard: distinct "
                f"{guard.get('candidate_distinct_share')} vs the base's "
                f"{guard.get('base_distinct_share')} -> {guard.get('verdict')}",
                flush=True,
            )

        probes: list[int] = []
        live_s: dict[str, float] = {}
        added_at = 0.0
        for arm in ARMS:
            if not recipes[arm].get("installed", True):
                print(f"4. {arm}: refused by the collapse guard, not added", flush=True)
                continue
            argv = add_argv(str(out / arm / "model"), name=arm)
            await bot_async(env, *argv)
            added_at = time.time()
            live_s[arm] = await wait_until_served(replies, db, added_at, setup, ON_ARM[arm], probes)
            print(
                f"4. `python -m bot {' '.join(argv)}`: the running service answered a new "
                f"chat with {arm} {live_s[arm]:.1f}s after the command returned "
                f"({len(probes)} probe chats so far)",
                flush=True,
            )
        if not live_s:
            raise RuntimeError("the collapse guard refused every candidate: nothing to compare")

        followed_s: dict[str, float] = {}
        runs: list[tuple[str, str | None, int]] = [("weighted", None, COMPARE_CHATS)]
        if setup.allocation == "thompson":
            runs.append(("thompson", "thompson", THOMPSON_CHATS))
        for label, allocation, group in runs:
            since = added_at
            if allocation is not None:
                await bot_async(env, *allocation_argv(allocation))
                since = time.time()
                followed_s[label] = await wait_until_served(
                    replies, db, since, setup, by_bandit, probes
                )
                print(
                    f"   `python -m bot {' '.join(allocation_argv(allocation))}`: a new chat "
                    f"was assigned by it {followed_s[label]:.1f}s after the command returned",
                    flush=True,
                )
            new = chats(group, setup.compare_users)
            print(f"5. compare ({label}): {len(new)} new users", flush=True)
            phase = await users(replies, new, setup, setup.seed + 1)
            copy = tmp / f"{label}.sqlite3"
            snapshot(db, copy)
            windows.append(Window(label, new, since, phase, copy, allocation or "weights"))
            windows[-1].followed_s = followed_s.get(label)
    return collected, recipes, out, live_s, len(probes), windows


def run(setup: Setup) -> dict[str, Any]:
    """Every step, one after the other; the figures."""
    started = time.monotonic()
    results: dict[str, Any] = {"setup": {k: str(v) for k, v in setup.__dict__.items()}}
    name = "loop-quick" if setup.quick else "loop"
    common.RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-loop-") as tmp_name:
        tmp = Path(tmp_name)
        common.corpus()
        seed_file = tmp / "variants.toml"
        variants_file(seed_file, setup.model)
        env = env_for(tmp, seed_file, setup.model, log_level=setup.log_level)
        collected, recipes, out, live_s, probes, windows = asyncio.run(serve_loop(setup, tmp, env))
        results["live_s"] = live_s
        results["probe_chats"] = probes
        for w in windows:
            keep_only_chats(w.copy, w.chats)
            n_chats = check_new(w.copy, w.since, w.by)
            plot = common.RESULTS_DIR / (
                f"{name}.png" if w.label == "weighted" else f"{name}-{w.label}.png"
            )
            distinct = distinct_shares(w.copy)
            figures = decide(env_for(tmp, seed_file, setup.model, w.copy), plot, w.copy)
            for arm in ARMS:
                if arm in figures:
                    figures[arm]["distinct_share"] = distinct.get(arm, 0.0)
                    figures[arm]["distinct_ratio"] = distinct.get(arm, 0.0) / max(
                        distinct.get(CONTROL, 0.0), 1e-9
                    )
            if not any(figures.get(arm, {}).get("chats") for arm in ARMS):
                raise RuntimeError(f"{w.label}: no new chat went to a candidate")
            results[w.label] = {
                "control_distinct_share": distinct.get(CONTROL, 0.0),
                **figures,
                "new_chats": n_chats,
                "recorded_shares": {arm: recorded_share(w.copy, arm) for arm in ARMS},
                "followed_s": w.followed_s,
                "replies": w.phase.replies,
                "wall_s": round(w.phase.wall_s),
            }
        results["collect"] = collected.__dict__
        results["recipes"] = {
            arm: {k: v for k, v in r.items() if k != "guard"}
            | {"guard": {k: v for k, v in r.get("guard", {}).items() if k != "replies"}}
            for arm, r in recipes.items()
        }
        results["wall_s"] = round(time.monotonic() - started)
        if setup.keep is not None:
            setup.keep.mkdir(parents=True, exist_ok=True)
            kept = [tmp / "feedback.txt", tmp / "bot.log"]
            for path in [*kept, *(w.copy for w in windows)]:
                if path.exists():
                    shutil.copyfile(path, setup.keep / path.name)
            for arm in ARMS:
                if (out / arm / "recipe.json").exists():
                    shutil.copyfile(out / arm / "recipe.json", setup.keep / f"{arm}-recipe.json")
    common.write_json(name, results)
    return results


# RESULT name prefix of each arm: the 👍+👎 candidate is the issue's `loop_*`.
PREFIX = {CANDIDATE: "loop", LIKES_ONLY: "loop_likes_only"}


def _span(interval: Sequence[float | None]) -> str:
    """A 0-1 interval in percent; the report gives none (null) below 5 chats with votes."""
    low, high = interval
    return "too few chats" if low is None or high is None else f"{100 * low:.1f}-{100 * high:.1f}"


def _pp(value: float | None) -> float:
    """A 0-1 figure of the report in percentage points (NaN where it gives none)."""
    return float("nan") if value is None else 100 * float(value)


def report(results: dict[str, Any]) -> None:
    """Tables and RESULT lines."""
    w = results["weighted"]
    arms = [arm for arm in ARMS if arm in w]
    rows = [
        (
            CONTROL,
            w["control_chats"],
            w["control_votes"],
            100 * w["control_up_rate"],
            _span(w["control_interval"]),
            "",
            "",
            100 * w["control_distinct_share"],
        )
    ]
    for arm in arms:
        a = w[arm]
        rows.append(
            (
                arm,
                a["chats"],
                a["votes"],
                100 * a["up_rate"],
                _span(a["interval"]),
                f"{a['lift_pp']:+.1f}",
                f"{a['always_valid_low_pp']:+.1f}",
                100 * a["distinct_share"],
            )
        )
    common.print_table(
        "👍 rate of new users: control, 👍+👎 candidate, 👍-only candidate (weight 1 each, "
        "added live)",
        ["variant", "chats", "votes", "👍 %", "95% interval", "lift pp", "always-valid low pp",
         "distinct %"],
        rows,
    )  # fmt: skip
    out: dict[str, float] = {
        "loop_control_up_rate": w["control_up_rate"],
        "loop_control_distinct_share": w["control_distinct_share"],
    }
    for arm in arms:
        a, name = w[arm], PREFIX[arm]
        guard = results["recipes"][arm].get("guard", {})
        out |= {
            f"{name}_uplift_pp": a["lift_pp"],
            f"{name}_always_valid_low_pp": a["always_valid_low_pp"],
            f"{name}_distinct_ratio": a["distinct_ratio"],
            f"{name}_always_valid_high_pp": a["always_valid_high_pp"],
            f"{name}_up_rate": a["up_rate"],
            f"{name}_always_valid_p": a["always_valid_p"],
            f"{name}_vote_diff_pp": a["vote_diff_pp"],
            f"{name}_p": a["p"],
            f"{name}_distinct_share": a["distinct_share"],
            f"{name}_chat_share": a["chat_share"],
            f"{name}_guard_distinct_ratio": float(guard.get("distinct_ratio", float("nan"))),
            f"{name}_live_s": float(results["live_s"].get(arm, float("nan"))),
        }
        for key, value in (a.get("guards") or {}).items():
            if isinstance(value, int | float):
                out[f"{name}_guard_{key}"] = float(value)
    for arm in ARMS:
        if arm not in arms:
            out[f"{PREFIX[arm]}_refused_by_guard"] = 1.0
    out["loop_wall_s"] = float(results["wall_s"])
    if "thompson" in results:
        t = results["thompson"]
        out["loop_thompson_followed_s"] = t["followed_s"]
        for arm in ARMS:
            if arm in t:
                name = PREFIX[arm].replace("loop", "loop_thompson")
                out[f"{name}_chat_share"] = t[arm]["chat_share"]
                out[f"{name}_uplift_pp"] = t[arm]["lift_pp"]
                out[f"{name}_always_valid_low_pp"] = t[arm]["always_valid_low_pp"]
                share = t["recorded_shares"].get(arm)
                if share is not None:
                    out[f"{name}_recorded_split"] = share
    common.emit_results(out)


def parse(argv: Sequence[str] | None = None) -> Setup:
    """The command line."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.loop",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few minutes")
    parser.add_argument("--model", default=str(SHIPPED), help="the control (default: shipped)")
    parser.add_argument("--collect-users", type=int, default=None)
    parser.add_argument("--compare-users", type=int, default=None, help="per comparison")
    parser.add_argument("--messages", type=int, default=None, help="per user")
    parser.add_argument("--minutes", type=float, default=None, help="fine-tuning budget")
    parser.add_argument("--noise", type=float, default=0.1, help="share of votes flipped")
    parser.add_argument(
        "--allocation",
        choices=("weighted", "thompson"),
        default="weighted",
        help="thompson: after the weighted comparison, `admin variants allocation thompson` "
        "and one more set of new users",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--wait-s", type=float, default=300.0)
    parser.add_argument(
        "--keep",
        type=Path,
        default=None,
        help="keep the export, the log and the new-chats snapshots here",
    )
    parser.add_argument(
        "--log-level", default="WARNING", help="the service's (INFO shows when it follows)"
    )
    a = parser.parse_args(argv)
    quick = bool(a.quick)
    return Setup(
        model=a.model,
        collect_users=a.collect_users or (16 if quick else 80),
        compare_users=a.compare_users or (16 if quick else 80),
        messages=a.messages or (5 if quick else 8),
        minutes=a.minutes or (1.0 if quick else 8.0),
        noise=a.noise,
        allocation=a.allocation,
        seed=a.seed,
        wait_s=a.wait_s,
        quick=quick,
        keep=a.keep,
        log_level=a.log_level,
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Run the loop and report it."""
    missing = e2e.missing_parts()
    if missing:
        raise SystemExit(f"bench.loop: {missing}")
    os.environ.setdefault("PYTHONHASHSEED", "0")
    report(run(parse(argv)))


if __name__ == "__main__":
    main()
