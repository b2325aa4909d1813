"""Does compiling the fast decoder step pay on this CPU? A standalone probe, not a test.

    nice timeout 1500 python -m bench.compile_probe [--variants loop,layers] [--batches 1,8]
                                  [--tokens 32] [--rounds 3] [--compile-limit 300]

The model is bench.peer's random-weight ParlAI transformer with BlenderBot-90M's shape (built
once, cached in $BENCH_PEER_DIR or the temp directory), loaded the way the service loads it
(`load_shared_agent`, SEARCH_IMPL=fast, fp32, one torch thread). Each variant runs in its own
process with an empty inductor cache (so its compile time is the cold one a first model load
pays) and is compared, in that same process and in alternating turns, with the eager step:

  step         `torch.compile(FastDecoder.hidden, dynamic=True)`: the whole decoder step (8
               layers, the growing self-attention cache included), as it is written
  step_freeze  the same with inductor's `freezing` (weights folded in as constants, linear
               layers prepacked for oneDNN)
  loop         the 8 layers as one graph with dynamic shapes from the third step on (the
               embedding stays eager: ParlAI's `.item()` check on the positions breaks the graph)
  loop_freeze  the same with `freezing`
  layers       only the fixed-shape parts of each layer compiled (q/k/v projections; output
               projection + residual + norm + cross-attention query; output projection +
               residual + norms + FFN), the two attention products left eager

Cells: (batch, beam) = (1, 1), (1, 10), (8, 1), (8, 10); greedy is beam 1, as in bench.peer.
Figures per variant: ms per decoder step (`hidden` + `advance`, teacher-forced, averaged over
`--tokens` steps), s per reply (`agent._generate`, exactly `--tokens` new tokens), compile
seconds (first pass over every cell less a steady pass), the largest hidden-state difference
from eager, and whether every reply has eager's tokens. A variant whose first pass runs past
`--compile-limit` seconds is abandoned (reported with the cells it compiled). RESULT lines
(eager over compiled: above 1 is a gain) and bench/results/compile_probe.json.

What it found (docs/benchmarks.md, "Compiling the decoder step"; 2 shared AMD EPYC cores,
torch 2.13.0 CPU): nothing compiled beat the eager step, so there is no COMPILE setting. `step`
and `step_freeze` were abandoned after 300 s of compiling (indexing the cache with the step
number specialises it: a graph per step); `loop` compiled in 57-153 s per search shape and was
9-14% slower per batch-1 reply, `loop_freeze` slower still; `layers` (27 s) was within +-4% of
eager. Hidden states within 4e-6 of eager's and the same tokens in every variant.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from bench import common

VARIANTS = ("step", "step_freeze", "loop", "loop_freeze", "layers")
CELLS = ((1, 1), (1, 10), (8, 1), (8, 10))


class Abandoned(Exception):
    """The variant's compile ran past its limit."""


def _alarm(signum: int, frame: Any) -> None:
    raise Abandoned


def abandoned(error: BaseException | None) -> bool:
    """True when `error` is, or wraps, `Abandoned` (inductor re-raises it as its own error)."""
    while error is not None:
        if isinstance(error, Abandoned) or "Abandoned" in repr(error):
            return True
        error = error.__cause__ or error.__context__
    return False


def cell_name(bsz: int, beam: int) -> str:
    """ "b1_greedy", "b8_beam10"."""
    return f"b{bsz}_" + ("greedy" if beam == 1 else f"beam{beam}")


