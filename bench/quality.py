"""The quality guard on the shipped default model with real text: our faster modes' replies
against the default's (fp32, the micro-batcher), through the service's own search path.

    python -m bench.quality [--model FILE] [--chats 64] [--history 4] [--beams 5,10]
                            [--modes ...] [--quick]

bench.peer measures agreement on a random-weight model with random token ids; this asks the
same question where it matters to a user: the model the repository ships (models/chitchat/, or
`--model`), each chat a persona from bench.common and a few turns of real conversation (the
chitchat corpus) before a real user message, built into clones the way the service's cache
builds them. Every mode answers every chat through the service's engine (`Batcher` for the
micro-batcher, `Scheduler` for the continuous scheduler), 8 chats at a time, each mode in its
own process (QUANTIZE / DTYPE change the loaded weights).

Decoding is beam search with the model's own settings (its beam_min_length and n-gram blocking)
at each `--beams` size. The shipped model's `delayedbeam` samples its first tokens, so two runs
of one mode already differ; identical replies say something only for the deterministic search.

For each mode against the reference: identical replies in percent, and for the replies that
differ the gap in fp32 sequence score (the reference's fp32 model scores both replies, teacher
forced on the same model input: the sum of token log-probabilities over ParlAI's length penalty;
a positive gap: the mode's reply scores lower than the default's). A mode this CPU refuses
(DTYPE=bf16 without AMX or AVX-512-bf16) is listed as refused. Outputs: RESULT lines
(`quality_identical_pct_<mode>_beam<k>`, `quality_gap_p50_<mode>_beam<k>`,
`quality_gap_max_<mode>_beam<k>`), a table, a few differing replies, bench/results/quality.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import common

# mode -> (scheduler, QUANTIZE, DTYPE); the first is the reference (the service's default path
# is bit for bit ParlAI's: tests/integration/inference pins that).
MODES: dict[str, tuple[str, str, str]] = {
    "fp32": ("batch", "none", "fp32"),
    "int8": ("batch", "int8", "fp32"),
    "bf16": ("batch", "none", "bf16"),
    "cont_fp32": ("continuous", "none", "fp32"),
    "cont_int8": ("continuous", "int8", "fp32"),
    "cont_bf16": ("continuous", "none", "bf16"),
}
REFERENCE = "fp32"
GROUP = 8  # chats asked at once (one micro-batch)


def load(model_file: str, mode: str, beam: int, data_dir: Path) -> Any:
    """The shared agent for `mode`, loaded as the service loads it (1 torch thread)."""
    from bot.config import Settings
    from bot.inference import compat
    from bot.inference.model import load_shared_agent, set_torch_threads

    _, quantize, dtype = MODES[mode]
    compat.apply()
    set_torch_threads(1)
    settings = Settings(  # type: ignore[call-arg]
        _env_file=None,
        bot_model=model_file,
        data_dir=data_dir,
        model_device="cpu",
        torch_threads=1,
        inference="beam",
        beam_size=beam,
        quantize=quantize,
        dtype=dtype,
        search_impl="fast",
    )
    return load_shared_agent(settings)


def chats(n: int, history: int) -> list[tuple[str, list[tuple[str, str]], str]]:
    """`n` chats: (persona, earlier turns, the new user message), real text, fixed by seed."""
    return [
        (common.persona(user), common.conversation(user, history), common.user_message(user))
        for user in range(n)
    ]


async def answer(agent: Any, scheduler: str, asked: Sequence[Any]) -> list[dict[str, Any]]:
    """Every chat's reply and model input, through the service's engine, GROUP at a time."""
    from bot.inference.batcher import Batcher
    from bot.inference.cache import AgentCache
    from bot.inference.scheduler import Scheduler

    cache = AgentCache(agent, capacity=1_000_000)
    engine: Any = (
        Scheduler(agent, max_size=GROUP)
        if scheduler == "continuous"
        else Batcher(agent, max_size=GROUP, max_wait_ms=20)
    )
    await engine.start()
    try:
        out: list[dict[str, Any]] = []
        for start in range(0, len(asked), GROUP):
            group = list(enumerate(asked[start : start + GROUP], start))
            entries = [cache.rebuild(i, persona, turns) for i, (persona, turns, _) in group]
            generated = await asyncio.gather(
                *(
                    engine.generate(entry.clone, entry.user_turn(text))
                    for entry, (_, (_, _, text)) in zip(entries, group, strict=True)
                )
            )
            out += [{"text": g.text, "model_input": list(g.model_input)} for g in generated]
        return out
    finally:
        await engine.close()


def scores(agent: Any, replies: Sequence[dict[str, Any]]) -> list[float]:
    """Each reply's fp32 sequence score under `agent`'s model, given its own model input."""
    import torch

    from bench.peer import sequence_scores

    penalty = float(agent.opt.get("beam_length_penalty", 0.65))
    out = []
    for r in replies:
        context = torch.tensor([r["model_input"]], dtype=torch.long)
        tokens = [*agent.dict.txt2vec(r["text"]), agent.END_IDX]
        out += sequence_scores(agent.model, context, [tokens], length_penalty=penalty)
    return out


def compare(
    ref: Sequence[dict[str, Any]],
    other: Sequence[dict[str, Any]],
    ref_scores: Sequence[float],
    other_scores: Sequence[float],
) -> dict[str, Any]:
    """Identical replies in percent; for the others, the fp32 score gap (reference - mode)."""
    if not (len(ref) == len(other) == len(ref_scores) == len(other_scores)) or not ref:
        raise ValueError("compare needs equally long, non-empty lists")
    for a, b in zip(ref, other, strict=True):
        if a["model_input"] != b["model_input"]:  # equal work: the same model input per chat
            raise ValueError("the two modes read different model inputs")
    differ = [i for i, (a, b) in enumerate(zip(ref, other, strict=True)) if a["text"] != b["text"]]
    gaps = [ref_scores[i] - other_scores[i] for i in differ]
    return {
        "identical_pct": 100.0 * (len(ref) - len(differ)) / len(ref),
        "ref_score_p50": statistics.median(ref_scores),  # the scale the gaps are on
        "gap_p50": statistics.median(gaps) if gaps else 0.0,
        "gap_max": max(gaps) if gaps else 0.0,
        "differ": differ,
    }


# --- workers -------------------------------------------------------------------------------


def worker(args: argparse.Namespace) -> None:
    """One mode's replies (`--worker MODE`), or the reference's scores of every mode's replies
    (`--score FILE`); answers with one JSON line (common.worker_reply)."""
    asked = chats(args.chats, args.history)
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp)
        if args.score:
            agent = load(args.model, REFERENCE, args.beam, data_dir)
            replies = json.loads(Path(args.score).read_text())
            common.worker_reply({m: scores(agent, r) for m, r in replies.items()})
            return
        try:
            agent = load(args.model, args.worker, args.beam, data_dir)
        except Exception as err:  # noqa: BLE001 - a refused mode is a row of the report
            common.worker_reply({"refused": f"{type(err).__name__}: {err}"})
            return
        scheduler = MODES[args.worker][0]
        common.worker_reply({"replies": asyncio.run(answer(agent, scheduler, asked))})


def run_beam(args: argparse.Namespace, beam: int) -> dict[str, Any]:
    """Every mode at one beam size, then the reference's scores; the per-mode comparison."""
    base = ["--model", args.model, "--chats", str(args.chats), "--history", str(args.history)]
    base += ["--beam", str(beam)]
    replies: dict[str, list[dict[str, Any]]] = {}
    refused: dict[str, str] = {}
    for mode in args.modes:
        print(f"beam {beam}: {mode} ...", flush=True)
        got = common.run_worker("bench.quality", [*base, "--worker", mode])
        if "refused" in got:
            refused[mode] = got["refused"]
        else:
            replies[mode] = got["replies"]
    if REFERENCE not in replies:
        raise SystemExit(f"the reference mode {REFERENCE} did not run: {refused.get(REFERENCE)}")
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(replies, f)
    scored = common.run_worker("bench.quality", [*base, "--score", f.name])
    Path(f.name).unlink()
    ref = replies[REFERENCE]
    report: dict[str, Any] = {"refused": refused, "modes": {}}
    for mode, other in replies.items():
        cmp = compare(ref, other, scored[REFERENCE], scored[mode])
        cmp["examples"] = [
            {"default": ref[i]["text"], mode: other[i]["text"]} for i in cmp["differ"][:3]
        ]
        report["modes"][mode] = cmp
    return report


