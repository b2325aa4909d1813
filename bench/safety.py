"""The safety gate's added latency per reply (bot/safety.py, the real classifier).

    python -m bench.safety [--replies 500] [--quick]

Each reply of a chitchat corpus goes through `SafetyGate.reply` the way the chat use case calls
it, with 5 candidate beams (as beam search at beam 5 gives them): the time from the call to its
verdict (on the event loop once the classifier is loaded, bot/safety.py) is what SAFETY=block
adds to a reply. Also timed: the same for an offensive reply (every candidate scored), and
SAFETY=flag; and the classifier alone on one short text (a reply, a draft), each way it can
score it, in the same run:
`safety_score_one_ms_p50` (bot/safety.py's plain-Python TF-IDF row, what the gate uses),
`_sparse` (the vectorizer's own transform and a sparse product, the way before) and `_reference`
(alt-profanity-check's `predict_prob`).
"""

from __future__ import annotations

import argparse
import asyncio
import time

from bench import common
from bot.safety import SafetyGate, fast_profanity_scorer, reference_profanity_scorer

TOXIC = "you are a fucking idiot"


async def _timed(gate: SafetyGate, replies: list[str], toxic: bool) -> list[float]:
    times = []
    for i, text in enumerate(replies):
        first = TOXIC if toxic else text
        candidates = [first, *replies[i + 1 : i + 5]]
        started = time.perf_counter()
        await gate.reply(first, candidates)
        times.append((time.perf_counter() - started) * 1000.0)
    return times


def _score_one(replies: list[str]) -> dict[str, float]:
    """p50 ms of scoring one text at a time, each way; they must agree."""
    from profanity_check import profanity_check

    vectorizer, model = profanity_check.vectorizer, profanity_check.model
    ways = {
        "": fast_profanity_scorer(vectorizer, model),
        "_sparse": fast_profanity_scorer(vectorizer, model, sparse=True),
        "_reference": reference_profanity_scorer(),
    }
    out, scores = {}, {}
    for suffix, scorer in ways.items():
        if scorer is None:
            continue
        scorer(replies[:1])  # first-call costs out of the timing
        times, scores[suffix] = [], []
        for text in replies:
            started = time.perf_counter()
            scores[suffix].append(scorer([text])[0])
            times.append((time.perf_counter() - started) * 1000.0)
        out[f"safety_score_one_ms_p50{suffix}"] = common.percentile(times, 50)
    if "" in scores and "_reference" in scores:
        out["safety_score_max_diff"] = max(
            abs(x - y) for x, y in zip(scores[""], scores["_reference"], strict=True)
        )
    return out


async def main_async(n: int) -> None:
    corpus = common.corpus()
    replies = [corpus[i % len(corpus)] for i in range(n + 5)]
    block, flag = SafetyGate("block"), SafetyGate("flag")
    started = time.perf_counter()
    await block.warm_up()
    load_s = time.perf_counter() - started
    rows, results = [], {"safety_load_s": load_s}
    for name, gate, toxic in (
        ("block, clean reply", block, False),
        ("block, offensive reply", block, True),
        ("flag", flag, False),
    ):
        times = await _timed(gate, replies[: n + 4], toxic)
        p50, p95 = common.percentile(times, 50), common.percentile(times, 95)
        rows.append((name, n, f"{p50:.2f}", f"{p95:.2f}"))
        key = name.replace(", ", "_").replace(" reply", "").replace(" ", "_")
        results[f"safety_{key}_p50_ms"] = p50
        results[f"safety_{key}_p95_ms"] = p95
    scored = _score_one(replies[:n])
    for suffix, way in (
        ("", "plain-Python row"),
        ("_sparse", "sparse"),
        ("_reference", "predict_prob"),
    ):
        key = f"safety_score_one_ms_p50{suffix}"
        if key in scored:
            rows.append((f"classifier alone, one text, {way}", n, f"{scored[key]:.3f}", "-"))
    results.update(scored)
    common.print_table(
        f"Safety gate: added latency per reply (classifier loaded in {load_s:.1f} s)",
        ["case", "replies", "p50 ms", "p95 ms"],
        rows,
    )
    common.emit_results(results)
    common.write_json("safety", {"replies": n, "results": results})


def main() -> None:
    """Command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--replies", type=int, default=500)
    parser.add_argument("--quick", action="store_true", help="a short run (smoke test)")
    args = parser.parse_args()
    asyncio.run(main_async(20 if args.quick else args.replies))


if __name__ == "__main__":
    main()
