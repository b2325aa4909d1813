"""Continuous batching against the micro-batcher, under open-loop load, in one run.

    python -m bench.continuous [--minutes 3] [--quick] [--max-size 16] [--threads 2] [--churn]
                               [--alone] [--buckets] [--drafts] [--device cpu|cuda]
                               [--seconds S] [--warm-up S]

The model has BlenderBot-90M's architecture (random weights, bench.common), beam 10 with n-gram
and context blocking, and every reply is exactly 32 tokens (beam_min_length == label_truncate ==
32), so the two schedulers do the same work per reply. Each chat has its own persona and sends
`--turns` messages, each as soon as the reply to the previous one came; chats arrive as a
Poisson process (open loop: arrivals do not wait for the service). Both schedulers answer the
same chats at the same arrival times (one seed), one after the other:

  capacity     replies/s with `--saturate` chats always waiting (closed loop, 20 s warm-up,
               then up to 2 minutes), per scheduler; the offered loads are 50%, 70% and 90%
               of the micro-batcher's (today's capacity), the same for both
  single       one chat alone: its reply latency (p50 of a few turns, after a warm-up turn)
  churn        what a join and a leave cost the running batch's caches (`_admit` and `_drop`
               of `ContinuousSearch`, the encoder excluded) at label_truncate 32 and 256, with
               8 chats of beam 10 in flight (`--churn` runs only this)
  buckets      (`--buckets` only) ENCODER_BUCKETS against one padded encoder batch on the
               micro-batcher's search: micro-batches of 8 chats, encoder ms, padded positions,
               identical replies
  load points  p50 and p95 reply latency (submit to reply) of the turns asked in the window,
               and for the continuous scheduler the p50 time to the first draft (the first
               settled whole word; the service shows "Thinking…" before that)
  drafts       at 70% load, the continuous scheduler once more with the draft rule before
               issue 33 (the best hypothesis so far), at the same arrivals: the share of drafts
               that begin their reply's text, and the time to the first visible word (the first
               draft, or the reply where no draft came first), p50, for both rules; then the
               same, one chat at a time, on the shipped model (delayed beam, beam 5), where
               both rules see the same replies (the same seed per turn). `--drafts` runs only
               this (the micro-batcher's capacity first, for the load)

The micro-batcher is bot.inference.batcher.Batcher (BATCH_MAX_WAIT_MS 20), the continuous one
bot.inference.scheduler.Scheduler, both with BATCH_MAX_SIZE `--max-size`. Outputs: RESULT
lines, bench/results/continuous.json, docs/images/continuous.png (latency against load).

`--device cuda` runs both models (the benchmark's and the shipped one) with MODEL_DEVICE=cuda
(exit status 2 at once where torch sees no CUDA device); the outputs are then
`continuous-cuda.json` and `.png` (docs/images untouched) and every RESULT name starts with
`cuda_`. `--seconds` sets each load point's window (default 20 with `--quick`, else
`--minutes`), `--warm-up` the capacity runs' warm-up (default 20 s): bench/gpu_check.sh
shortens both to fit its five minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from bench import common

REPLY = 32
LOADS = (0.5, 0.7, 0.9)
GENERATION = {
    "inference": "beam",
    "beam_size": 10,
    "beam_min_length": REPLY,
    "beam_block_ngram": 3,
    "beam_context_block_ngram": 3,
}


@dataclass
class Drafts:
    """What the drafts of a set of turns showed."""

    shown: int = 0  # drafts
    prefixes: int = 0  # ... that begin their reply's text
    turns: int = 0
    drafted: int = 0  # turns with a draft before the reply
    first_visible: list[float] = field(default_factory=list)  # seconds: first draft, or reply
    at: list[float] = field(default_factory=list)  # first draft's time / the reply's

    def add(self, reply: str, drafts: list[tuple[float, str]], latency: float) -> None:
        """One turn: its reply, its drafts (seconds since it was asked, text), its latency."""
        self.turns += 1
        self.shown += len(drafts)
        self.prefixes += sum(reply.startswith(text) for _, text in drafts)
        self.first_visible.append(drafts[0][0] if drafts else latency)
        if drafts:
            self.drafted += 1
            self.at.append(drafts[0][0] / latency)

    def add_all(self, other: Drafts) -> None:
        """Another set's turns into this one."""
        self.shown += other.shown
        self.prefixes += other.prefixes
        self.turns += other.turns
        self.drafted += other.drafted
        self.first_visible += other.first_visible
        self.at += other.at

    def summary(self) -> dict[str, Any]:
        """Figures for the JSON and the RESULT lines."""
        return {
            "drafts": self.shown,
            "draft_prefix_share": self.prefixes / self.shown if self.shown else None,
            "drafted_turn_share": self.drafted / self.turns if self.turns else None,
            "first_visible_word_ms_p50": (
                1000 * common.percentile(self.first_visible, 50) if self.first_visible else None
            ),
            "first_draft_at_p50": common.percentile(self.at, 50) if self.at else None,
        }


