"""Memory: what one more conversation costs, cached clone vs a model per user.

    python -m bench.memory --sessions 10000 [--users 3] [--quick]

Each figure is measured in its own fresh process (psutil RSS, after gc.collect() and
malloc_trim(0)): first the shared agent is loaded (the service does that once), then
  * sessions: N conversations are built the way the service builds them on a cache miss
    (AgentCache.rebuild: a clone of the shared agent, a persona, a 10-message history);
  * per-user models: a fresh create_agent for each of `--users` users (the naive way).
Both figures are marginal: RSS after minus RSS before, divided by the count.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from bench import common


def _fresh(text: str) -> str:
    # A new string object, as a database row would give; the corpus strings are shared.
    return text.encode().decode()


def worker_sessions(model_file: str, n: int, history: int) -> dict[str, Any]:
    """In a fresh process: RSS added by `n` cached conversations."""
    from bot.inference.cache import AgentCache

    agent = common.load_agent(model_file)
    cache = AgentCache(agent, capacity=n + 1)
    # warm-up: lazy imports and first-use caches are not per-session costs
    cache.rebuild(-1, common.persona(0), common.conversation(0, history))
    cache.evict(-1)
    common.corpus()
    common.settle()
    model_rss = common.rss_bytes()
    before = common.rss_bytes()
    checkpoints: list[tuple[int, int]] = [(0, 0)]
    step = max(n // 10, 1)
    started = time.perf_counter()
    for i in range(n):
        turns = [(role, _fresh(text)) for role, text in common.conversation(i, history)]
        cache.rebuild(i, _fresh(common.persona(i)), turns)
        if (i + 1) % step == 0 or i + 1 == n:
            common.settle()
            checkpoints.append((i + 1, common.rss_bytes() - before))
    elapsed = time.perf_counter() - started
    common.settle()
    after = common.rss_bytes()
    assert len(cache) == n
    return {
        "sessions": n,
        "history_messages": history,
        "rss_with_model_mb": model_rss / 2**20,
        "rss_before": before,
        "rss_after": after,
        "kb_per_session": (after - before) / n / 1024,
        "build_s": elapsed,
        "checkpoints": checkpoints,
    }


def worker_models(model_file: str, n: int) -> dict[str, Any]:
    """In a fresh process: RSS added by `n` more fresh agents (one per user)."""
    from bot.inference import compat

    compat.apply()
    agents = [common.load_agent(model_file)]  # the first load pays one-time costs
    common.settle()
    steps = [common.rss_bytes()]
    for _ in range(n):
        agents.append(common.load_agent(model_file))
        common.settle()
        steps.append(common.rss_bytes())
    return {
        "users": n,
        "rss_first_model_mb": steps[0] / 2**20,
        "rss_steps_mb": [s / 2**20 for s in steps],
        "mb_per_user_model": (steps[-1] - steps[0]) / n / 2**20,
        "params": sum(p.numel() for p in agents[0].model.parameters()),
    }


def main() -> None:
    """Measure both, print the table, RESULT lines, JSON and PNG."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--users", type=int, default=3)
    parser.add_argument("--history", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="1,000 sessions, 1 user model")
    parser.add_argument("--worker", choices=["sessions", "models"], help=argparse.SUPPRESS)
    parser.add_argument("--model-file", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker == "sessions":
        common.worker_reply(worker_sessions(args.model_file, args.sessions, args.history))
        return
    if args.worker == "models":
        common.worker_reply(worker_models(args.model_file, args.users))
        return

    if args.quick:
        args.sessions, args.users = min(args.sessions, 1000), 1
    model_file = common.build_bench_model()
    print(
        f"memory: {args.sessions:,} cached sessions vs {args.users} per-user models "
        "(each in a fresh process)",
        flush=True,
    )
    sess = common.run_worker(
        "bench.memory",
        [
            *("--worker", "sessions", "--model-file", model_file),
            *("--sessions", str(args.sessions), "--history", str(args.history)),
        ],
    )
    models = common.run_worker(
        "bench.memory",
        ["--worker", "models", "--model-file", model_file, "--users", str(args.users)],
    )
    kb = float(sess["kb_per_session"])
    mb = float(models["mb_per_user_model"])
    per_16gb_sessions = 16 * 2**20 / kb
    per_16gb_models = 16 * 1024 / mb
    common.print_table(
        "Memory per conversation (RSS added, marginal)",
        ["approach", "measured over", "per conversation", "per 16 GB (beyond the model)"],
        [
            (
                "cached clone (service)",
                f"{args.sessions:,} sessions",
                f"{kb:.1f} KB",
                f"{per_16gb_sessions:,.0f}",
            ),
            (
                "model per user (naive)",
                f"{args.users} user" + "s" * (args.users != 1),
                f"{mb:.0f} MB",
                f"{per_16gb_models:,.0f}",
            ),
        ],
    )
    print(
        f"shared model process RSS: {sess['rss_with_model_mb']:.0f} MB "
        f"({models['params'] / 1e6:.1f} M parameters); "
        f"{args.sessions:,} sessions built in {sess['build_s']:.1f} s; "
        f"one model per user costs {mb * 1024 / kb:,.0f}x a cached session"
    )
    common.write_json(
        "memory",
        {
            "sessions": sess,
            "models": models,
            "kb_per_session": kb,
            "mb_per_user_model": mb,
            "quick": args.quick,
        },
    )
    fig, axes = common.new_figure(ncols=2, width=5.5)
    xs = [c[0] for c in sess["checkpoints"]]
    ys = [c[1] / 2**20 for c in sess["checkpoints"]]
    axes[0][0].plot(xs, ys, marker="o", label="cached clones (service)")
    users = list(range(len(models["rss_steps_mb"])))
    model_mb = [s - models["rss_steps_mb"][0] for s in models["rss_steps_mb"]]
    axes[0][0].set_xlabel("cached conversations")
    axes[0][0].set_ylabel("RSS added (MB)")
    axes[0][0].set_title(f"{kb:.1f} KB per cached conversation")
    axes[0][0].grid(alpha=0.3)
    axes[0][1].plot(users, model_mb, marker="o", color="tab:red", label="model per user")
    axes[0][1].set_xticks(users)
    axes[0][1].set_xlabel("users (one model each)")
    axes[0][1].set_ylabel("RSS added (MB)")
    axes[0][1].set_title(f"{mb:.0f} MB per user model")
    axes[0][1].grid(alpha=0.3)
    common.save_figure("memory", fig)
    common.emit_results({"kb_per_session": kb, "mb_per_user_model": mb})


if __name__ == "__main__":
    main()