def layer_pieces(torch: Any) -> Any:
    """A replacement `FastDecoder.hidden` (xlm variant) whose fixed-shape parts are compiled."""
    import torch.nn.functional as F
    from parlai.utils.torch import neginf

    from bot.inference.fastgen.steppers import slot_products

    def heads(dec: Any, t: Any) -> Any:
        return (
            t.view(dec.rows, 1, dec.heads, dec.dh)
            .transpose(1, 2)
            .contiguous()
            .view(dec.rows * dec.heads, 1, dec.dh)
        )

    def merge(dec: Any, out: Any) -> Any:
        return (
            out.view(dec.rows, dec.heads, 1, dec.dh)
            .transpose(1, 2)
            .contiguous()
            .view(dec.rows, 1, dec.dim)
        )

    def qkv(dec: Any, sa: Any, x: Any) -> Any:
        q = heads(dec, sa.q_lin(x)).div(dec.scale)
        k = sa.k_lin(x).view(dec.rows, dec.heads, dec.dh)
        v = sa.v_lin(x).view(dec.rows, dec.heads, dec.dh)
        return q, k, v

    def mid(dec: Any, layer: Any, attended: Any, residual: Any) -> Any:
        x = layer.self_attention.out_lin(merge(dec, attended))
        x = layer.norm1(x + residual)
        q = heads(dec, layer.encoder_attention.q_lin(x)).div(dec.scale)
        return x, q

    def tail(dec: Any, layer: Any, attended: Any, residual: Any) -> Any:
        x = layer.encoder_attention.out_lin(merge(dec, attended))
        x = layer.norm2(residual + x)
        return layer.norm3(x + layer.ffn(x))

    c_qkv, c_mid, c_tail = (torch.compile(f, dynamic=False) for f in (qkv, mid, tail))

    def cross(dec: Any, q: Any, keys_t: Any, values: Any) -> Any:
        # FastDecoder._cross_attend's products, eager, between the compiled pieces
        if not dec.compact:
            dot = q.bmm(keys_t)
        else:
            dot = slot_products(
                q, keys_t, dec.bsz, dec.beam, dec.heads, dec.length, exact=dec.exact
            )
            dot = dot.view(dec.rows * dec.heads, 1, dec.length)
        dot.masked_fill_(dec.cross_fill, neginf(dot.dtype))
        weights = F.softmax(dot, dim=-1, dtype=torch.float).type_as(q)
        if not dec.compact:
            return weights.bmm(values)
        out = slot_products(weights, values, dec.bsz, dec.beam, dec.heads, dec.dh, exact=dec.exact)
        return out.view(dec.rows * dec.heads, 1, dec.dh)

    def hidden(dec: Any, step: int) -> Any:
        assert dec.variant == "xlm", "the probe's pieces follow the xlm variant only"
        t = step
        positions = torch.tensor([[t]], dtype=torch.long, device=dec.tokens.device)
        x = dec.dec.forward_embedding(dec.tokens, positions)
        width = t + 1
        for layer, cache, (ck, cv) in zip(dec.dec.layers, dec.cache, dec.cross, strict=True):
            residual = x
            q, k, v = c_qkv(dec, layer.self_attention, x)
            cache[0, :, :, t] = k
            cache[1, :, :, t] = v
            keys = cache[0].view(dec.rows * dec.heads, -1, dec.dh)[:, :width]
            values = cache[1].view(dec.rows * dec.heads, -1, dec.dh)[:, :width]
            weights = F.softmax(q.bmm(keys.transpose(1, 2)), dim=-1, dtype=torch.float)
            x, q = c_mid(dec, layer, weights.type_as(x).bmm(values), residual)
            x = c_tail(dec, layer, cross(dec, q, ck, cv), x)
        dec.step = t + 1
        return x

    return hidden


def layer_loop(torch: Any) -> Any:
    """A replacement `FastDecoder.hidden` whose layer loop (after the embedding, which
    ParlAI's `.item()` check keeps out of a graph) is one graph with dynamic shapes, from the
    third step on (steps 0 and 1 would each get a graph of their own: dynamo specialises 0
    and 1)."""
    from bot.inference.fastgen.steppers import FastDecoder, after_self_attention

    eager = FastDecoder.hidden

    def loop(dec: Any, x: Any, t: int) -> Any:
        width = t + 1
        for ops, cache, (ck, cv) in zip(dec.ops, dec.cache, dec.cross, strict=True):
            residual = x
            q, k, v = ops.project(x)
            # a slice, not an index: indexing with `t` would specialise it (a graph per step)
            cache[0, :, :, t:width] = k.view(dec.rows, dec.heads, 1, dec.dh)
            cache[1, :, :, t:width] = v.view(dec.rows, dec.heads, 1, dec.dh)
            keys = cache[0].view(dec.rows * dec.heads, -1, dec.dh)[:, :width]
            values = cache[1].view(dec.rows * dec.heads, -1, dec.dh)[:, :width]
            x = dec._self_attend(ops, x, q, keys.transpose(1, 2), values)
            x = after_self_attention(ops, dec.variant, x, residual, dec._cross_attend, ck, cv)
        return x

    compiled = torch.compile(loop, dynamic=True)

    def hidden(dec: Any, step: int) -> Any:
        assert dec.variant == "xlm", "no norm before the layers or after them (xlm)"
        if step < 2:
            return eager(dec, step)
        positions = torch.tensor([[step]], dtype=torch.long, device=dec.tokens.device)
        x = compiled(dec, dec.dec.forward_embedding(dec.tokens, positions), step)
        dec.step = step + 1
        return x

    return hidden