@dataclass
class Point:
    """One scheduler at one offered load."""

    scheduler: str
    load: float  # fraction of the micro-batcher's capacity
    rate: float  # offered replies/s
    latencies: list[float] = field(default_factory=list)  # seconds
    first_drafts: list[float] = field(default_factory=list)
    seconds: float = 0.0
    drafts: Drafts = field(default_factory=Drafts)

    def summary(self) -> dict[str, Any]:
        """Figures for the JSON and the table."""
        lat = self.latencies
        return {
            "scheduler": self.scheduler,
            "load": self.load,
            "offered_replies_per_s": self.rate,
            "replies": len(lat),
            "p50_ms": 1000 * common.percentile(lat, 50) if lat else None,
            "p95_ms": 1000 * common.percentile(lat, 95) if lat else None,
            "first_draft_p50_ms": (
                1000 * common.percentile(self.first_drafts, 50) if self.first_drafts else None
            ),
            **({"drafts": self.drafts.summary()} if self.scheduler != "batch" else {}),
        }


def make_engine(agent: Any, scheduler: str, max_size: int) -> Any:
    """The service's two engines, on the same shared agent."""
    from bot.inference.batcher import Batcher
    from bot.inference.scheduler import Scheduler

    if scheduler == "continuous":
        return Scheduler(agent, max_size=max_size)
    if scheduler == OLD_DRAFTS:
        return best_so_far_scheduler(agent, max_size)
    return Batcher(agent, max_size=max_size, max_wait_ms=20)


OLD_DRAFTS = "continuous-old-drafts"


def best_so_far_scheduler(agent: Any, max_size: int, **kw: Any) -> Any:
    """The continuous scheduler with the draft rule before issue 33, for the comparison: the
    best hypothesis so far (the best finished one once the top beam ended), whole words."""
    from bot.inference.scheduler import Scheduler

    class BestSoFar(Scheduler):
        def _draft_text(self, chat: Any) -> str:
            if chat.eos_top and chat.finished:
                tokens = chat.result().get_rescored_finished(1)[0][0].tolist()
            else:
                tokens = chat.hyps[0].tolist()
            words = self._whole_words(tokens)
            return self.postprocess(words) if words else ""

    return BestSoFar(agent, max_size=max_size, **kw)


class Chats:
    """Clones with a persona each, as the service's cache builds them."""

    def __init__(self, agent: Any) -> None:
        from bot.inference.cache import AgentCache

        self.cache = AgentCache(agent, capacity=1_000_000)
        self.next = 0

    def new(self) -> tuple[int, Any]:
        """A fresh chat: its number and its conversation (clone + persona)."""
        user = self.next
        self.next += 1
        return user, self.cache.rebuild(user, common.persona(user), [])