def main(argv: Sequence[str] | None = None) -> None:
    from bot.config import SHIPPED_MODEL_FILE

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(SHIPPED_MODEL_FILE))
    parser.add_argument("--chats", type=int, default=64)
    parser.add_argument("--history", type=int, default=4, help="earlier messages per chat")
    parser.add_argument("--beams", default="5,10")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--quick", action="store_true", help="16 chats, beam 5")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--score", help=argparse.SUPPRESS)
    parser.add_argument("--beam", type=int, default=5, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker or args.score:
        worker(args)
        return
    if args.quick:
        args.chats, args.beams = 16, "5"
    args.modes = [m for m in args.modes.split(",") if m]
    unknown = set(args.modes) - set(MODES)
    if unknown or REFERENCE not in args.modes:
        raise SystemExit(f"--modes: from {', '.join(MODES)}, {REFERENCE} included")
    beams = [int(b) for b in args.beams.split(",")]
    reports = {beam: run_beam(args, beam) for beam in beams}

    results: dict[str, float] = {}
    rows = []
    for beam, report in reports.items():
        for mode in args.modes:
            if mode in report["refused"]:
                rows.append([beam, mode, "refused", "-", "-", "-"])
                continue
            cmp = report["modes"][mode]
            rows.append(
                [
                    beam,
                    mode,
                    cmp["identical_pct"],
                    cmp["gap_p50"],
                    cmp["gap_max"],
                    len(cmp["differ"]),
                ]
            )
            if mode != REFERENCE:
                results[f"quality_identical_pct_{mode}_beam{beam}"] = cmp["identical_pct"]
                results[f"quality_gap_p50_{mode}_beam{beam}"] = cmp["gap_p50"]
                results[f"quality_gap_max_{mode}_beam{beam}"] = cmp["gap_max"]
    headers = ["beam", "mode", "identical %", "score gap p50", "score gap max", "differ"]
    scale = ", ".join(
        f"beam {b}: {r['modes'][REFERENCE]['ref_score_p50']:.2f}" for b, r in reports.items()
    )
    common.print_table(
        f"Against {REFERENCE} on {Path(args.model).parent.name}, {args.chats} chats "
        f"(the default's replies score {scale}, median)",
        headers,
        rows,
    )
    for beam, report in reports.items():
        for mode, why in report["refused"].items():
            print(f"beam {beam}: {mode} refused: {why}")
        for mode, cmp in report["modes"].items():
            for ex in cmp["examples"]:
                print(f"beam {beam} {mode}: {json.dumps(ex, ensure_ascii=False)}")
    common.emit_results(results)
    payload = {
        "model": args.model,
        "chats": args.chats,
        "history": args.history,
        "reports": {str(b): r for b, r in reports.items()},
        "results": results,
        "table": common.markdown_table(headers, rows),
    }
    common.write_json("quality", payload)


if __name__ == "__main__":
    main(sys.argv[1:])
