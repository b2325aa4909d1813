"""Our generation side by side with HF transformers and CTranslate2, on one model, in one run.

    python -m bench.peer [--quick] [--systems ...] [--batches 1,8] [--threads 1] [--rounds 3]
                         [--device cpu|cuda]

One random-weight ParlAI transformer/generator with BlenderBot-90M's shape (8+8 layers, 512
dims, 16 heads, FFN 2048, xlm variant, gelu, learned positions, a synthetic 54,944-entry
dictionary) is built once; its weights are copied into HF's
`BlenderbotSmallForConditionalGeneration` (checked: one forward pass gives ParlAI's logits) and
converted from there for CTranslate2. Every system gets the same input token ids and generates
exactly `--tokens` new tokens per reply (min length = max length: end-of-sequence is blocked
until then, no n-gram blocking), so the work per reply is equal; that is checked (tokens per
reply, every system) and the greedy replies are compared with HF's. Each of our faster modes is
compared with ours_batch_fp32 (the default): identical replies in percent and, where they
differ, the gap in fp32 sequence score (`sequence_scores`, scored by the fp32 worker).

Systems (each in its own spawned worker process, loaded once; in every round and cell they take
turns in rotated order, one at a time; the figure is the median over rounds):

  ours_batch_fp32/int8/bf16  the service's batched search: the agent from
                        `load_shared_agent` (QUANTIZE=none|int8 or DTYPE=bf16, SEARCH_IMPL=fast),
                        `agent._generate` on a batch (SCHEDULER=batch's path,
                        bot/inference/batcher.py); int8 includes the int8 output projection
  ours_batch_int8lin    QUANTIZE=int8 as it was before the output projection was quantized
                        (linear layers only): what the int8 projection adds
  ours_batch_int8bucket QUANTIZE=int8 with ENCODER_BUCKETS=on (both opt-in): the encoder over
                        buckets of similar length instead of one batch padded to the longest
  ours_batch/cont_int8slots  QUANTIZE=int8 with the default's per-slot cross-attention products
                        (as before steppers.slot_products merged a chat's beam slots for
                        quantized and cast models): what that merge adds
  ours_batch_int8prev   QUANTIZE=int8 as it was before that merge, the fused encoder
                        self-attention (fastgen/encoder.py), the row blocks and the q / k / v
                        merge below
  ours_batch/cont_int8qkv3   QUANTIZE=int8 with each self-attention's q / k / v as three
                        products (as before fastgen/qkv.py merged them): what the merge adds;
                        the same replies to the bit
  ours_batch/cont_int8whole  QUANTIZE=int8 with the projection, log-softmax and top-k over all
                        rows at once (as before fastgen/projection.py's row blocks): what the
                        blocks add; the same replies to the bit
  ours_cont_fp32/int8/bf16   the continuous scheduler's search (SCHEDULER=continuous, the
                        default): `fastgen.continuous.ContinuousSearch`, every chat joins at 0
  hf_fp32               transformers `generate` (sdpa attention, KV cache)
  ct2_fp32/int8         CTranslate2 `Translator.translate_batch`, compute_type float32 / int8

On a CPU without AMX or AVX-512-bf16 (an AVX2-only machine) the bf16 systems are skipped, as the
service refuses DTYPE=bf16 there: a note under the table says so ("skipped: CPU lacks
avx512_bf16/amx"), and the JSON's plan lists them under `skipped`.

`--device cuda` runs every system on the GPU (ours with MODEL_DEVICE=cuda, HF's model moved
there, CTranslate2's Translator on device "cuda"; each timed reply ends with a
`torch.cuda.synchronize()`), and skips the same way what cannot run there: our int8 systems
(QUANTIZE=int8 is CPU-only), bf16 on a GPU without it, CTranslate2 where its build has no CUDA.
Building the model, the HF copy and the checks stay on the CPU. Without a CUDA device it stops
at once (exit status 2). Its outputs are named `peer-cuda` (`peer-quick-cuda`), its RESULT lines
`peer_cuda_...`, so a GPU run never overwrites a CPU one.

`--isa avx2` runs every system on its libraries' AVX2 code paths (PyTorch's ATEN_CPU_CAPABILITY,
FBGEMM_ENABLE_INSTRUCTIONS, ONEDNN_MAX_CPU_ISA, MKL_ENABLE_INSTRUCTIONS, CT2_FORCE_CPU_ISA), so
an AVX-512 machine runs the kernels an AVX2-only CPU would; its caches, memory and clocks stay
its own, so the figures stand for the kernels, not for that CPU. The bf16 systems are skipped
(AVX2 has no bf16); the run stops if PyTorch does not report AVX2. Outputs `peer-avx2`, RESULT
lines `peer_avx2_...`.

Greedy is ParlAI's beam search with beam 1 for ours (ParlAI's greedy ignores the min length);
the same search. CTranslate2 has no BlenderBot-Small loader: its BART loader is used, and its
BART decoder applies the embedding layer norm after adding the positions, where BlenderBot-Small
(and ParlAI's xlm decoder) apply it before. So CTranslate2 runs a slightly different model with
the same weights and the same arithmetic cost; its replies are checked against HF's
`BartForConditionalGeneration` holding the same weights (that layout), not against ours.

Timed: generation from token ids to token ids (the encoder included); not tokenizing, history
or detokenizing, which only our service does. Outputs: RESULT lines, a table,
bench/results/peer.json (peer-quick.json for --quick) and a PNG beside it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import re
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench import common

SYSTEMS = (
    "ours_batch_fp32",
    "ours_batch_int8",
    "ours_batch_int8lin",
    "ours_batch_int8slots",
    "ours_batch_int8bucket",
    "ours_batch_int8prev",
    "ours_batch_int8whole",
    "ours_batch_int8qkv3",
    "ours_batch_bf16",
    "ours_cont_fp32",
    "ours_cont_int8",
    "ours_cont_bf16",
    "ours_cont_int8slots",
    "ours_cont_int8whole",
    "ours_cont_int8qkv3",
    "hf_fp32",
    "ct2_fp32",
    "ct2_int8",
)
OURS = tuple(s for s in SYSTEMS if s.startswith("ours_"))
# Ours as they were before a change, kept to measure what the change adds: never "our best".
BEFORE = (
    "ours_batch_int8lin",
    "ours_batch_int8slots",
    "ours_cont_int8slots",
    "ours_batch_int8prev",
    "ours_batch_int8whole",
    "ours_cont_int8whole",
    "ours_batch_int8qkv3",
    "ours_cont_int8qkv3",
)
# The default (fp32, bit for bit ParlAI's): what our faster modes' replies are compared with.
REFERENCE = "ours_batch_fp32"
# Ours in bf16 need native bf16 (AMX or AVX-512-bf16): the service refuses DTYPE=bf16 on a CPU
# without it (bot.inference.model.model_dtype), so a run there skips them and says so.
BF16 = tuple(s for s in SYSTEMS if s.endswith("_bf16"))
LACKS_BF16 = "skipped: CPU lacks avx512_bf16/amx"
LACKS_CUDA_INT8 = "skipped: QUANTIZE=int8 is CPU-only"
LACKS_CUDA_BF16 = "skipped: GPU lacks bf16"
LACKS_CT2_CUDA = "skipped: CTranslate2 without CUDA"
DEVICES = ("cpu", "cuda")
# --isa avx2: every library's own switch to its AVX2 code paths, set before any worker starts,
# so an AVX-512 CPU runs the kernels an AVX2-only CPU would (its caches, memory and clocks stay
# its own). bot/inference/hardware.py reads FBGEMM's to choose the int8 activation range.
ISA_ENV: dict[str, dict[str, str]] = {
    "native": {},
    "avx2": {
        "ATEN_CPU_CAPABILITY": "avx2",
        "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
        "CT2_FORCE_CPU_ISA": "AVX2",
    },
}
FORCED_AVX2_BF16 = "skipped: --isa avx2 (AVX2 has no bf16)"
# ParlAI's dictionary starts with these four, and HF's BlenderBot-Small uses the same ids.
NULL, START, END, UNK = 0, 1, 2, 3
SPECIALS = ("__null__", "__start__", "__end__", "__unk__")


# --- the plan -------------------------------------------------------------------------------


@dataclass
class Plan:
    """What one run measures."""

    tokens: int = 20  # new tokens per reply
    beam: int = 10
    batches: tuple[int, ...] = (1, 8, 32)
    threads: tuple[int, ...] = (1, 2)
    rounds: int = 3
    systems: tuple[str, ...] = SYSTEMS
    vocab: int = common.DICT_SIZE
    layers: int = common.N_LAYERS
    dim: int = common.EMBEDDING_SIZE
    heads: int = common.N_HEADS
    ffn: int = common.FFN_SIZE
    context: tuple[int, int] = (64, 128)  # input length range, tokens
    seed: int = 0
    quick: bool = False
    # Systems asked for that this machine cannot run, each with why (device_skips); not in
    # `systems`.
    skipped: dict[str, str] = field(default_factory=dict)
    device: str = "cpu"  # where the systems run: cpu or cuda (preparing is on the CPU)
    isa: str = "native"  # "avx2": the libraries' AVX2 code paths (ISA_ENV)

    @property
    def decodings(self) -> tuple[tuple[str, int], ...]:
        """(name, beam size) of each decoding measured."""
        return (("greedy", 1), (f"beam{self.beam}", self.beam))

    def cells(self) -> list[tuple[str, int, int, int]]:
        """(decoding, beam, batch, threads) of every measured cell, in run order."""
        return [
            (name, beam, batch, threads)
            for threads in self.threads
            for name, beam in self.decodings
            for batch in self.batches
        ]

    def model_dir(self) -> Path:
        """Where the model and its HF / CTranslate2 copies are kept (built once)."""
        base = os.environ.get("BENCH_PEER_DIR") or tempfile.gettempdir()
        shape = f"v{self.vocab}-l{self.layers}-d{self.dim}-h{self.heads}-f{self.ffn}"
        return Path(base) / f"bot-bench-peer-{shape}"


def quick_plan() -> Plan:
    """A few minutes on 2 loaded cores: the full model, shorter replies, beam 4, batch 1/8."""
    return Plan(
        tokens=16, beam=4, batches=(1, 8), threads=(1,), rounds=3, context=(32, 48), quick=True
    )


def parse_ints(text: str) -> tuple[int, ...]:
    """ "1,8,32" -> (1, 8, 32)."""
    return tuple(int(part) for part in text.split(",") if part.strip())


def plan_from_args(argv: Sequence[str] | None) -> Plan:
    """The plan the command line asks for."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few minutes (see quick_plan)")
    parser.add_argument("--tokens", type=int, help="new tokens per reply")
    parser.add_argument("--beam", type=int, help="beam size of the beam cells")
    parser.add_argument("--batches", type=parse_ints, help="batch sizes, e.g. 1,8,32")
    parser.add_argument("--threads", type=parse_ints, help="thread counts, e.g. 1,2")
    parser.add_argument("--rounds", type=int, help="timed rounds (median reported)")
    parser.add_argument("--systems", help="comma-separated subset of " + ",".join(SYSTEMS))
    parser.add_argument("--vocab", type=int, help="dictionary size (default BlenderBot-90M's)")
    parser.add_argument("--tiny", action="store_true", help="a 2-layer, 64-dim model (smoke test)")
    parser.add_argument(
        "--device", choices=DEVICES, default="cpu", help="where the systems run (default cpu)"
    )
    parser.add_argument(
        "--isa",
        choices=tuple(ISA_ENV),
        default="native",
        help="avx2: PyTorch, FBGEMM, oneDNN, MKL and CTranslate2 on their AVX2 code paths, as "
        "on an AVX2-only CPU (default: what this CPU has)",
    )
    args = parser.parse_args(argv)
    plan = quick_plan() if args.quick else Plan()
    plan.device = args.device
    plan.isa = args.isa
    if plan.isa != "native" and plan.device != "cpu":
        parser.error("--isa is for --device cpu")
    if args.tiny:
        plan.layers, plan.dim, plan.heads, plan.ffn, plan.vocab = 2, 64, 4, 128, 1000
    for name in ("tokens", "beam", "batches", "threads", "rounds", "vocab"):
        value = getattr(args, name)
        if value is not None:
            setattr(plan, name, value)
    if args.systems:
        chosen = tuple(s.strip() for s in args.systems.split(",") if s.strip())
        unknown = [s for s in chosen if s not in SYSTEMS]
        if unknown:
            parser.error(f"unknown systems {unknown}; known: {', '.join(SYSTEMS)}")
        plan.systems = chosen
    if plan.tokens < 2:
        parser.error("--tokens must be at least 2")
    return plan