async def ask(engine: Any, entry: Any, text: str, point: Point | None) -> float:
    """One turn; returns its latency (and records the first draft's delay in `point`)."""
    from bot.inference.scheduler import Scheduler

    started = time.perf_counter()
    drafts: list[tuple[float, str]] = []

    def draft(text: str) -> None:
        drafts.append((time.perf_counter() - started, text))

    turn = entry.user_turn(text)
    if isinstance(engine, Scheduler):
        result = await engine.generate(entry.clone, turn, draft)
    else:
        result = await engine.generate(entry.clone, turn)
    latency = time.perf_counter() - started
    if point is not None:
        if drafts:
            point.first_drafts.append(drafts[0][0])
        if isinstance(engine, Scheduler):
            point.drafts.add(result.text, drafts, latency)
    return latency


async def capacity(agent: Any, scheduler: str, args: argparse.Namespace) -> float:
    """Replies/s with `--saturate` chats always asking (closed loop), after a warm-up."""
    engine = make_engine(agent, scheduler, args.max_size)
    await engine.start()
    chats = Chats(agent)
    done = 0
    warm_up, measure = args.warm_up, min(args.seconds, 120.0)
    stop = time.perf_counter() + warm_up + measure
    measuring_from = 0.0

    async def user() -> None:
        nonlocal done
        user_id, entry = chats.new()
        turn = 0
        while time.perf_counter() < stop:
            await ask(engine, entry, common.user_message(user_id, turn), None)
            turn += 1
            if measuring_from and time.perf_counter() >= measuring_from:
                done += 1

    try:
        tasks = [asyncio.create_task(user()) for _ in range(args.saturate)]
        await asyncio.sleep(warm_up)  # the batch fills, the steps settle
        measuring_from = time.perf_counter()
        await asyncio.gather(*tasks)
        measured = time.perf_counter() - measuring_from
    finally:
        await engine.close()
    return done / measured


async def singles(agent: Any, args: argparse.Namespace) -> dict[str, float]:
    """One chat alone, per scheduler: the p50 latency of a few turns (seconds). Both engines
    run at once and take turns (ABBA order, after a warm-up turn each), so a neighbour's load
    that comes and goes weighs on both alike; each has its own chat, with the same persona and
    the same messages (the same work)."""
    names = ("batch", "continuous")
    engines = {name: make_engine(agent, name, args.max_size) for name in names}
    for engine in engines.values():
        await engine.start()
    try:
        cache = Chats(agent).cache
        entries = {name: cache.rebuild(i, common.persona(0), []) for i, name in enumerate(names)}
        latencies: dict[str, list[float]] = {name: [] for name in names}
        for name in names:  # warm-up
            await ask(engines[name], entries[name], common.user_message(0, 99), None)
        for turn in range(args.single_turns):
            for name in names if turn % 2 == 0 else names[::-1]:
                latency = await ask(
                    engines[name], entries[name], common.user_message(0, turn), None
                )
                latencies[name].append(latency)
    finally:
        for engine in engines.values():
            await engine.close()
    return {name: statistics.median(values) for name, values in latencies.items()}


async def open_loop(agent: Any, point: Point, args: argparse.Namespace) -> None:
    """Poisson chat arrivals at `point.rate / turns` chats/s for `--minutes`; each chat asks
    its turns one after another. Turns asked within the window count (their replies are
    waited for, up to a drain limit)."""
    engine = make_engine(agent, point.scheduler, args.max_size)
    await engine.start()
    chats = Chats(agent)
    rng = random.Random(args.seed)  # the same arrivals for both schedulers
    window = args.seconds
    started = time.perf_counter()
    end = started + window

    async def chat() -> None:
        user_id, entry = chats.new()
        for turn in range(args.turns):
            if time.perf_counter() >= end:
                return
            latency = await ask(engine, entry, common.user_message(user_id, turn), point)
            point.latencies.append(latency)

    tasks = []
    try:
        t = started
        while True:
            t += rng.expovariate(point.rate / args.turns)
            if t >= end:
                break
            await asyncio.sleep(max(0.0, t - time.perf_counter()))
            tasks.append(asyncio.create_task(chat()))
        _, pending = await asyncio.wait(tasks, timeout=window) if tasks else (set(), set())
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    finally:
        await engine.close()
    point.seconds = time.perf_counter() - started


