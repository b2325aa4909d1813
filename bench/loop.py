"""The learning loop, end to end, on simulated users whose preference we know.

    python -m bench.loop [--quick] [--allocation thompson]

1. Collect: `python -m bot run` serves the control (the shipped model by default) against the
   loopback Bot API, with a real SQLite database. Simulated users set a persona, chat, and press
   👍 under a reply that asks a question back (it contains "?") and 👎 under any other, each
   vote flipped with probability `--noise` (seeded per chat and turn).
2. Export: `python -m bot admin export --format parlai`.
3. Fine-tune: `python -m bot train --from-feedback ... --base CONTROL --minutes N`.
4. Compare: the service restarts with a variants file of the control and the candidate at
   weight 1 each (the candidate gets half of the new chats), on a fresh database, so that the
   comparison counts only new users; a fresh set of users chats with both, with the same
   preference. The service's variants are read from the file at start, so the bench restarts
   the service between phases rather than adding the candidate while it runs.
5. Decide: `python -m bot admin variants --json` (the two-proportion z-test of the 👍 rates) and
   `--plot` (the rates with their 95% intervals).

With `--allocation thompson` step 4 runs once more with `allocation = "thompson"` in the
variants file, and the share of new chats the candidate got is printed; a checkout whose
variants file does not know the key stops at once with the configuration's own message.

Output: `RESULT loop_*` lines, bench/results/loop.json and loop.png (loop-quick.* for
`--quick`, a smoke run of a few minutes whose p-value means little).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import common, e2e

EXPERIMENT = "bench-loop"
CONTROL, CANDIDATE = "control", "candidate"
SHIPPED = common.ROOT / "models" / "chitchat" / "model"


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


@dataclass
class Phase:
    """What the simulated users of one bot run saw and did."""

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
        await e2e.wait_until(lambda q=query: q in api.callback_answers, setup.wait_s, "a vote")
        phase.up += liked
        phase.down += not liked


async def chat_phase(
    env: Mapping[str, str], tmp: Path, chats: Sequence[int], setup: Setup, seed: int
) -> Phase:
    """Start the bot, let `chats` talk and vote, stop it (its database is then complete)."""
    phase = Phase()
    started = time.monotonic()
    async with e2e.loopback_bot(env, tmp) as replies:
        await asyncio.gather(
            *(
                _user(replies, chat, chat, setup, phase, random.Random(seed * 1_000_003 + chat))
                for chat in chats
            )
        )
    phase.wall_s = time.monotonic() - started
    if phase.errors:
        raise RuntimeError("simulated users got no answer: " + "; ".join(phase.errors[:5]))
    return phase


def variants_file(path: Path, models: Mapping[str, str], allocation: str | None = None) -> None:
    """Control first (and marked), each variant at weight 1."""
    quoted = json.dumps  # a JSON string is a valid TOML basic string
    lines = [f"experiment = {quoted(EXPERIMENT)}"]
    if allocation is not None:
        lines.append(f"allocation = {quoted(allocation)}")
    for name, model in models.items():
        lines += ["", "[[variants]]", f"name = {quoted(name)}", f"model = {quoted(model)}"]
        lines += ["weight = 1", *(["control = true"] if name == CONTROL else [])]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


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


def env_for(tmp: Path, db: str, variants: Path, model: str) -> dict[str, str]:
    """The service's environment: a real database file, the variants file, one thread each
    (2 shared cores), no flood gate in the way of the simulated users."""
    env = e2e.bot_env(
        tmp,
        model,
        extra={
            "VARIANTS_FILE": str(variants),
            "DATABASE_URL": f"sqlite+aiosqlite:///{tmp / db}",
            "TORCH_THREADS": "1",
            "WORKER_THREADS": "1",
            "FLOOD_MAX_MESSAGES": "1000",
        },
    )
    return env


def check_allocation(tmp: Path, allocation: str, model: str) -> None:
    """Stop at once if this checkout's variants file refuses `allocation`."""
    path = tmp / "check.toml"
    variants_file(path, {CONTROL: model, CANDIDATE: model}, allocation)
    env = env_for(tmp, "check.sqlite3", path, model)
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "from bot.config import Settings; from bot.engine.variants "
            "import load_experiment; load_experiment(Settings())",
        ],
        cwd=common.ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise SystemExit(
            f'bench.loop: the variants file refuses allocation = "{allocation}" on this '
            f"checkout ({last}); it needs the Thompson allocation work merged"
        )