def run_variant(
    variant: str, tokens: int, rounds: int, limit: float, cells: tuple[tuple[int, int], ...]
) -> dict[str, Any]:
    """In this process: load, time eager, compile `variant`, time both in turns, compare."""
    import torch
    from parlai.core.torch_agent import Batch

    from bench import peer
    from bot.inference.fastgen import beam as fbeam
    from bot.inference.fastgen.steppers import FastDecoder

    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 512)
    plan = peer.Plan(tokens=tokens)
    model_file = peer.build_parlai(plan)
    agent = peer.load_ours(model_file, tokens, "fp32", threads=1)
    model = agent.model
    contexts = peer.make_contexts(8, 64, 128, plan.vocab, seed=0)
    forced = peer.make_contexts(1, tokens, tokens, plan.vocab, seed=1)[0]
    eager_hidden = FastDecoder.hidden
    compiled = {"on": False}
    if variant.endswith("_freeze"):
        torch._inductor.config.freezing = True
    if variant == "layers":
        fast = layer_pieces(torch)
    elif variant.startswith("loop"):
        fast = layer_loop(torch)
    else:
        fast = torch.compile(eager_hidden, dynamic=True)

    def hidden(self: Any, step: int) -> Any:
        return (fast if compiled["on"] else eager_hidden)(self, step)

    FastDecoder.hidden = hidden  # type: ignore[method-assign]

    def batch_of(bsz: int) -> Any:
        chosen = contexts[:bsz]
        ids, _ = peer._pad(chosen)
        return Batch(text_vec=ids, text_lengths=[len(c) for c in chosen], batchsize=bsz)

    def reply(bsz: int, beam: int) -> tuple[float, list[list[int]]]:
        agent.beam_size = beam
        agent.opt["beam_size"] = beam
        with torch.no_grad():
            started = time.perf_counter()
            preds, _ = agent._generate(batch_of(bsz), beam, tokens)
            seconds = time.perf_counter() - started
        return seconds, [p[0].tolist() for p in preds]

    def steps(bsz: int, beam: int) -> tuple[float, list[Any]]:
        """Teacher-forced: ms per step and the hidden states of every step."""
        batch = batch_of(bsz)
        out = []
        with torch.no_grad():
            enc = fbeam.encode(agent, model, batch)
            dec = FastDecoder(model, enc, bsz, beam, tokens)
            rows = torch.arange(bsz * beam)
            started = time.perf_counter()
            for t in range(tokens):
                out.append(dec.hidden(t).clone())
                dec.advance(rows, torch.full((bsz * beam,), forced[t], dtype=torch.long))
            seconds = time.perf_counter() - started
        return seconds * 1000 / tokens, out

    result: dict[str, Any] = {"variant": variant}
    ref_hidden, ref_tokens = {}, {}
    for bsz, beam in cells:  # the eager reference (and its warm-up)
        _, ref_hidden[(bsz, beam)] = steps(bsz, beam)
        _, ref_tokens[(bsz, beam)] = reply(bsz, beam)

    compiled["on"] = True
    first: dict[tuple[int, int], float] = {}
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(int(limit))
    started = time.perf_counter()
    try:
        for cell in cells:
            t0 = time.perf_counter()
            steps(*cell)
            reply(*cell)
            first[cell] = time.perf_counter() - t0
    except Exception as error:
        if not abandoned(error):
            raise
        result["abandoned_after_s"] = round(time.perf_counter() - started, 1)
        result["cells_compiled"] = [cell_name(*c) for c in first]
        return result
    finally:
        signal.alarm(0)
    warmup = time.perf_counter() - started

    timings: dict[str, dict[tuple[int, int], list[float]]] = {
        f"{mode}_{kind}": {c: [] for c in cells}
        for mode in ("eager", "compiled")
        for kind in ("step_ms", "reply_s")
    }
    diffs: dict[tuple[int, int], float] = {}
    same: dict[tuple[int, int], bool] = {}
    for r in range(rounds):
        for mode in ("eager", "compiled") if r % 2 == 0 else ("compiled", "eager"):
            compiled["on"] = mode == "compiled"
            for cell in cells:
                ms, hid = steps(*cell)
                seconds, toks = reply(*cell)
                timings[f"{mode}_step_ms"][cell].append(ms)
                timings[f"{mode}_reply_s"][cell].append(seconds)
                if mode == "compiled":
                    pairs = zip(hid, ref_hidden[cell], strict=True)
                    gap = max(float((a - b).abs().max()) for a, b in pairs)
                    diffs[cell] = max(diffs.get(cell, 0.0), gap)
                    same[cell] = same.get(cell, True) and toks == ref_tokens[cell]
    steady = sum(
        statistics.median(timings["compiled_step_ms"][c]) * tokens / 1000
        + statistics.median(timings["compiled_reply_s"][c])
        for c in cells
    )
    result["compile_s"] = round(warmup - steady, 1)
    result["first_pass_s"] = {cell_name(*c): round(s, 1) for c, s in first.items()}
    for key, per_cell in timings.items():
        result[key] = {cell_name(*c): round(statistics.median(v), 4) for c, v in per_cell.items()}
    result["hidden_max_abs_diff"] = {cell_name(*c): d for c, d in diffs.items()}
    result["max_abs_hidden"] = max(
        float(h.abs().max()) for per_cell in ref_hidden.values() for h in per_cell
    )
    result["same_tokens"] = {cell_name(*c): s for c, s in same.items()}

    # A reply on an input of a length not seen yet: does it recompile?
    contexts[0] = peer.make_contexts(1, 97, 97, plan.vocab, seed=7)[0]
    for mode in ("eager", "compiled"):
        compiled["on"] = mode == "compiled"
        result[f"{mode}_new_length_reply_s"] = round(reply(1, 1)[0], 3)
    counters = torch._dynamo.utils.counters
    result["dynamo_frames"] = dict(counters["frames"])
    result["dynamo_unique_graphs"] = counters["stats"].get("unique_graphs", 0)
    return result