def cpu_has_bf16() -> bool:
    """Native bf16 on this CPU, as the service judges it (tests replace this)."""
    from bot.inference import hardware

    return hardware.has_bf16()


def cpu_skips(systems: Sequence[str]) -> dict[str, str]:
    """The systems of `systems` this CPU cannot run, each with the note the table gives."""
    if not any(s in BF16 for s in systems) or cpu_has_bf16():
        return {}
    return {s: LACKS_BF16 for s in systems if s in BF16}


def fit_to_cpu(plan: Plan) -> Plan:
    """`plan` less the systems this CPU cannot run (in `plan.skipped`, with why)."""
    if plan.isa == "avx2":
        skipped = {s: FORCED_AVX2_BF16 for s in plan.systems if s in BF16}
    else:
        skipped = cpu_skips(plan.systems)
    plan.skipped = {**plan.skipped, **skipped}
    plan.systems = tuple(s for s in plan.systems if s not in skipped)
    return plan


def cuda_has_bf16() -> bool:
    """Native bf16 on this GPU, as the service judges it (bot.inference.model.model_dtype)."""
    import torch

    return bool(torch.cuda.is_bf16_supported())


def ct2_has_cuda() -> bool:
    """Whether this CTranslate2 build sees a CUDA device."""
    try:
        import ctranslate2
    except ImportError:
        return False
    return int(ctranslate2.get_cuda_device_count()) > 0