async def draft_points(agent: Any, rate: float, args: argparse.Namespace) -> list[Point]:
    """The continuous scheduler at `rate` (the 70% load point) with the old draft rule; the
    point with today's rule is the caller's."""
    point = Point(OLD_DRAFTS, 0.7, rate)
    await open_loop(agent, point, args)
    print(point.summary(), flush=True)
    return [point]


SHIPPED_TURNS = 24


async def shipped_drafts(args: argparse.Namespace) -> dict[str, Drafts]:
    """The shipped default model (its own generation settings: delayed beam, beam 5), one chat
    at a time, each turn asked under both draft rules with the same seed, so both see the
    same reply."""
    import tempfile
    from pathlib import Path

    import torch

    from bot.config import Settings
    from bot.inference import compat
    from bot.inference.model import load_shared_agent
    from bot.inference.scheduler import Scheduler

    compat.apply()
    with tempfile.TemporaryDirectory() as data:
        settings = Settings(  # type: ignore[call-arg]
            _env_file=None,
            data_dir=Path(data),
            model_device=args.device,
            torch_threads=args.threads,
        )
        agent = load_shared_agent(settings)
        engines = {
            "new": Scheduler(agent, max_size=1),
            "old": best_so_far_scheduler(agent, max_size=1),
        }
        figures = {name: Drafts() for name in engines}
        for engine in engines.values():
            await engine.start()
        try:
            chats = Chats(agent)
            for turn in range(SHIPPED_TURNS):
                user, _ = chats.new()
                for name, engine in engines.items():
                    entry = chats.cache.rebuild(user, common.persona(user), [])
                    point = Point(name, 0.0, 0.0)
                    torch.manual_seed(args.seed + turn)
                    await ask(engine, entry, common.user_message(user, 0), point)
                    figures[name].add_all(point.drafts)
        finally:
            for engine in engines.values():
                await engine.close()
    return figures


CHURN_TRUNCATES = (32, 256)


def buckets(agent: Any, batches: int = 4, size: int = 8, device: str = "cpu") -> dict[str, float]:
    """ENCODER_BUCKETS on and off over the same micro-batches (chats with a persona each):
    encoder time per batch (median), the padding share of the encoder's positions, and the
    share of chats whose reply is identical."""
    import torch
    from parlai.core.message import Message

    from bot.inference.fastgen.beam import batched_generate, encode

    chat_maker = Chats(agent)
    times: dict[bool, list[float]] = {False: [], True: []}
    same = chats = padded = positions = 0
    with torch.no_grad():
        for _ in range(batches):
            observed = []
            for _ in range(size):
                user, entry = chat_maker.new()
                text = entry.user_turn(common.user_message(user))
                observed.append(entry.clone.observe(Message({"text": text, "episode_done": False})))
            batch = agent.batchify(observed)
            lengths = (batch.text_vec != agent.NULL_IDX).sum(1)
            padded += int(batch.text_vec.numel() - lengths.sum())
            positions += batch.text_vec.numel()
            replies = {}
            for on in (False, True, True, False):
                agent.encoder_buckets = on
                common.sync(device)
                started = time.perf_counter()
                encode(agent, agent.model, batch)
                common.sync(device)
                times[on].append(1000 * (time.perf_counter() - started))
                if on not in replies:
                    preds, _ = batched_generate(agent, batch, int(agent.beam_size), REPLY)
                    replies[on] = [p[0].tolist() for p in preds]
            agent.encoder_buckets = False
            chats += size
            same += sum(a == b for a, b in zip(replies[False], replies[True], strict=True))
    return {
        "encoder_padded_ms": statistics.median(times[False]),
        "encoder_bucketed_ms": statistics.median(times[True]),
        "encoder_padding_share": padded / positions,
        "bucketed_same_reply_share": same / chats,
    }


