"""Throughput: replies per second for N concurrent users, three ways, on one machine.

    python -m bench.throughput --users 1,4,8,16,32,64 [--quick]

The model has BlenderBot-90M's architecture (random weights, see bench.common) and every reply
is exactly 20 tokens long (beam_min_length == label_truncate), so runs compare. Every user has
a persona, a 10-message history and one new message; all three ways get the same ones:

  one-at-a-time  one agent; per request: reset(), replay the user's history through
                 observe()/self_observe(), observe the new message, act()
  pool           a multiprocessing pool, one worker process (1 torch thread) per core, each
                 holding its own copy of the model and doing one-at-a-time
  stock          one-at-a-time on stock ParlAI (its own tree search instead of the service's
                 batched one, bot/inference/fastgen.py), measured once per decoding
  batcher        the service: bot.inference.batcher.Batcher + bot.inference.cache.AgentCache, all
                 users asking at once (their clones are cached and reset to the same history
                 before each round, outside the timing), with our batched beam search
  batcher-parlai the same batcher with ParlAI's own search (SEARCH_IMPL=parlai), at 32 users

One-at-a-time and the pool serve requests in order until a time budget is spent (their rate does
not depend on how many users wait); the batcher runs whole rounds (every user once).
Decoding: ParlAI's Blender settings (beam 10, beam_block_ngram 3, beam_context_block_ngram 3)
and greedy; optionally with int8 dynamic quantization of the linear layers.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import multiprocessing
import os
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from bench import common

HISTORY = 10


@dataclass
class Point:
    """One measured configuration."""

    decoding: str
    way: str
    users: int
    replies: int
    seconds: float
    quantized: bool = False
    batch_sizes: dict[int, int] | None = None

    @property
    def rate(self) -> float:
        """Replies per second."""
        return self.replies / self.seconds if self.seconds else 0.0


def decoding_options(decoding: str) -> dict[str, Any]:
    """ParlAI generation options for `beam` (Blender's) or `greedy`."""
    return dict(common.BLENDER_BEAM if decoding == "beam" else common.GREEDY)


# --- one at a time (also what each pool worker does) ----------------------------------------


def serve_one(agent: Any, user: int) -> str:
    """The naive way: reset, replay the user's history, reply to the new message."""
    from parlai.core.message import Message

    from bot.persona import join_turns, persona_lines

    agent.reset()
    head = "\n".join(persona_lines(common.persona(user)))
    for role, text in join_turns(common.conversation(user, HISTORY)):
        if role == "user":
            if head:
                text, head = f"{head}\n{text}", ""
            agent.observe(Message({"text": text, "episode_done": False}))
        else:
            agent.self_observe(Message({"text": text, "episode_done": False}))
    agent.observe(Message({"text": common.user_message(user), "episode_done": False}))
    reply = agent.act()
    return str(reply.get("text", ""))


def one_at_a_time(agent: Any, users: int, budget_s: float) -> tuple[int, float]:
    """Serve users in order until the budget is spent; (replies, seconds)."""
    started = time.perf_counter()
    done = 0
    while True:
        serve_one(agent, done % users)
        done += 1
        elapsed = time.perf_counter() - started
        if elapsed >= budget_s:
            return done, elapsed


# --- pool ------------------------------------------------------------------------------------

_worker_agent: Any = None


def _pool_init(model_file: str, decoding: str, quantize: bool) -> None:
    global _worker_agent
    _worker_agent = common.load_agent(
        model_file, decoding_options(decoding), threads=1, quantize=quantize
    )


def _pool_serve(user: int) -> tuple[int, int]:
    serve_one(_worker_agent, user)
    return os.getpid(), common.rss_bytes()


def _pool_warm(_: int) -> int:
    serve_one(_worker_agent, 0)
    time.sleep(0.5)  # so that every worker gets one warm-up task
    return os.getpid()


class Pool:
    """One worker process per core, each with its own model."""

    def __init__(self, model_file: str, decoding: str, quantize: bool, workers: int) -> None:
        self.workers = workers
        ctx = multiprocessing.get_context("spawn")
        self.pool = ctx.Pool(workers, _pool_init, (model_file, decoding, quantize))
        self.pids = set(self.pool.map(_pool_warm, range(workers), chunksize=1))

    def run(self, users: int, budget_s: float) -> tuple[int, float]:
        """Keep min(workers, users) requests in flight (a user waits for its own reply)."""
        window = min(self.workers, users)
        started = time.perf_counter()
        pending: list[Any] = []
        submitted = done = 0
        last = started
        while True:
            while len(pending) < window and time.perf_counter() - started < budget_s:
                pending.append(self.pool.apply_async(_pool_serve, (submitted % users,)))
                submitted += 1
            if not pending:
                return done, last - started
            ready = [p for p in pending if p.ready()]
            if not ready:
                time.sleep(0.002)
                continue
            for p in ready:
                p.get()
                pending.remove(p)
                done += 1
                last = time.perf_counter()

    def memory_mb(self) -> tuple[float, float]:
        """Total RSS and USS (unique: what exiting would free) of the workers, in MB."""
        rss = sum(common.rss_bytes(pid) for pid in self.pids) / 2**20
        uss = sum(common.uss_bytes(pid) for pid in self.pids) / 2**20
        return rss, uss

    def close(self) -> None:
        """Stop the workers."""
        self.pool.terminate()
        self.pool.join()


# --- the service's batcher -------------------------------------------------------------------


async def batched(
    agent: Any, users: int, budget_s: float, max_size: int, max_wait_ms: int
) -> tuple[int, float, Counter[int]]:
    """All users ask at once, round after round, until the budget is spent."""
    from bot.inference.batcher import Batcher
    from bot.inference.cache import AgentCache
    from bot.persona import join_turns

    cache = AgentCache(agent, capacity=users + 1)
    histories = [join_turns(common.conversation(u, HISTORY)) for u in range(users)]
    entries = [cache.rebuild(u, common.persona(u), histories[u]) for u in range(users)]
    messages = [common.user_message(u) for u in range(users)]
    batcher = Batcher(agent, max_size=max_size, max_wait_ms=max_wait_ms)
    await batcher.start()
    spent = 0.0
    done = 0
    try:
        while True:
            for entry, history in zip(entries, histories, strict=True):
                entry.clone.history.fill(history)  # same input every round, not timed
            started = time.perf_counter()
            await asyncio.gather(
                *(batcher.generate(e.clone, m) for e, m in zip(entries, messages, strict=True))
            )
            spent += time.perf_counter() - started
            done += users
            if spent >= budget_s:
                break
    finally:
        await batcher.close()
    return done, spent, batcher.stats.sizes


def warm(agent: Any) -> None:
    """First calls pay lazy initialisation; keep it out of every figure."""
    serve_one(agent, 0)
    asyncio.run(batched(agent, 2, 0.0, 2, 0))


# --- main ------------------------------------------------------------------------------------


def times(a: float, b: float) -> str:
    """`a / b` as a speedup cell, `-` where either was not measured."""
    ratio = a / b if b else float("nan")
    return "-" if math.isnan(ratio) else f"{ratio:.1f}x"


def measure(
    model_file: str,
    decoding: str,
    users_list: list[int],
    budget_s: float,
    args: argparse.Namespace,
    *,
    quantize: bool = False,
    ways: tuple[str, ...] = ("one-at-a-time", "pool", "batcher", "stock"),
) -> tuple[list[Point], dict[str, float]]:
    """Every way for every user count under one decoding setting."""
    points: list[Point] = []
    memory: dict[str, float] = {}
    label = decoding + (" int8" if quantize else "")
    agent = common.load_agent(
        model_file, decoding_options(decoding), threads=args.threads, quantize=quantize
    )
    warm(agent)
    common.settle()
    memory["process_rss_mb"] = common.rss_bytes() / 2**20
    for users in users_list:
        if "one-at-a-time" in ways:
            n, secs = one_at_a_time(agent, users, budget_s)
            points.append(Point(decoding, "one-at-a-time", users, n, secs, quantize))
            print(f"  {label:11s} {users:3d} users  one-at-a-time {n / secs:7.2f}/s", flush=True)
        if "batcher" in ways:
            n, secs, sizes = asyncio.run(
                batched(agent, users, budget_s, args.batch_max_size, args.batch_max_wait_ms)
            )
            points.append(Point(decoding, "batcher", users, n, secs, quantize, dict(sizes)))
            print(f"  {label:11s} {users:3d} users  batcher       {n / secs:7.2f}/s", flush=True)
    del agent
    common.settle()
    if "stock" in ways:
        # The same one-at-a-time loop on stock ParlAI (its own tree search, no fastgen).
        stock = common.load_agent(
            model_file, decoding_options(decoding), threads=args.threads, search_impl="parlai"
        )
        serve_one(stock, 0)
        users = max(users_list)
        n, secs = one_at_a_time(stock, users, budget_s)
        points.append(Point(decoding, "stock", users, n, secs, quantize))
        print(f"  {label:11s} {users:3d} users  stock ParlAI  {n / secs:7.2f}/s", flush=True)
        # The service's batcher with ParlAI's own search (SEARCH_IMPL=parlai), for issue 8's
        # side-by-side: same batches, only the search differs.
        top = 32 if 32 in users_list else max(users_list)
        n, secs, sizes = asyncio.run(
            batched(stock, top, budget_s, args.batch_max_size, args.batch_max_wait_ms)
        )
        points.append(Point(decoding, "batcher-parlai", top, n, secs, quantize, dict(sizes)))
        print(f"  {label:11s} {top:3d} users  batcher, ParlAI search {n / secs:7.2f}/s", flush=True)
        del stock
        common.settle()
    if "pool" in ways:
        pool = Pool(model_file, decoding, quantize, args.workers)
        try:
            for users in users_list:
                n, secs = pool.run(users, budget_s)
                points.append(Point(decoding, "pool", users, n, secs, quantize))
                print(
                    f"  {label:11s} {users:3d} users  pool          {n / secs:7.2f}/s", flush=True
                )
            memory["pool_rss_mb"], memory["pool_uss_mb"] = pool.memory_mb()
        finally:
            pool.close()
    return points, memory


def main() -> None:
    """Measure, print the table, RESULT lines, JSON and PNG."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", default="1,4,8,16,32,64")
    parser.add_argument("--decoding", default="beam,greedy")
    parser.add_argument("--budget", type=float, default=12.0, help="seconds per point (at least)")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads for one-at-a-time and the batcher (default: torch's, one per core; "
        "use 1 on a machine that is busy with other work, where more threads thrash)",
    )
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--model-file",
        default=None,
        help="measure this ParlAI model instead of the BlenderBot-90M-architecture one",
    )
    parser.add_argument("--batch-max-size", type=int, default=None)
    parser.add_argument("--batch-max-wait-ms", type=int, default=None)
    parser.add_argument(
        "--quantize-users", type=int, default=32, help="int8 comparison at this many users (0: off)"
    )
    parser.add_argument(
        "--ways",
        default="one-at-a-time,pool,batcher,stock",
        help="which of one-at-a-time, pool, batcher, stock to measure",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="greedy, 4 users, 1.5 s points, 1 torch thread, no int8/stock",
    )
    args = parser.parse_args()
    from bot.config import Settings

    defaults = Settings(_env_file=None)  # type: ignore[call-arg]
    if args.batch_max_size is None:
        args.batch_max_size = defaults.batch_max_size
    if args.batch_max_wait_ms is None:
        args.batch_max_wait_ms = defaults.batch_max_wait_ms
    if args.quick:
        args.users, args.decoding, args.budget, args.quantize_users = "4", "greedy", 1.5, 0
        args.ways = "one-at-a-time,pool,batcher"
        # a smoke run must not depend on an idle machine (see --threads)
        args.threads = args.threads or 1
    users_list = [int(u) for u in args.users.split(",")]
    decodings = args.decoding.split(",")

    model_file = args.model_file or common.build_bench_model()
    print(
        f"throughput: users {users_list}, decoding {decodings}, >= {args.budget:g} s per point, "
        f"{common.REPLY_TOKENS}-token replies, batcher max_size={args.batch_max_size} "
        f"max_wait={args.batch_max_wait_ms} ms, pool of {args.workers} workers, "
        f"torch threads {args.threads or 'default'}",
        flush=True,
    )
    points: list[Point] = []
    memory: dict[str, dict[str, float]] = {}
    for decoding in decodings:
        pts, mem = measure(
            model_file, decoding, users_list, args.budget, args, ways=tuple(args.ways.split(","))
        )
        points += pts
        memory[decoding] = mem
        if args.quantize_users:
            pts, mem = measure(
                model_file,
                decoding,
                [args.quantize_users],
                args.budget,
                args,
                quantize=True,
                ways=("one-at-a-time", "batcher"),
            )
            points += pts
            memory[decoding + "_int8"] = mem

    def rate(decoding: str, way: str, users: int, quantized: bool = False) -> float:
        for p in points:
            if (p.decoding, p.way, p.users, p.quantized) == (decoding, way, users, quantized):
                return p.rate
        return float("nan")

    rows = []
    for decoding in decodings:
        for users in users_list:
            one = rate(decoding, "one-at-a-time", users)
            batch = rate(decoding, "batcher", users)
            pool = rate(decoding, "pool", users)
            rows.append((decoding, users, one, pool, batch, times(pool, one), times(batch, one)))
        if args.quantize_users:
            q = args.quantize_users
            one, batch = (
                rate(decoding, "one-at-a-time", q, True),
                rate(decoding, "batcher", q, True),
            )
            base = rate(decoding, "one-at-a-time", q)
            rows.append((f"{decoding} int8", q, one, float("nan"), batch, "-", times(batch, base)))
    common.print_table(
        "Replies per second (20-token replies; speedups against one-at-a-time, fp32)",
        ["decoding", "users", "one-at-a-time", "pool", "batcher", "pool x", "batcher x"],
        rows,
    )
    for decoding in decodings:
        stock = [p for p in points if p.way == "stock" and p.decoding == decoding]
        if stock:
            top = 32 if 32 in users_list else max(users_list)
            print(
                f"{decoding}: one-at-a-time on stock ParlAI {stock[0].rate:.3g}/s; the batcher "
                f"at {top} users is {rate(decoding, 'batcher', top) / stock[0].rate:.1f}x that"
            )
    for decoding in decodings:
        top = 32 if 32 in users_list else max(users_list)
        parlai = rate(decoding, "batcher-parlai", top)
        if not math.isnan(parlai):
            ours = rate(decoding, "batcher", top)
            print(
                f"{decoding}, batcher at {top} users: ParlAI's search {parlai:.3g}/s, ours "
                f"{ours:.3g}/s ({ours / parlai:.2f}x)"
            )
    for decoding, mem in memory.items():
        line = f"{decoding}: one process with the model {mem['process_rss_mb']:.0f} MB RSS"
        if "pool_rss_mb" in mem:
            line += (
                f"; pool of {args.workers}: {mem['pool_rss_mb']:.0f} MB RSS, "
                f"{mem['pool_uss_mb']:.0f} MB USS in total"
            )
        print(line)
    for p in points:
        if p.way == "batcher" and p.batch_sizes:
            sizes = ", ".join(f"{k}x{v}" for k, v in sorted(p.batch_sizes.items()))
            q = " int8" if p.quantized else ""
            print(f"  batches {p.decoding}{q} {p.users} users: size x count = {sizes}")
    print(
        "each figure: replies / seconds over at least "
        f"{args.budget:g} s (replies counted per point in the JSON)"
    )
    common.write_json(
        "throughput",
        {
            "points": [{**p.__dict__, "rate": p.rate} for p in points],
            "memory_mb": memory,
            "settings": {k: v for k, v in vars(args).items()},
            "reply_tokens": common.REPLY_TOKENS,
        },
    )
    fig, axes = common.new_figure(ncols=len(decodings), width=5.0)
    for ax, decoding in zip(axes[0], decodings, strict=True):
        for way, color in (
            ("one-at-a-time", "tab:red"),
            ("pool", "tab:orange"),
            ("batcher", "tab:blue"),
        ):
            ax.plot(
                users_list,
                [rate(decoding, way, u) for u in users_list],
                marker="o",
                color=color,
                label=way,
            )
        stock = [p for p in points if p.way == "stock" and p.decoding == decoding]
        if stock:
            ax.axhline(
                stock[0].rate, ls="--", color="tab:gray", label="one-at-a-time, stock ParlAI"
            )
        if args.quantize_users:
            q = args.quantize_users
            ax.plot([q], [rate(decoding, "batcher", q, True)], "*", ms=12, label="batcher int8")
        ax.set_xscale("log", base=2)
        ax.set_xticks(users_list, [str(u) for u in users_list])
        ax.set_xlabel("concurrent users")
        ax.set_ylabel("replies per second")
        ax.set_title(f"{decoding} ({common.REPLY_TOKENS}-token replies)")
        ax.grid(alpha=0.3)
        ax.legend()
    common.save_figure("throughput", fig)
    results: dict[str, float] = {}
    top = 32 if 32 in users_list else max(users_list)
    for decoding in decodings:
        results[f"speedup_{decoding}_{top}"] = rate(decoding, "batcher", top) / rate(
            decoding, "one-at-a-time", top
        )
        stock = [p for p in points if p.way == "stock" and p.decoding == decoding]
        if stock:
            results[f"speedup_vs_stock_{decoding}_{top}"] = (
                rate(decoding, "batcher", top) / stock[0].rate
            )
            results[f"search_speedup_{decoding}_{top}"] = rate(decoding, "batcher", top) / rate(
                decoding, "batcher-parlai", top
            )
        if args.quantize_users:
            q = args.quantize_users
            results[f"int8_gain_{decoding}_{q}"] = rate(decoding, "batcher", q, True) / rate(
                decoding, "batcher", q
            )
    common.emit_results(results)


if __name__ == "__main__":
    main()