def cuda_skips(systems: Sequence[str]) -> dict[str, str]:
    """The systems of `systems` that cannot run on the GPU, each with the note the table gives."""
    out: dict[str, str] = {}
    for s in systems:
        if s in OURS and "_int8" in s:
            out[s] = LACKS_CUDA_INT8
    if any(s in BF16 for s in systems) and not cuda_has_bf16():
        out.update({s: LACKS_CUDA_BF16 for s in systems if s in BF16})
    if any(s.startswith("ct2_") for s in systems) and not ct2_has_cuda():
        out.update({s: LACKS_CT2_CUDA for s in systems if s.startswith("ct2_")})
    return out


def fit_to_device(plan: Plan) -> Plan:
    """`plan` less the systems this machine cannot run on `plan.device` (in `plan.skipped`,
    with why)."""
    if plan.device == "cpu":
        return fit_to_cpu(plan)
    skipped = cuda_skips(plan.systems)
    plan.skipped = {**plan.skipped, **skipped}
    plan.systems = tuple(s for s in plan.systems if s not in skipped)
    return plan


def skip_notes(skipped: dict[str, str]) -> list[str]:
    """One line per reason: the systems skipped for it."""
    by_reason: dict[str, list[str]] = {}
    for system, why in skipped.items():
        by_reason.setdefault(why, []).append(system)
    return [f"{', '.join(systems)}: {why}" for why, systems in by_reason.items()]


# --- pure helpers (tests/unit/bench/test_bench_peer.py) -------------------------------------------


