"""Batched beam search for ParlAI transformer generators, with the same results as ParlAI's.

ParlAI's `_generate` keeps one search object per chat: every step it runs a Python loop of per-chat
top-k calls and n-gram blocking, and reorders the decoder's whole incremental state, including the
encoder-side cross-attention keys and values, which never change within a beam. Here the search
runs on the whole batch at once:

- one log-softmax, one masked write for min length and n-gram blocking (beam and context, as
  tensor operations), one top-k per hypothesis row and one per chat over beam x beam candidates
  (`kernels`, driven by `beam.batched_generate`);
- the decoder is stepped by `steppers.FastDecoder`, which computes the encoder K/V once per chat
  and never reorders them; only the self-attention cache follows the beam back-pointers.

Same results means bit for bit: every floating-point operation that produces a score runs with the
same shapes and in the same order as ParlAI's (matrix kernels give results that depend on the
number of rows, so the decoder always runs `batch x beam` rows, as ParlAI's does, even for chats
that are finished). The only place the two can part is an exact float tie at the k-th candidate,
where top-k's choice among equal values is unspecified in both.
tests/integration/inference/test_fastgen.py proves it against ParlAI on random cases.

`accelerate(agent)` switches a loaded transformer generator to this search (SEARCH_IMPL=fast);
anything it does not cover (sampling, prefix tokens, token details, block lists, custom decoders
or generation hooks) falls back to ParlAI's own `_generate` per batch (`policy`).

Why a class swap after loading, not ParlAI's `--model module:Class`: the loader does accept
`model="bot.inference.fastgen:FastTransformerGeneratorAgent"` as an override and builds the fast
class directly (tried), but it is not simpler. ParlAI then logs a WARNING on every start
("Overriding opt["model"] ...") and renames the agent in its own log lines; deciding whether the
fast class applies needs the model's class before loading (read the `.opt`, resolve its
`model`), and a generator subclass other than TransformerGeneratorAgent would still need a class
built for it, which the loader cannot name. `accelerate` is also what the benchmarks and tests
call on agents that are already loaded. So one path stays: load with ParlAI's class, then
`accelerate`, whose only state is a per-class cache of the subclasses it builds.

Modules: `agent` (the fast class, `accelerate`), `policy` (when the batched search applies),
`beam` (the search loop and its per-chat result), `kernels` (top-k, n-gram blocking), `steppers`
(the decoder stepped one token at a time, with its incremental state), `projection` (the
output projection in the faster modes: int8 or the cast dtype, fused with log-softmax and top-k;
the default keeps ParlAI's `F.linear`, bit for bit), `encoder` (an int8 model's encoder
self-attention as one fused kernel), `qkv` (an int8 model's self-attention projections as one
product).
"""

from bot.inference.fastgen import encoder, projection, qkv
from bot.inference.fastgen.agent import FastTransformerGeneratorAgent, accelerate, is_accelerated
from bot.inference.fastgen.beam import BatchedBeams, batched_generate
from bot.inference.fastgen.kernels import NEG
from bot.inference.fastgen.policy import fallback_reason
from bot.inference.fastgen.steppers import fast_decoder_supported

__all__ = [
    "NEG",
    "BatchedBeams",
    "FastTransformerGeneratorAgent",
    "accelerate",
    "batched_generate",
    "encoder",
    "fallback_reason",
    "fast_decoder_supported",
    "is_accelerated",
    "projection",
    "qkv",
]