def decide(env: Mapping[str, str], plot: Path | None) -> dict[str, Any]:
    """`admin variants --json` (and `--plot`): the control and the candidate, compared."""
    report = json.loads(
        bot(env, "admin", "variants", "--json", *(["--plot", str(plot)] if plot else []))
    )
    figures = {v["name"]: v for v in report["variants"]}
    comparison = next(c for c in report["comparisons"] if c["variant"] == CANDIDATE)
    control, candidate = figures[CONTROL], figures[CANDIDATE]
    return {
        "control_up_rate": control["up_rate"],
        "control_interval": [control["up_low"], control["up_high"]],
        "control_votes": control["votes_up"] + control["votes_down"],
        "candidate_up_rate": candidate["up_rate"],
        "candidate_interval": [candidate["up_low"], candidate["up_high"]],
        "candidate_votes": candidate["votes_up"] + candidate["votes_down"],
        "uplift_pp": 100 * comparison["up_rate_diff"],
        "p": comparison["p_value"],
        "candidate_chat_share": candidate["chats"] / max(1, control["chats"] + candidate["chats"]),
    }


def distinct_shares(db: Path) -> dict[str, float]:
    """Per variant, distinct replies / replies: a candidate that learnt one question and asks
    it every time would win the vote and fail its users."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT variant, count(DISTINCT text) * 1.0 / count(*) FROM messages "
            "WHERE role = 'bot' GROUP BY variant"
        ).fetchall()
    return {str(name): float(share) for name, share in rows}


def run(setup: Setup) -> dict[str, Any]:
    """Every step, one after the other; the figures."""
    started = time.monotonic()
    results: dict[str, Any] = {"setup": {k: str(v) for k, v in setup.__dict__.items()}}
    with tempfile.TemporaryDirectory(prefix="bench-loop-") as tmp_name:
        tmp = Path(tmp_name)
        if setup.allocation == "thompson":
            check_allocation(tmp, "thompson", setup.model)
        common.corpus()
        one = tmp / "control.toml"
        variants_file(one, {CONTROL: setup.model})
        env = env_for(tmp, "collect.sqlite3", one, setup.model)
        collect_chats = [e2e.FIRST_CHAT + u for u in range(setup.collect_users)]
        print(f"1. collect: {len(collect_chats)} users x {setup.messages} messages", flush=True)
        collected = asyncio.run(chat_phase(env, tmp, collect_chats, setup, setup.seed))
        print(
            f"   {collected.replies} replies, {collected.questions} asked a question, "
            f"{collected.up} 👍 / {collected.down} 👎 ({collected.wall_s:.0f}s)",
            flush=True,
        )

        export = tmp / "feedback.txt"
        bot(env, "admin", "export", "--format", "parlai", "-o", str(export))
        print(f"2. export: {len(export.read_text().splitlines())} replies", flush=True)

        out = tmp / "candidate"
        t0 = time.monotonic()
        print(f"3. fine-tune the control for {setup.minutes:g} minutes", flush=True)
        bot(
            env,
            "train",
            "--from-feedback",
            str(export),
            "--base",
            setup.model,
            "--out",
            str(out),
            "--minutes",
            str(setup.minutes),
        )
        recipe = json.loads((out / "recipe.json").read_text())
        train_s = time.monotonic() - t0
        ppl = recipe["perplexity"]
        print(
            f"   {recipe['data']['train_examples']} liked replies, {train_s:.0f}s; held-out "
            f"liked ppl {ppl['heldout_feedback']['before'].get('ppl')} -> "
            f"{ppl['heldout_feedback']['after'].get('ppl')}",
            flush=True,
        )
        models = {CONTROL: setup.model, CANDIDATE: str(out / "model")}
        compare_chats = [e2e.FIRST_CHAT + 10_000 + u for u in range(setup.compare_users)]
        name = "loop-quick" if setup.quick else "loop"
        common.RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        runs = [("weighted", None)] + (
            [("thompson", "thompson")] if setup.allocation == "thompson" else []
        )
        for label, allocation in runs:
            both = tmp / f"{label}.toml"
            variants_file(both, models, allocation)
            env2 = env_for(tmp, f"{label}.sqlite3", both, setup.model)
            print(f"4. compare ({label}): {len(compare_chats)} new users", flush=True)
            phase = asyncio.run(chat_phase(env2, tmp, compare_chats, setup, setup.seed + 1))
            plot = common.RESULTS_DIR / (
                f"{name}.png" if label == "weighted" else f"{name}-{label}.png"
            )
            distinct = distinct_shares(tmp / f"{label}.sqlite3")
            results[label] = {
                "control_distinct_share": distinct.get(CONTROL, 0.0),
                "candidate_distinct_share": distinct.get(CANDIDATE, 0.0),
                **decide(env2, plot),
                "replies": phase.replies,
                "wall_s": round(phase.wall_s),
            }
        results["collect"] = collected.__dict__
        results["recipe"] = recipe
        results["wall_s"] = round(time.monotonic() - started)
        if setup.keep is not None:
            setup.keep.mkdir(parents=True, exist_ok=True)
            for path in (export, out / "recipe.json", tmp / "bot.log"):
                if path.exists():
                    shutil.copyfile(path, setup.keep / path.name)
    common.write_json(name, results)
    return results


def report(results: dict[str, Any]) -> None:
    """Tables and RESULT lines."""
    w = results["weighted"]
    rows = [
        (
            CONTROL,
            w["control_votes"],
            100 * w["control_up_rate"],
            f"{100 * w['control_interval'][0]:.1f}-{100 * w['control_interval'][1]:.1f}",
        ),
        (
            CANDIDATE,
            w["candidate_votes"],
            100 * w["candidate_up_rate"],
            f"{100 * w['candidate_interval'][0]:.1f}-{100 * w['candidate_interval'][1]:.1f}",
        ),
    ]
    common.print_table(
        "👍 rate of new users, control vs candidate (50/50)",
        ["variant", "votes", "👍 %", "95% interval"],
        rows,
    )
    out = {
        "loop_control_up_rate": w["control_up_rate"],
        "loop_candidate_up_rate": w["candidate_up_rate"],
        "loop_uplift_pp": w["uplift_pp"],
        "loop_p": w["p"],
    }
    print("RESULT " + " ".join(f"{k}={v:.4g}" for k, v in out.items()), flush=True)
    extra = {
        "loop_wall_s": float(results["wall_s"]),
        "loop_control_distinct_share": w["control_distinct_share"],
        "loop_candidate_distinct_share": w["candidate_distinct_share"],
    }
    if "thompson" in results:
        t = results["thompson"]
        extra["loop_thompson_candidate_share"] = t["candidate_chat_share"]
        extra["loop_thompson_uplift_pp"] = t["uplift_pp"]
        extra["loop_thompson_p"] = t["p"]
    common.emit_results(extra)


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
    parser.add_argument("--compare-users", type=int, default=None)
    parser.add_argument("--messages", type=int, default=None, help="per user")
    parser.add_argument("--minutes", type=float, default=None, help="fine-tuning budget")
    parser.add_argument("--noise", type=float, default=0.1, help="share of votes flipped")
    parser.add_argument(
        "--allocation",
        choices=("weighted", "thompson"),
        default="weighted",
        help='thompson: compare once more with allocation = "thompson"',
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--wait-s", type=float, default=300.0)
    parser.add_argument("--keep", type=Path, default=None, help="keep the export and logs here")
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