def churn(
    agent: Any, label_truncate: int, chats: int = 8, changes: int = 3, device: str = "cpu"
) -> dict[str, float]:
    """Milliseconds one join and one leave spend on the running batch's caches (median of
    `changes` each), and one step's, with `chats` chats in flight at `label_truncate` (each
    timing waits for the GPU's work on `device` cuda)."""
    import torch
    from parlai.core.message import Message

    from bot.inference.fastgen.continuous import ContinuousSearch

    search = ContinuousSearch(agent)
    timings: dict[str, list[float]] = {"join": [], "leave": [], "step": []}

    def timed(name: str, method: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            common.sync(device)
            started = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                common.sync(device)
                timings[name].append(1000 * (time.perf_counter() - started))

        return wrapper

    search._admit = timed("join", search._admit)  # type: ignore[method-assign]
    search._drop = timed("leave", search._drop)  # type: ignore[method-assign]
    chat_maker = Chats(agent)
    saved = agent.label_truncate
    agent.label_truncate = label_truncate
    try:
        with torch.no_grad():

            def join(key: int) -> None:
                user, entry = chat_maker.new()
                clone = entry.clone
                obs = clone.observe(
                    Message(
                        {"text": entry.user_turn(common.user_message(user)), "episode_done": False}
                    )
                )
                search.join(key, agent.batchify([obs]))

            for key in range(chats):
                join(key)
            timings["join"].clear()
            for change in range(changes):
                for _ in range(3):
                    common.sync(device)
                    started = time.perf_counter()
                    search.step()
                    common.sync(device)
                    timings["step"].append(1000 * (time.perf_counter() - started))
                join(chats + change)  # one more chat joins
                search.step()
                search.chats[0].max_ts = search.chats[0].t + 1  # and the oldest leaves next step
                search.step()
    finally:
        agent.label_truncate = saved
        search.clear()
    return {name: statistics.median(values) for name, values in timings.items()}


def plot(
    summaries: list[dict[str, Any]], singles: dict[str, float], path_name: str, docs: bool = True
) -> None:
    """p50 and p95 latency against offered load, both schedulers (from the points' figures);
    copied to docs/images/continuous.png where `docs`."""
    fig, axes = common.new_figure(1, width=7.0)
    ax = axes[0][0]
    styles = {"continuous": "tab:blue", "batch": "tab:orange"}
    for name, color in styles.items():
        pts = sorted((p for p in summaries if p["scheduler"] == name), key=lambda p: p["load"])
        xs = [p["offered_replies_per_s"] for p in pts]
        ax.plot(xs, [p["p50_ms"] / 1000 for p in pts], "o-", color=color, label=f"{name} p50")
        ax.plot(xs, [p["p95_ms"] / 1000 for p in pts], "s--", color=color, label=f"{name} p95")
        ax.axhline(singles[name], color=color, linestyle=":", linewidth=1)
    ax.set_xlabel("offered load, replies/s (50%, 70%, 90% of the micro-batcher's capacity)")
    ax.set_ylabel("reply latency (s)")
    ax.set_title("Beam 10, 32-token replies, BlenderBot-90M arch. (dotted: one chat alone)")
    ax.legend()
    ax.grid(alpha=0.3)
    path = common.save_figure(path_name, fig)
    if not docs:
        return
    images = common.ROOT / "docs" / "images"
    images.mkdir(parents=True, exist_ok=True)
    shutil.copy(path, images / "continuous.png")
    print("wrote docs/images/continuous.png")


def replot() -> None:
    """The plot again from bench/results/continuous.json (no measuring)."""
    body = json.loads((common.RESULTS_DIR / "continuous.json").read_text())
    plot(body["points"], body["single_s"], "continuous")


def output_name(name: str, device: str) -> str:
    """The JSON's (and plot's) name: `name` on the CPU, `name-cuda` on a GPU."""
    return name if device == "cpu" else f"{name}-{device}"


def emit(results: dict[str, float], device: str) -> None:
    """The RESULT lines, their names prefixed with `cuda_` on a GPU."""
    prefix = "" if device == "cpu" else f"{device}_"
    common.emit_results({prefix + name: value for name, value in results.items()})


async def main_async(args: argparse.Namespace) -> None:
    """Every measurement, then the outputs."""
    model = common.build_bench_model()
    agent = common.load_agent(model, GENERATION, threads=args.threads, device=args.device)
    agent.label_truncate = REPLY  # with beam_min_length == REPLY: every reply is 32 tokens
    if args.buckets:
        emit(buckets(agent, device=args.device), args.device)
        return
    if args.drafts:
        await drafts_only(agent, args)
        return
    if not args.churn:
        alone = await singles(agent, args)
        print({k: f"{v:.2f} s" for k, v in alone.items()}, flush=True)
        if args.alone:
            emit({"continuous_alone_ratio": alone["continuous"] / alone["batch"]}, args.device)
            return
    churns = {n: churn(agent, n, device=args.device) for n in CHURN_TRUNCATES}
    print({n: {k: f"{v:.1f} ms" for k, v in c.items()} for n, c in churns.items()}, flush=True)
    if args.churn:
        emit(_churn_results(churns), args.device)
        return
    names = ("batch", "continuous")
    capacities = {name: await capacity(agent, name, args) for name in names}
    print({k: f"{v:.2f} replies/s" for k, v in capacities.items()}, flush=True)
    points = []
    for load in LOADS:
        for name in names:
            point = Point(name, load, load * capacities["batch"])
            await open_loop(agent, point, args)
            points.append(point)
            print(point.summary(), flush=True)
    seventy = next(p for p in points if p.scheduler == "continuous" and p.load == 0.7)
    old_rule = await draft_points(agent, seventy.rate, args)
    shipped = await shipped_drafts(args)

    rows = [
        [
            f"{int(100 * p.load)}%",
            p.scheduler,
            f"{p.rate:.2f}",
            len(p.latencies),
            f"{p.summary()['p50_ms'] / 1000:.2f}",
            f"{p.summary()['p95_ms'] / 1000:.2f}",
            "-" if not p.first_drafts else f"{p.summary()['first_draft_p50_ms']:.0f}",
        ]
        for p in points
    ]
    headers = ["load", "scheduler", "offered/s", "replies", "p50 s", "p95 s", "first draft ms"]
    common.print_table("Open-loop load", headers, rows)
    print(common.markdown_table(headers, rows))

    results: dict[str, float] = {}
    for name in names:
        results[f"{name}_single_chat_ms"] = 1000 * alone[name]
        results[f"{name}_saturation_replies_per_s"] = capacities[name]
    for p in points:
        s = p.summary()
        tag = f"{p.scheduler}_load{int(100 * p.load)}"
        results[f"{tag}_p50_ms"] = s["p50_ms"] or 0.0
        results[f"{tag}_p95_ms"] = s["p95_ms"] or 0.0
        if s["first_draft_p50_ms"] is not None:
            results[f"{tag}_first_draft_p50_ms"] = s["first_draft_p50_ms"]
    results["continuous_p95_load70_over_single"] = (
        common.percentile(seventy.latencies, 95) / alone["continuous"]
    )
    results["continuous_alone_ratio"] = alone["continuous"] / alone["batch"]
    if seventy.first_drafts:  # the figure: the continuous scheduler at 70% load
        results["first_draft_p50_ms"] = 1000 * common.percentile(seventy.first_drafts, 50)
    results["saturation_speedup"] = capacities["continuous"] / capacities["batch"]
    results.update(_churn_results(churns))
    results.update(_draft_results(seventy, old_rule[0], shipped))
    emit(results, args.device)
    common.write_json(
        output_name("continuous", args.device),
        {
            "args": vars(args),
            "generation": {**GENERATION, "label_truncate": REPLY},
            "single_s": alone,
            "capacity_replies_per_s": capacities,
            "points": [p.summary() for p in points],
            "churn_ms": churns,
            "old_draft_rule_load70": old_rule[0].summary(),
            "shipped_drafts": {name: d.summary() for name, d in shipped.items()},
            "results": results,
        },
    )
    name = output_name("continuous", args.device)
    plot([p.summary() for p in points], alone, name, docs=args.device == "cpu")


async def drafts_only(agent: Any, args: argparse.Namespace) -> None:
    """`--drafts`: the micro-batcher's capacity (for the load), then the continuous scheduler
    at 70% of it with each draft rule, then the shipped model's turns."""
    rate = 0.7 * await capacity(agent, "batch", args)
    print(f"70% load: {rate:.2f} replies/s", flush=True)
    point = Point("continuous", 0.7, rate)
    await open_loop(agent, point, args)
    print(point.summary(), flush=True)
    old_rule = await draft_points(agent, rate, args)
    shipped = await shipped_drafts(args)
    results = _draft_results(point, old_rule[0], shipped)
    emit(results, args.device)
    common.write_json(
        output_name("continuous_drafts", args.device),
        {
            "args": vars(args),
            "generation": {**GENERATION, "label_truncate": REPLY},
            "load70": {"new": point.summary(), "old": old_rule[0].summary()},
            "shipped": {name: d.summary() for name, d in shipped.items()},
            "results": results,
        },
    )


def _draft_results(new: Point, old: Point, shipped: dict[str, Drafts]) -> dict[str, float]:
    """The RESULT lines of the draft rules: today's (no suffix) and the old one (`_old`)."""
    results: dict[str, float] = {}
    for suffix, drafts in (("", new.drafts), ("_old", old.drafts)):
        for name, value in drafts.summary().items():
            if name != "drafts" and value is not None:
                results[f"{name}{suffix}"] = value
    for rule, drafts in shipped.items():
        suffix = "" if rule == "new" else "_old"
        for name, value in drafts.summary().items():
            if name != "drafts" and value is not None:
                results[f"shipped_{name}{suffix}"] = value
    return results


def _churn_results(churns: dict[int, dict[str, float]]) -> dict[str, float]:
    results = {}
    for n, c in churns.items():
        results[f"continuous_join_ms_lt{n}"] = c["join"]
        results[f"continuous_leave_ms_lt{n}"] = c["leave"]
        results[f"continuous_step_ms_lt{n}"] = c["step"]
    return results


def main(argv: list[str] | None = None) -> int:
    """Command line; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=3.0, help="per load point")
    parser.add_argument("--quick", action="store_true", help="about 20 s per point")
    parser.add_argument("--max-size", type=int, default=16, help="BATCH_MAX_SIZE")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--turns", type=int, default=3, help="turns per chat")
    parser.add_argument("--saturate", type=int, default=32, help="chats in the capacity run")
    parser.add_argument("--single-turns", type=int, default=4, help="turns per scheduler alone")
    parser.add_argument("--seed", type=int, default=14)
    parser.add_argument("--churn", action="store_true", help="only the join/leave costs")
    parser.add_argument("--alone", action="store_true", help="only one chat alone, both")
    parser.add_argument("--buckets", action="store_true", help="only ENCODER_BUCKETS on/off")
    parser.add_argument("--drafts", action="store_true", help="only the two draft rules")
    parser.add_argument("--replot", action="store_true", help="only redraw the last run's plot")
    parser.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu", help="MODEL_DEVICE (default cpu)"
    )
    parser.add_argument("--seconds", type=float, help="window per load point (overrides)")
    parser.add_argument("--warm-up", type=float, default=20.0, help="capacity warm-up, s")
    args = parser.parse_args(argv)
    if args.replot:
        replot()
        return 0
    refusal = common.cuda_refusal("bench.continuous") if args.device == "cuda" else None
    if refusal:
        print(refusal, file=sys.stderr)
        return 2
    if args.seconds is None:
        args.seconds = 20.0 if args.quick else 60.0 * args.minutes
    asyncio.run(main_async(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