def make_contexts(n: int, lo: int, hi: int, vocab: int, seed: int = 0) -> list[list[int]]:
    """`n` inputs of lo..hi random ordinary token ids (no special ids), reproducible."""
    rng = random.Random(seed)
    return [[rng.randrange(4, vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def rotated(items: Sequence[str], k: int) -> list[str]:
    """`items` starting at position k (mod len): the turn order of round k."""
    if not items:
        return []
    k %= len(items)
    return [*items[k:], *items[:k]]


def synthetic_vocabulary(size: int) -> list[str]:
    """The dictionary's tokens in id order: ParlAI's four specials, then w4, w5, ..."""
    return [*SPECIALS, *(f"w{i}" for i in range(len(SPECIALS), size))]


_TOP = re.compile(r"^(encoder|decoder)\.(embeddings|position_embeddings|norm_embeddings)\.(.+)$")
_LAYER = re.compile(r"^(encoder|decoder)\.layers\.(\d+)\.(.+)$")
_ENCODER_LAYER = {
    "attention.": "self_attn.",
    "norm1.": "self_attn_layer_norm.",
    "norm2.": "final_layer_norm.",
    "ffn.lin1.": "fc1.",
    "ffn.lin2.": "fc2.",
}
_DECODER_LAYER = {
    "self_attention.": "self_attn.",
    "norm1.": "self_attn_layer_norm.",
    "encoder_attention.": "encoder_attn.",
    "norm2.": "encoder_attn_layer_norm.",
    "norm3.": "final_layer_norm.",
    "ffn.lin1.": "fc1.",
    "ffn.lin2.": "fc2.",
}
_LINEARS = {"q_lin.": "q_proj.", "k_lin.": "k_proj.", "v_lin.": "v_proj.", "out_lin.": "out_proj."}


def parlai_to_hf_key(name: str) -> str | None:
    """The HF BlenderBot-Small parameter a ParlAI transformer/generator parameter becomes
    (None: not a weight, e.g. the START buffer). Raises KeyError on an unknown name."""
    if name == "START":
        return None
    if name == "embeddings.weight":
        return "model.shared.weight"
    top = _TOP.match(name)
    if top:
        side, what, rest = top.groups()
        target = {
            "embeddings": "embed_tokens",
            "position_embeddings": "embed_positions",
            "norm_embeddings": "layernorm_embedding",
        }[what]
        return f"model.{side}.{target}.{rest}"
    layer = _LAYER.match(name)
    if layer:
        side, index, rest = layer.groups()
        table = _ENCODER_LAYER if side == "encoder" else _DECODER_LAYER
        for old, new in table.items():
            if rest.startswith(old):
                rest = new + rest[len(old) :]
                break
        else:
            raise KeyError(name)
        for old, new in _LINEARS.items():
            rest = rest.replace(old, new)
        return f"model.{side}.layers.{index}.{rest}"
    raise KeyError(name)


def agreement(
    ours: Sequence[Sequence[int]], theirs: Sequence[Sequence[int]], upto: int
) -> dict[str, float]:
    """How far two systems' replies agree on their first `upto` tokens: the share of replies
    identical there, and the share of positions before the first difference."""
    if len(ours) != len(theirs) or not ours:
        raise ValueError("agreement needs two equally long, non-empty lists of replies")
    same = 0
    prefix = 0
    for a, b in zip(ours, theirs, strict=True):
        a, b = list(a[:upto]), list(b[:upto])
        same += a == b
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        prefix += n
    return {"replies": same / len(ours), "prefix": prefix / (len(ours) * upto)}


def sequence_scores(
    model: Any, text_vec: Any, replies: Sequence[Sequence[int]], length_penalty: float = 0.65
) -> list[float]:
    """Each reply's fp32 sequence score under `model` (a ParlAI TorchGeneratorModel, fp32):
    the sum of its tokens' log-probabilities given the context row of `text_vec` (teacher
    forced), divided by ParlAI's length penalty ((1 + length) / 6) ** length_penalty, the score
    the beam search ranks its finished hypotheses by."""
    import torch
    import torch.nn.functional as F

    out = []
    with torch.no_grad():
        for i, reply in enumerate(replies):
            ys = torch.tensor([list(reply)], dtype=torch.long, device=text_vec.device)
            logits, _, _ = model(text_vec[i : i + 1], ys=ys)
            lp = F.log_softmax(logits.float(), dim=-1).gather(2, ys.unsqueeze(2))
            penalty = ((1 + len(reply)) / 6) ** length_penalty
            out.append(float(lp.sum()) / penalty)
    return out


def work_check(replies: Sequence[Sequence[int]], tokens: int) -> dict[str, Any]:
    """Tokens per reply: equal work means every reply is exactly `tokens` long."""
    lengths = [len(r) for r in replies]
    return {
        "min": min(lengths, default=0),
        "max": max(lengths, default=0),
        "equal": bool(lengths) and all(n == tokens for n in lengths),
    }


def cell_key(decoding: str, batch: int, threads: int) -> str:
    """The part of a RESULT name that names a cell."""
    return f"{decoding}_b{batch}_t{threads}"


def results(
    cells: Sequence[dict[str, Any]], device: str = "cpu", isa: str = "native"
) -> dict[str, float]:
    """RESULT lines: every system's replies/s in every cell, and our best over CTranslate2
    int8 (when both were measured); named `peer_...` on the CPU, `peer_avx2_...` with --isa
    avx2, `peer_cuda_...` on a GPU."""
    out: dict[str, float] = {}
    base = "peer" if device == "cpu" else f"peer_{device}"
    if isa != "native":
        base = f"peer_{isa}"
    for cell in cells:
        key = cell_key(cell["decoding"], cell["batch"], cell["threads"])
        rps = cell["rps"]
        for system in SYSTEMS:
            if system in rps:
                out[f"{base}_{system}_{key}_rps"] = rps[system]
    for cell in cells:
        key = cell_key(cell["decoding"], cell["batch"], cell["threads"])
        ratio = best_ratio(cell["rps"])
        if ratio is not None:
            out[f"{base}_ratio_{key}"] = ratio
        fp32 = [cell["rps"][s] for s in ("ours_batch_fp32", "ours_cont_fp32") if s in cell["rps"]]
        if fp32 and cell["rps"].get("ct2_fp32"):
            # the goal for the default path: our fp32 against CTranslate2 fp32
            out[f"{base}_fp32_ratio_{key}"] = max(fp32) / cell["rps"]["ct2_fp32"]
    return out


def best_ratio(rps: dict[str, float]) -> float | None:
    """Our best replies/s (a mode a user can set, not one of BEFORE) over CTranslate2 int8's,
    None when either is missing."""
    ours = [v for k, v in rps.items() if k in OURS and k not in BEFORE]
    if not ours or "ct2_int8" not in rps or not rps["ct2_int8"]:
        return None
    return max(ours) / rps["ct2_int8"]


def table_rows(cells: Sequence[dict[str, Any]], systems: Sequence[str]) -> list[list[object]]:
    """One row per cell: its settings, every system's replies/s, our best / CT2 int8."""
    rows: list[list[object]] = []
    for cell in cells:
        ratio = best_ratio(cell["rps"])
        rows.append(
            [
                cell["decoding"],
                cell["batch"],
                cell["threads"],
                *(cell["rps"].get(s, float("nan")) for s in systems),
                "-" if ratio is None else f"x{ratio:.2f}",
            ]
        )
    return rows


def table_headers(systems: Sequence[str]) -> list[str]:
    """Headers matching table_rows."""
    return ["decoding", "batch", "threads", *systems, "ours best / ct2_int8"]


# --- building the model and its copies (in a spawned process: see prepare) ------------------


def _parlai_args(plan: Plan) -> Any:
    def args(model_file: Path) -> list[str]:
        return [
            "--model", "transformer/generator",
            "--model-file", str(model_file),
            "--dict-file", str(model_file) + ".dict",
            "--dict-tokenizer", "re",
            "--n-layers", str(plan.layers),
            "--n-encoder-layers", str(plan.layers),
            "--n-decoder-layers", str(plan.layers),
            "--embedding-size", str(plan.dim),
            "--ffn-size", str(plan.ffn),
            "--n-heads", str(plan.heads),
            "--n-positions", "512",
            "--variant", "xlm",
            "--activation", "gelu",
            "--learn-positional-embeddings", "true",
            "--embeddings-scale", "true",
            "--text-truncate", "512",
            "--truncate", "512",
            "--label-truncate", str(plan.tokens),
            "--inference", "beam",
            "--beam-size", "1",
            "--beam-min-length", str(plan.tokens),
            "--beam-block-ngram", "-1",
            "--beam-context-block-ngram", "-1",
            "--skip-generation", "false",
            "--no-cuda",
            "--datatype", "valid",
        ]  # fmt: skip

    return args


def build_parlai(plan: Plan) -> str:
    """The random-weight ParlAI model (once per shape); returns its model file."""
    from tests.support.tinymodel import build_model

    vocab = synthetic_vocabulary(plan.vocab)

    def fill_dictionary(dictionary: Any, dict_file: str) -> None:
        assert [dictionary[i] for i in range(4)] == list(SPECIALS), "unexpected specials"
        for token in vocab[4:]:
            dictionary.add_token(token)
            dictionary.freq[token] = 1
        assert len(dictionary) == plan.vocab
        dictionary.save(dict_file, sort=False)

    def announce() -> None:
        print(f"building the ParlAI model in {plan.model_dir()} (once)", flush=True)

    return build_model(
        plan.model_dir() / "parlai", _parlai_args(plan), fill_dictionary, announce=announce
    )


def hf_config(plan: Plan, bart: bool = False) -> Any:
    """BlenderBot-Small's config for this shape (or BART's, the layout CTranslate2 runs)."""
    from transformers import BartConfig, BlenderbotSmallConfig

    common_kwargs: dict[str, Any] = {
        "vocab_size": plan.vocab,
        "max_position_embeddings": 512,
        "encoder_layers": plan.layers,
        "decoder_layers": plan.layers,
        "encoder_attention_heads": plan.heads,
        "decoder_attention_heads": plan.heads,
        "encoder_ffn_dim": plan.ffn,
        "decoder_ffn_dim": plan.ffn,
        "d_model": plan.dim,
        "activation_function": "gelu",  # exact (erf) GELU, ParlAI's F.gelu
        "dropout": 0.0,
        "attention_dropout": 0.0,
        "activation_dropout": 0.0,
        "scale_embedding": True,  # ParlAI's --embeddings-scale
        "pad_token_id": NULL,
        "bos_token_id": START,
        "eos_token_id": END,
        "decoder_start_token_id": START,
        "forced_eos_token_id": None,
        "tie_word_embeddings": True,
    }
    if bart:
        # post-norm layers, the embedding layer norm (after the positions, BART's place)
        return BartConfig(
            **common_kwargs,
            normalize_before=False,
            add_final_layer_norm=False,
            normalize_embedding=True,
        )
    return BlenderbotSmallConfig(**common_kwargs)


def hf_decoder_scales_embeddings() -> bool:
    """Whether this transformers' BlenderBot-Small decoder multiplies its token embeddings by
    `embed_scale` (scale_embedding), as its encoder and ParlAI's decoder do. 5.x's does not."""
    import inspect

    from transformers.models.blenderbot_small import modeling_blenderbot_small as module

    source = inspect.getsource(module.BlenderbotSmallDecoder.forward)
    return "embed_scale" in source or "Scaled" in type(module).__name__


def load_hf(hf_dir: str) -> Any:
    """The HF BlenderBot-Small copy, in eval mode, computing what ParlAI's model computes.

    Where the decoder leaves out the embedding scale s (transformers 5.x), the layer norm that
    follows it gets eps / s^2 instead: LayerNorm(s x; eps) = LayerNorm(x; eps / s^2) exactly, so
    the model is ParlAI's again (the output projection, tied to the embeddings, is unscaled in
    both)."""
    from transformers import BlenderbotSmallForConditionalGeneration

    model = BlenderbotSmallForConditionalGeneration.from_pretrained(hf_dir).eval()
    decoder = model.model.decoder
    if model.config.scale_embedding and not hf_decoder_scales_embeddings():
        decoder.layernorm_embedding.eps = decoder.layernorm_embedding.eps / decoder.embed_scale**2
    return model


def parlai_state(model_file: str) -> dict[str, Any]:
    """The ParlAI model's weights as saved."""
    import parlai.utils.pickle
    import torch

    states = torch.load(
        model_file, map_location="cpu", pickle_module=parlai.utils.pickle, weights_only=False
    )
    return dict(states["model"])


def hf_state(parlai: dict[str, Any]) -> dict[str, Any]:
    """ParlAI's weights under HF BlenderBot-Small's names (the output projection is tied)."""
    out = {}
    for name, tensor in parlai.items():
        key = parlai_to_hf_key(name)
        if key is not None:
            out[key] = tensor
    out["lm_head.weight"] = parlai["embeddings.weight"]
    return out


def load_into(model: Any, state: dict[str, Any]) -> None:
    """Copy `state` into an HF model; every parameter must come from it."""
    import torch

    own = model.state_dict()
    missing = [k for k in own if k not in state and k != "final_logits_bias"]
    extra = [k for k in state if k not in own]
    if missing or extra:
        raise RuntimeError(f"weight copy: missing {missing[:5]}, unexpected {extra[:5]}")
    for key, tensor in state.items():
        if own[key].shape != tensor.shape:
            raise RuntimeError(f"weight copy: {key} {tuple(tensor.shape)} vs {own[key].shape}")
    with torch.no_grad():
        for key, tensor in state.items():
            own[key].copy_(tensor)
        own["final_logits_bias"].zero_()


def bart_state(hf: dict[str, Any], dim: int) -> dict[str, Any]:
    """BlenderBot-Small's weights for HF's BART (its learned positions start at offset 2)."""
    import torch

    out = dict(hf)
    for side in ("encoder", "decoder"):
        key = f"model.{side}.embed_positions.weight"
        out[key] = torch.cat([torch.zeros(2, dim, dtype=hf[key].dtype), hf[key]])
    return out


class _Vocabulary:
    """What CTranslate2's BART loader asks of a tokenizer, for the synthetic dictionary."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.bos_token, self.eos_token, self.unk_token = (
            SPECIALS[START],
            SPECIALS[END],
            SPECIALS[UNK],
        )

    def get_vocab(self) -> dict[str, int]:
        return {t: i for i, t in enumerate(self.tokens)}

    def convert_ids_to_tokens(self, ids: Any) -> Any:
        if isinstance(ids, int):
            return self.tokens[ids]
        return [self.tokens[i] for i in ids]


def convert_ct2(hf_dir: Path, out_dir: Path, tokens: list[str]) -> None:
    """CTranslate2's TransformersConverter on the HF BlenderBot-Small model, through its BART
    loader (CTranslate2 has no BlenderBot-Small one; the layers and names are BART's)."""
    from ctranslate2.converters import transformers as ct2_transformers

    class BlenderbotSmallLoader(ct2_transformers.BartLoader):  # type: ignore[misc]
        @property
        def architecture_name(self) -> str:
            return "BlenderbotSmallForConditionalGeneration"

        def get_model_spec(self, model: Any) -> Any:
            model.config.normalize_before = False  # post-norm, like BlenderBot-Small
            model.config.normalize_embedding = True
            return super().get_model_spec(model)

    ct2_transformers.register_loader("BlenderbotSmallConfig")(BlenderbotSmallLoader)

    class Converter(ct2_transformers.TransformersConverter):  # type: ignore[misc]
        def load_tokenizer(self, tokenizer_class: Any, path: Any, **kwargs: Any) -> Any:
            return _Vocabulary(tokens)

    Converter(str(hf_dir)).convert(str(out_dir), force=True)


def _pad(contexts: Sequence[Sequence[int]]) -> tuple[Any, Any]:
    """Right-padded ids (pad 0, ParlAI's and HF's) and the attention mask."""
    import torch

    width = max(len(c) for c in contexts)
    ids = torch.full((len(contexts), width), NULL, dtype=torch.long)
    for i, c in enumerate(contexts):
        ids[i, : len(c)] = torch.tensor(c, dtype=torch.long)
    return ids, (ids != NULL).long()


def hf_generation(beam: int, tokens: int) -> Any:
    """Exactly `tokens` new tokens, no early stop, no n-gram blocking; the start token never
    generated (ParlAI's output layer masks it)."""
    from transformers import GenerationConfig

    return GenerationConfig(
        max_new_tokens=tokens,
        min_new_tokens=tokens,
        num_beams=beam,
        num_return_sequences=1,
        do_sample=False,
        early_stopping=False,
        length_penalty=1.0,
        no_repeat_ngram_size=0,
        suppress_tokens=[START],
        forced_eos_token_id=None,
        decoder_start_token_id=START,
        bos_token_id=START,
        eos_token_id=END,
        pad_token_id=NULL,
        use_cache=True,
    )


def prepare(plan: Plan, greedy_contexts: list[list[int]]) -> dict[str, Any]:
    """Build (once) the ParlAI model, its HF copy and its CTranslate2 conversion; verify them
    (every run) and compute the reference replies CTranslate2 is checked against."""
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(2)
    directory = plan.model_dir()
    model_file = build_parlai(plan)
    hf_dir, ct2_dir = directory / "hf", directory / "ct2"
    report: dict[str, Any] = {
        "model_dir": str(directory),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }

    from transformers import BartForConditionalGeneration, BlenderbotSmallForConditionalGeneration

    parlai_weights = parlai_state(model_file)
    state = hf_state(parlai_weights)
    if not (hf_dir / "config.json").exists():
        hf = BlenderbotSmallForConditionalGeneration(hf_config(plan))
        load_into(hf, state)
        hf.save_pretrained(str(hf_dir))
    hf = load_hf(str(hf_dir))
    report["hf_decoder_scale_workaround"] = not hf_decoder_scales_embeddings()
    bart = BartForConditionalGeneration(hf_config(plan, bart=True)).eval()
    load_into(bart, bart_state(state, plan.dim))
    tokens = synthetic_vocabulary(plan.vocab)
    if not (ct2_dir / "model.bin").exists():
        convert_ct2(hf_dir, ct2_dir, tokens)

    # One teacher-forced forward pass, ParlAI's model against the HF copy (one input padded).
    agent = load_ours(model_file, plan.tokens, "none", threads=2)
    model = agent.model
    rng = random.Random(plan.seed + 1)
    ctx = [
        make_contexts(1, 40, 40, plan.vocab, plan.seed + 2)[0],
        make_contexts(1, 25, 25, plan.vocab, plan.seed + 3)[0],
    ]
    ids, mask = _pad(ctx)
    target = [rng.randrange(4, plan.vocab) for _ in range(plan.tokens - 1)]
    dec = torch.tensor([[START, *target]] * len(ctx), dtype=torch.long)
    with torch.no_grad():
        enc = model.encoder(ids)
        out, _ = model.decoder(dec, enc)
        ref = model.output(out)
        theirs = hf(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits
        bart_logits = bart(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits
    keep = torch.ones(plan.vocab, dtype=torch.bool)
    keep[START] = False  # ParlAI sets it to -inf
    diff = (ref[..., keep] - theirs[..., keep]).abs()
    report["hf_vs_parlai_logits"] = {
        "max_abs_diff": float(diff.max()),
        "max_abs_logit": float(ref[..., keep].abs().max()),
        "passed": bool(diff.max() < 1e-4 * max(1.0, float(ref[..., keep].abs().max()))),
    }
    layout = (bart_logits[..., keep] - theirs[..., keep]).abs()
    report["bart_layout_vs_blenderbot_small_logits_max_abs_diff"] = float(layout.max())

    # CTranslate2 fp32 scores the same target: log-probs against both HF layouts.
    import ctranslate2

    translator = ctranslate2.Translator(str(ct2_dir), device="cpu", compute_type="float32")
    scored = translator.score_batch(
        [[tokens[i] for i in c] for c in ctx], [[tokens[i] for i in target]] * len(ctx)
    )
    ct2_lp = torch.tensor([r.log_probs[: len(target)] for r in scored])
    full = torch.tensor([START, *target, END])
    idx = full[1 : len(target) + 1]

    def gathered(logits: torch.Tensor) -> torch.Tensor:
        lp = F.log_softmax(logits.float(), dim=-1)
        return lp[:, : len(target)].gather(2, idx.view(1, -1, 1).expand(len(ctx), -1, 1))[..., 0]

    report["ct2_fp32_vs_bart_layout_logprob_max_abs_diff"] = float(
        (ct2_lp - gathered(bart_logits)).abs().max()
    )
    report["ct2_fp32_vs_blenderbot_small_logprob_max_abs_diff"] = float(
        (ct2_lp - gathered(theirs)).abs().max()
    )
    # The replies CTranslate2's greedy ones must match: HF generate on the BART layout.
    ids, mask = _pad(greedy_contexts)
    with torch.no_grad():
        out = bart.generate(
            input_ids=ids, attention_mask=mask, generation_config=hf_generation(1, plan.tokens)
        )
    report["bart_layout_greedy"] = out[:, 1:].tolist()
    report["paths"] = {"parlai": model_file, "hf": str(hf_dir), "ct2": str(ct2_dir)}
    return report


# --- the systems (one per worker process) ---------------------------------------------------


def load_ours(
    model_file: str, tokens: int, precision: str, threads: int, device: str = "cpu"
) -> Any:
    """The shared agent, loaded the way the service loads it (on `device`), with
    fixed-length replies."""
    from bot.config import Settings
    from bot.inference import compat
    from bot.inference.model import load_shared_agent, set_torch_threads

    compat.apply()
    set_torch_threads(threads)
    if precision in ("int8qkv3", "int8prev"):
        from bot.inference.fastgen import qkv

        qkv.use(False)  # this worker process only
    settings = Settings(  # type: ignore[call-arg]
        _env_file=None,
        bot_model=model_file,
        data_dir=Path(model_file).parent / "data",
        model_device=device,
        torch_threads=threads,
        inference="beam",
        beam_size=1,
        beam_min_length=tokens,
        beam_block_ngram=-1,
        beam_context_block_ngram=-1,
        quantize="int8" if precision.startswith("int8") else "none",
        dtype="bf16" if precision == "bf16" else "fp32",
        search_impl="fast",
        encoder_buckets=precision == "int8bucket",
    )
    agent = load_shared_agent(settings)
    if precision == "int8lin":
        from bot.inference.fastgen import projection

        projection.prepare(agent.model, None)  # ParlAI's fp32 F.linear for the projection
    if precision in ("int8slots", "int8prev"):
        from bot.inference.fastgen import steppers

        steppers.use_merged_slots(False)  # this worker process only
    if precision in ("int8whole", "int8prev"):
        from bot.inference.fastgen import projection

        fast = projection.of(agent.model)
        assert fast is not None
        fast.block_rows = 0  # every row at once
    if precision == "int8prev":
        from bot.inference.fastgen import encoder

        encoder.restore(agent.model)
    agent.label_truncate = tokens
    return agent


class Ours:
    """The service's search: `mode` batch (`agent._generate`, the micro-batcher's path) or
    cont (`ContinuousSearch`, the continuous scheduler's)."""

    def __init__(
        self, model_file: str, tokens: int, precision: str, mode: str, device: str = "cpu"
    ) -> None:
        self.agent = load_ours(model_file, tokens, precision, threads=1, device=device)
        self.tokens = tokens
        self.mode = mode
        self.device = device

    def score(self, contexts: list[list[int]], replies: list[list[int]]) -> list[float]:
        """The replies' sequence scores under this system's model (fp32 for the reference)."""
        ids, _ = _pad(contexts)
        return sequence_scores(self.agent.model, ids.to(self.device), replies)

    def run(self, beam: int, contexts: list[list[int]]) -> tuple[float, list[list[int]]]:
        import torch
        from parlai.core.torch_agent import Batch

        agent = self.agent
        agent.beam_size = beam
        agent.opt["beam_size"] = beam
        if self.mode == "batch":
            ids, _ = _pad(contexts)
            batch = Batch(
                text_vec=ids.to(self.device),
                text_lengths=[len(c) for c in contexts],
                batchsize=len(contexts),
            )
            with torch.no_grad():
                common.sync(self.device)
                started = time.perf_counter()
                preds, _ = agent._generate(batch, beam, self.tokens)
                common.sync(self.device)
                seconds = time.perf_counter() - started
            return seconds, [p[0].tolist()[1:] for p in preds]
        from bot.inference.fastgen.continuous import ContinuousSearch

        out: dict[int, list[int]] = {}
        with torch.no_grad():
            common.sync(self.device)
            started = time.perf_counter()
            search = ContinuousSearch(agent)
            for i, c in enumerate(contexts):
                one = torch.tensor([c], dtype=torch.long, device=self.device)
                search.join(i, Batch(text_vec=one, text_lengths=[len(c)], batchsize=1))
            while len(out) < len(contexts):
                for chat in search.step():
                    out[chat.key] = chat.result().get_rescored_finished(1)[0][0].tolist()
            common.sync(self.device)
            seconds = time.perf_counter() - started
        return seconds, [out[i][1:] for i in range(len(contexts))]


class HF:
    """transformers `generate` on the BlenderBot-Small copy."""

    def __init__(self, hf_dir: str, tokens: int, device: str = "cpu") -> None:
        self.model = load_hf(hf_dir).to(device)
        self.tokens = tokens
        self.device = device

    def run(self, beam: int, contexts: list[list[int]]) -> tuple[float, list[list[int]]]:
        import torch

        ids, mask = (t.to(self.device) for t in _pad(contexts))
        config = hf_generation(beam, self.tokens)
        with torch.no_grad():
            common.sync(self.device)
            started = time.perf_counter()
            out = self.model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
            common.sync(self.device)
            seconds = time.perf_counter() - started
        return seconds, out[:, 1:].tolist()


class CT2:
    """CTranslate2's Translator on the converted model (one per thread count)."""

    def __init__(
        self, ct2_dir: str, tokens: int, compute_type: str, vocab: int, device: str = "cpu"
    ) -> None:
        self.dir = ct2_dir
        self.device = device
        self.tokens = tokens
        self.compute_type = compute_type
        self.vocab = synthetic_vocabulary(vocab)
        self.index = {t: i for i, t in enumerate(self.vocab)}
        self.translators: dict[int, Any] = {}
        self.threads = 1

    def translator(self) -> Any:
        import ctranslate2

        if self.threads not in self.translators:
            self.translators[self.threads] = ctranslate2.Translator(
                self.dir,
                device=self.device,
                compute_type=self.compute_type,
                intra_threads=self.threads,
                inter_threads=1,
            )
        return self.translators[self.threads]

    def run(self, beam: int, contexts: list[list[int]]) -> tuple[float, list[list[int]]]:
        translator = self.translator()
        source = [[self.vocab[i] for i in c] for c in contexts]
        started = time.perf_counter()
        out = translator.translate_batch(
            source,
            beam_size=beam,
            num_hypotheses=1,
            max_decoding_length=self.tokens,
            min_decoding_length=self.tokens,
            length_penalty=1.0,
            no_repeat_ngram_size=0,
            suppress_sequences=[[SPECIALS[START]]],
            max_input_length=0,
            return_end_token=True,
        )
        seconds = time.perf_counter() - started
        return seconds, [[self.index[t] for t in r.hypotheses[0]] for r in out]


def make_system(system: str, paths: dict[str, str], plan: Plan) -> Any:
    """The runner of one system, loaded."""
    if system.startswith("ours_"):
        _, mode, precision = system.split("_")
        return Ours(paths["parlai"], plan.tokens, precision, mode, plan.device)
    if system == "hf_fp32":
        return HF(paths["hf"], plan.tokens, plan.device)
    if system in ("ct2_fp32", "ct2_int8"):
        compute = "float32" if system == "ct2_fp32" else "int8"
        return CT2(paths["ct2"], plan.tokens, compute, plan.vocab, plan.device)
    raise ValueError(system)


def worker_main(conn: Any, system: str, paths: dict[str, str], plan: Plan) -> None:
    """A worker process: load one system, then answer (beam, threads, contexts) requests with
    (seconds, replies) until told None."""
    os.environ.setdefault("TQDM_DISABLE", "1")
    try:
        from bot.inference.model import passive_waiting

        passive_waiting()  # as a model process does, before torch loads
        import torch

        torch.set_num_threads(1)
        runner = make_system(system, paths, plan)
        conn.send(("ready", None))
        while True:
            msg = conn.recv()
            if msg is None:
                break
            if msg[0] == "score":
                conn.send(("ok", runner.score(msg[1], msg[2])))
                continue
            beam, threads, contexts = msg
            torch.set_num_threads(threads)
            if isinstance(runner, CT2):
                runner.threads = threads
            conn.send(("ok", runner.run(beam, contexts)))
    except Exception:  # noqa: BLE001 - reported to the parent, which stops the run
        conn.send(("error", traceback.format_exc()))


def prepare_main(conn: Any, plan: Plan, greedy_contexts: list[list[int]]) -> None:
    """The prepare step in its own process (the parent never loads torch)."""
    os.environ.setdefault("TQDM_DISABLE", "1")
    try:
        conn.send(("ok", prepare(plan, greedy_contexts)))
    except Exception:  # noqa: BLE001 - reported to the parent
        conn.send(("error", traceback.format_exc()))


# --- the run --------------------------------------------------------------------------------


@dataclass
class Worker:
    """The parent's handle on one worker process."""

    system: str
    process: Any
    conn: Any
    seconds: list[float] = field(default_factory=list)

    def ask(self, msg: Any) -> Any:
        self.conn.send(msg)
        return self.answer()

    def answer(self) -> Any:
        kind, payload = self.conn.recv()
        if kind == "error":
            raise RuntimeError(f"{self.system} worker failed:\n{payload}")
        return payload


def spawn(ctx: Any, target: Any, *args: Any) -> tuple[Any, Any]:
    parent, child = ctx.Pipe()
    process = ctx.Process(target=target, args=(child, *args), daemon=True)
    process.start()
    return process, parent


def measure(plan: Plan) -> dict[str, Any]:
    """Prepare, start the workers, run every cell in rotated turns; the payload for the JSON."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    contexts = make_contexts(max(plan.batches), *plan.context, plan.vocab, plan.seed)
    started = time.perf_counter()
    process, conn = spawn(ctx, prepare_main, plan, contexts)
    kind, prep = conn.recv()
    process.join()
    if kind == "error":
        raise RuntimeError(f"prepare failed:\n{prep}")
    print(
        f"prepared in {time.perf_counter() - started:.0f} s: {prep['model_dir']} (PyTorch's "
        f"kernels: {prep['cpu_capability']})",
        flush=True,
    )
    if plan.isa != "native" and prep["cpu_capability"].lower() != plan.isa:
        raise RuntimeError(f"--isa {plan.isa}, but PyTorch runs {prep['cpu_capability']}")
    check = prep["hf_vs_parlai_logits"]
    print(
        f"HF copy vs ParlAI logits: max |diff| {check['max_abs_diff']:.2e} "
        f"(logits up to {check['max_abs_logit']:.1f}): {'ok' if check['passed'] else 'FAILED'}",
        flush=True,
    )
    if not check["passed"]:
        raise RuntimeError("the HF copy does not reproduce ParlAI's logits")

    workers: dict[str, Worker] = {}
    try:
        for system in plan.systems:  # loaded one after another (memory peaks, load noise)
            process, conn = spawn(ctx, worker_main, system, prep["paths"], plan)
            worker = Worker(system, process, conn)
            worker.answer()
            workers[system] = worker
            print(f"  {system} loaded", flush=True)
        # warm-up: one small reply per system and decoding, untimed
        for _, beam in plan.decodings:
            for worker in workers.values():
                worker.ask((beam, plan.threads[0], contexts[:1]))
        cells = []
        replies: dict[tuple[str, int], dict[str, list[list[int]]]] = {}
        times: dict[tuple[str, int, int], dict[str, list[float]]] = {}
        for round_ in range(plan.rounds):
            for i, (decoding, beam, batch, threads) in enumerate(plan.cells()):
                slot = times.setdefault((decoding, batch, threads), {})
                for system in rotated(list(workers), round_ + i):
                    seconds, out = workers[system].ask((beam, threads, contexts[:batch]))
                    slot.setdefault(system, []).append(seconds)
                    if round_ == 0:
                        replies.setdefault((decoding, batch), {})[system] = out
            print(f"round {round_ + 1}/{plan.rounds} done", flush=True)
        gaps = score_gaps(plan, workers.get(REFERENCE), replies, contexts)
    finally:
        for worker in workers.values():
            with contextlib.suppress(BrokenPipeError, OSError):
                worker.conn.send(None)
            worker.process.join(timeout=30)
            if worker.process.is_alive():
                worker.process.terminate()

    for decoding, beam, batch, threads in plan.cells():
        slot = times[(decoding, batch, threads)]
        medians = {s: statistics.median(v) for s, v in slot.items()}
        cells.append(
            {
                "decoding": decoding,
                "beam": beam,
                "batch": batch,
                "threads": threads,
                "seconds": slot,
                "median_s": medians,
                "rps": {s: batch / m for s, m in medians.items()},
            }
        )
    checks = work_and_agreement(plan, replies, prep)
    for key, row in gaps.items():
        checks["agreement"].setdefault(key, {}).update(row)
    checks["replies"] = {f"{d}_b{b}": by_system for (d, b), by_system in replies.items()}
    return {
        "prepare": {k: v for k, v in prep.items() if k != "bart_layout_greedy"},
        "cells": cells,
        **checks,
    }


def score_gaps(
    plan: Plan,
    reference: Worker | None,
    replies: dict[tuple[str, int], dict[str, list[list[int]]]],
    contexts: list[list[int]],
) -> dict[str, dict[str, Any]]:
    """Each of our faster modes against the fp32 default (REFERENCE): identical replies, and
    where they differ, the fp32 sequence score of the default's reply less that of the mode's
    (positive: the default's scores higher), scored by the fp32 worker."""
    out: dict[str, dict[str, Any]] = {}
    if reference is None:
        return out
    upto = plan.tokens - 1
    for (decoding, batch), by_system in replies.items():
        ref = by_system[REFERENCE]
        row: dict[str, Any] = {}
        for system, got in by_system.items():
            if system == REFERENCE or system not in OURS:
                continue
            cell = agreement(got, ref, upto)
            differ = [i for i in range(batch) if got[i] != ref[i]]
            if differ:
                ctx = [contexts[i] for i in differ] * 2
                scored = reference.ask(
                    ("score", ctx, [ref[i] for i in differ] + [got[i] for i in differ])
                )
                n = len(differ)
                gap = [a - b for a, b in zip(scored[:n], scored[n:], strict=True)]
                cell["score_gap_max"] = max(gap)
                cell["score_gap_mean"] = statistics.mean(gap)
                cell["score_ref_mean"] = statistics.mean(scored[:n])
            row[f"{system}_vs_{REFERENCE}"] = cell
        out[f"{decoding}_b{batch}"] = row
    return out


def work_and_agreement(
    plan: Plan, replies: dict[tuple[str, int], dict[str, list[list[int]]]], prep: dict[str, Any]
) -> dict[str, Any]:
    """Equal work (tokens per reply) and the agreement of replies across systems."""
    work: dict[str, dict[str, Any]] = {}
    agree: dict[str, dict[str, Any]] = {}
    # Ours end the top hypothesis with the end token in place of the last one (ParlAI's forced
    # end when no hypothesis finished): agreement is over the first tokens - 1.
    upto = plan.tokens - 1
    for (decoding, batch), by_system in replies.items():
        key = f"{decoding}_b{batch}"
        work[key] = {s: work_check(r, plan.tokens) for s, r in by_system.items()}
        row: dict[str, Any] = {}
        if "hf_fp32" in by_system:
            for s in OURS:
                if s in by_system:
                    row[f"{s}_vs_hf_fp32"] = agreement(by_system[s], by_system["hf_fp32"], upto)
        if decoding == "greedy":
            reference = prep["bart_layout_greedy"][:batch]
            for s in ("ct2_fp32", "ct2_int8"):
                if s in by_system:
                    row[f"{s}_vs_hf_bart_layout"] = agreement(by_system[s], reference, upto)
        if "ct2_fp32" in by_system and "hf_fp32" in by_system:
            # across the two layouts: how much the embedding norm's place changes the replies
            row["ct2_fp32_vs_hf_fp32"] = agreement(
                by_system["ct2_fp32"], by_system["hf_fp32"], upto
            )
        if "ct2_fp32" in by_system and "ct2_int8" in by_system:
            row["ct2_int8_vs_ct2_fp32"] = agreement(
                by_system["ct2_int8"], by_system["ct2_fp32"], upto
            )
        agree[key] = row
    equal = all(c["equal"] for per in work.values() for c in per.values())
    return {"work": work, "work_equal": equal, "agreement": agree}


def plot(plan: Plan, cells: list[dict[str, Any]], name: str) -> None:
    """Replies/s per system, one panel per decoding (cells at the first thread count)."""
    import matplotlib

    decodings = [d for d, _ in plan.decodings]
    fig, axes = common.new_figure(ncols=len(decodings), width=5.5)
    palette = matplotlib.colormaps["tab20"]  # 20 colours: one per system, none reused
    for ax, decoding in zip(axes[0], decodings, strict=True):
        for i, system in enumerate(plan.systems):
            xs, ys = [], []
            for c in cells:
                if c["decoding"] == decoding and c["threads"] == plan.threads[0]:
                    xs.append(c["batch"])
                    ys.append(c["rps"].get(system, float("nan")))
            ax.plot(
                xs,
                ys,
                marker="o" if system in OURS else "s",
                linestyle="--" if system in BEFORE else "-",  # ours before a change: dashed
                color=palette(i % 20),
                label=system,
            )
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch (chats)")
        ax.set_ylabel("replies/s")
        ax.set_title(f"{decoding}, {plan.tokens} tokens, {plan.threads[0]} thread(s)")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    common.save_figure(name, fig)


def main(argv: list[str] | None = None) -> int:
    """Measure, print the table and RESULT lines, write the JSON (and a PNG)."""
    plan = plan_from_args(argv)
    refusal = common.cuda_refusal("bench.peer") if plan.device == "cuda" else None
    if refusal:
        print(refusal, file=sys.stderr)
        return 2
    plan = fit_to_device(plan)
    notes = skip_notes(plan.skipped)
    os.environ.update(ISA_ENV[plan.isa])  # before any worker starts (they inherit it)
    isa = "" if plan.isa == "native" else f", the libraries on their {plan.isa} code paths"
    print(
        f"peer benchmark: {len(plan.systems)} systems on {plan.device}{isa}, {plan.tokens} "
        f"tokens per reply, greedy and beam {plan.beam}, batches {plan.batches}, threads "
        f"{plan.threads}, {plan.rounds} rounds; machine {common.machine()}",
        flush=True,
    )
    for note in notes:
        print(note, flush=True)
    if not plan.systems:
        print(
            f"nothing to measure: this machine can run none of the systems asked for on "
            f"{plan.device}"
        )
        return 1
    started = time.perf_counter()
    payload = measure(plan)
    cells = payload["cells"]
    headers = table_headers(plan.systems)
    rows = table_rows(cells, plan.systems)
    common.print_table(
        f"Replies/s on {plan.device} (median of {plan.rounds} rounds), {plan.tokens} new "
        f"tokens per reply, {plan.layers}+{plan.layers} layers x {plan.dim}, "
        f"vocab {plan.vocab:,}",
        headers,
        rows,
    )
    for note in notes:  # under the table, as in its markdown
        print(note)
    print(f"equal work (every reply {plan.tokens} tokens): {payload['work_equal']}")
    for key, row in payload["agreement"].items():
        parts = [
            f"{k} {v['replies']:.0%} (prefix {v['prefix']:.0%}"
            + (
                f"; fp32 score gap where they differ: max {v['score_gap_max']:+.3f}, mean "
                f"{v['score_gap_mean']:+.3f}, of {v['score_ref_mean']:.2f})"
                if "score_gap_max" in v
                else ")"
            )
            for k, v in row.items()
        ]
        print(f"agreement {key}: " + "; ".join(parts))
    name = (
        ("peer-quick" if plan.quick else "peer")
        + ("" if plan.isa == "native" else f"-{plan.isa}")
        + ("" if plan.device == "cpu" else "-cuda")
    )
    common.write_json(
        name,
        {
            "plan": {**asdict(plan), "cells": plan.cells()},
            "wall_s": time.perf_counter() - started,
            "markdown": "\n\n".join([common.markdown_table(headers, rows), *notes]),
            **payload,
        },
    )
    try:
        plot(plan, cells, name)
    except Exception as err:  # noqa: BLE001 - the plot is a nice-to-have
        print(f"no plot: {err}", file=sys.stderr)
    common.emit_results(results(cells, plan.device, plan.isa))
    return 0 if payload["work_equal"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
