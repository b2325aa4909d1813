"""Beam search: ParlAI's own vs our batched one (bot/inference/fastgen.py), side by side.

    python -m bench.search --users 32 [--reps 3] [--threads 2] [--profile] [--quick]

One shared agent on the BlenderBot-90M-architecture model (bench/common.py), loaded the way the
service loads it. For each beam size (10 and 1) and batch size (`--users` chats and one chat),
the same observations (persona + a 6-message history + a new message per chat, built like the
service's cache builds them) go through `batch_act` with ParlAI's search and with ours, in
alternation, `--reps` times; the figure is the best run, the spread is (worst - best) / best.
Replies are fixed-length (beam_min_length = label_truncate = 20 tokens) so runs compare, and the
two searches' replies are compared too (they must be identical).

`--profile` adds a torch.profiler breakdown of one batch of our search at the largest setting.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from bench import common

HISTORY_MESSAGES = 6


def configure(agent: Any, beam: int) -> None:
    """Beam search with `beam` hypotheses and fixed-length replies, on a loaded agent."""
    agent.opt["inference"] = "beam"
    agent.opt["beam_size"] = beam
    agent.beam_size = beam
    agent.opt["beam_min_length"] = agent.label_truncate
    agent.beam_min_length = agent.label_truncate


def observations(agent: Any, users: int) -> list[Any]:
    """One observed message per chat, each in its own clone with its own persona and history."""
    from parlai.core.message import Message

    from bot.inference.cache import AgentCache

    cache = AgentCache(agent, capacity=users + 1)
    out = []
    for user in range(users):
        entry = cache.rebuild(
            user, common.persona(user), common.conversation(user, HISTORY_MESSAGES)
        )
        msg = Message({"text": common.user_message(user), "episode_done": False})
        out.append(entry.clone.observe(msg))
    return out


def timed_batch(agent: Any, users: int, fast: bool) -> tuple[float, list[str], int]:
    """Seconds for one batch_act over `users` chats; the replies; the longest model input."""
    obs = observations(agent, users)
    agent.fast_search = fast
    started = time.perf_counter()
    replies = agent.batch_act(obs)
    elapsed = time.perf_counter() - started
    longest = max(len(o["text_vec"]) for o in obs)
    return elapsed, [str(r.get("text", "")) for r in replies], longest


def measure(agent: Any, beam: int, users: int, reps: int) -> dict[str, Any]:
    """Both searches on the same inputs, alternating; best time and spread of each."""
    configure(agent, beam)
    times: dict[str, list[float]] = {"parlai": [], "fast": []}
    same = True
    longest = 0
    for _ in range(reps):
        replies = {}
        for name in ("parlai", "fast"):
            seconds, replies[name], longest = timed_batch(agent, users, name == "fast")
            times[name].append(seconds)
        same = same and replies["parlai"] == replies["fast"]
    row: dict[str, Any] = {"beam": beam, "users": users, "same_replies": same, "input": longest}
    for name, values in times.items():
        best = min(values)
        row[f"{name}_s"] = best
        row[f"{name}_rps"] = users / best
        row[f"{name}_spread"] = (max(values) - best) / best
        row[f"{name}_all_s"] = values
    row["speedup"] = row["parlai_s"] / row["fast_s"]
    return row


def profile(agent: Any, beam: int, users: int) -> list[tuple[str, float, float]]:
    """Top operators (name, self CPU seconds, share) of one batch of our search."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    configure(agent, beam)
    obs = observations(agent, users)
    agent.fast_search = True
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        started = time.perf_counter()
        agent.batch_act(obs)
        wall = time.perf_counter() - started
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    out = [(e.key, e.self_cpu_time_total / 1e6, 0.0) for e in events[:14]]
    total = sum(e.self_cpu_time_total for e in events) / 1e6
    out = [(name, secs, secs / total) for name, secs, _ in out]
    out.append(("(all operators)", total, 1.0))
    out.append(("(wall, profiled)", wall, wall / total))
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the comparison and print the table and RESULT lines."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=32, help="chats in the big batch")
    parser.add_argument("--reps", type=int, default=3, help="runs per search and setting")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--profile", action="store_true", help="profile our search once")
    parser.add_argument("--quick", action="store_true", help="8 chats, one run each (< 60 s)")
    args = parser.parse_args(argv)
    users, reps = (8, 1) if args.quick else (args.users, args.reps)

    model_file = common.build_bench_model()
    started = time.perf_counter()
    agent = common.load_agent(model_file, threads=args.threads)
    from bot.inference import fastgen

    if not fastgen.is_accelerated(agent):
        # SEARCH_IMPL=parlai in the environment, or an older model loader
        agent = fastgen.accelerate(agent)
    print(
        f"model loaded in {time.perf_counter() - started:.1f} s; "
        f"replies of {agent.label_truncate} tokens; machine {common.machine()}",
        flush=True,
    )
    observations(agent, 1)  # warm-up: first-use costs are not search costs
    configure(agent, 1)
    timed_batch(agent, 1, True)

    rows = []
    for beam in (10, 1):
        for n in dict.fromkeys((users, 1)):
            row = measure(agent, beam, n, reps)
            rows.append(row)
            print(
                f"beam {beam:2d}, {n:2d} chats: ParlAI {row['parlai_s']:.2f} s, "
                f"ours {row['fast_s']:.2f} s, x{row['speedup']:.2f}",
                flush=True,
            )
    common.print_table(
        f"Beam search, BlenderBot-90M architecture, {args.threads} threads, "
        f"best of {reps} (spread = worst/best - 1)",
        [
            "beam",
            "chats",
            "ParlAI s",
            "ParlAI replies/s",
            "spread",
            "ours s",
            "ours replies/s",
            "spread",
            "speedup",
            "same replies",
        ],
        [
            (
                r["beam"],
                r["users"],
                r["parlai_s"],
                r["parlai_rps"],
                f"{r['parlai_spread']:.0%}",
                r["fast_s"],
                r["fast_rps"],
                f"{r['fast_spread']:.0%}",
                f"x{r['speedup']:.2f}",
                "yes" if r["same_replies"] else "NO",
            )
            for r in rows
        ],
    )
    breakdown = None
    if args.profile:
        breakdown = profile(agent, 10, users)
        common.print_table(
            f"Where our search spends its time (beam 10, {users} chats, torch.profiler)",
            ["operator", "self CPU s", "share"],
            [(name, secs, f"{share:.0%}") for name, secs, share in breakdown],
        )
    results: dict[str, float] = {}
    for r in rows:
        key = f"beam{r['beam']}_{r['users']}"
        results[f"fast_speedup_{key}"] = r["speedup"]
        results[f"fast_rps_{key}"] = r["fast_rps"]
        results[f"parlai_rps_{key}"] = r["parlai_rps"]
    results["fast_same_replies"] = float(all(r["same_replies"] for r in rows))
    common.write_json(
        "search" if not args.quick else "search-quick",
        {"threads": args.threads, "reps": reps, "rows": rows, "profile": breakdown},
    )
    common.emit_results(results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