def main(argv: list[str] | None = None) -> int:
    """Each variant in its own process (cold inductor cache); RESULT lines and a JSON file."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--tokens", type=int, default=32, help="new tokens per reply")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds (median reported)")
    parser.add_argument("--compile-limit", type=float, default=300.0, help="seconds")
    parser.add_argument("--batches", default="1,8", help="batch sizes of the cells, e.g. 1")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        batches = {int(b) for b in args.batches.split(",")}
        cells = tuple(c for c in CELLS if c[0] in batches)
        out = run_variant(args.one, args.tokens, args.rounds, args.compile_limit, cells)
        print("PROBE " + json.dumps(out), flush=True)
        return 0
    found = []
    for variant in args.variants.split(","):
        env = dict(os.environ, TQDM_DISABLE="1")
        with tempfile.TemporaryDirectory(prefix="inductor-") as cache:
            env["TORCHINDUCTOR_CACHE_DIR"] = cache
            command = [sys.executable, "-m", "bench.compile_probe", "--one", variant]
            command += ["--tokens", str(args.tokens), "--rounds", str(args.rounds)]
            command += ["--compile-limit", str(args.compile_limit), "--batches", args.batches]
            started = time.perf_counter()
            proc = subprocess.run(
                command, env=env, capture_output=True, text=True, cwd=common.ROOT, check=False
            )
        lines = [x for x in proc.stdout.splitlines() if x.startswith("PROBE ")]
        if not lines:
            print(proc.stdout[-3000:], proc.stderr[-3000:], file=sys.stderr)
            found.append({"variant": variant, "failed": proc.returncode})
            continue
        out = json.loads(lines[-1][len("PROBE ") :])
        out["process_s"] = round(time.perf_counter() - started, 1)
        print(json.dumps(out, indent=1), flush=True)
        found.append(out)
        for cell in out.get("eager_reply_s", {}):
            for kind in ("step_ms", "reply_s"):
                e, c = out[f"eager_{kind}"][cell], out[f"compiled_{kind}"][cell]
                print(f"RESULT compile_{variant}_{cell}_{kind}_speedup={e / c:.3f}")
    common.write_json("compile_probe", {"tokens": args.tokens, "variants": found})
    return 0


if __name__ == "__main__":
    sys.exit(main())
