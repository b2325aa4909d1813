"""A tiny but real ParlAI transformer/generator, built in seconds for tests.

Random weights (nobody wants to read its replies), a real dictionary and a real model file that
`create_agent_from_model_file` loads exactly like BlenderBot's. `build_model` is the one way a
random-weight model is built here: the tests' tiny model and the benchmarks' BlenderBot-90M-sized
one (bench/common.py) differ only in their arguments and dictionary.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bot.training.recipe import Recipe

VOCAB = """
hello hi hey how are you i am fine good great bad what do does like to hike hiking my name
is sarah jessica tom your persona love dogs cats pizza music books travel the a an and or
but not yes no it this that there here where when why who with for from on in at of by
about today tomorrow yesterday weekend work job school teacher doctor student cook play
read write sing dance run swim walk eat drink coffee tea water red blue green favorite
color food movie song have has had was were be been can could would should will shall may
might must want need know think feel see say tell ask talk chat bot robot human people
friend family mother father sister brother dog cat bird fish house home city country beach
mountain forest lake river sea sun moon canary secret token password env environment data
other user users show me give all please one two three four five six seven eight nine ten
zero ? . , ! ' s m re ll ve d t
""".split()  # noqa: SIM905 - a word list reads best as text


# For `python -m bot train` (tests/*/test_training*.py): a model that trains in seconds; its
# replies are not meant to be read.
TINY_RECIPE = Recipe(
    n_layers=1,
    embedding_size=32,
    ffn_size=64,
    n_heads=2,
    text_truncate=48,
    label_truncate=12,
    batch_size=16,
    bpe_symbols=500,
    validation_max_exs=40,
    max_conversations=120,
    beam_size=2,
    beam_min_length=1,
)


def parlai_args(model_file: Path, *options: str, agent: str = "transformer/generator") -> list[str]:
    """ParlAI's command line for a model built at `model_file` (its dictionary beside it):
    the agent, `options`, then generation on, on the CPU."""
    return [
        "--model", agent,
        "--model-file", str(model_file),
        "--dict-file", str(model_file) + ".dict",
        *options,
        "--skip-generation", "false",
        "--no-cuda",
        "--datatype", "valid",
    ]  # fmt: skip


def truncation(text: int, label: int) -> tuple[str, ...]:
    """ParlAI's options for `text` tokens of context (text and history) and `label` of reply."""
    return ("--text-truncate", str(text), "--truncate", str(text), "--label-truncate", str(label))


def lowercase_words(*, layers: int, width: int, ffn: int, heads: int) -> tuple[str, ...]:
    """ParlAI's options for a model over a lower-cased word (`re`) dictionary: `layers`
    encoder and decoder layers of `width` dims, an FFN of `ffn`, `heads` attention heads."""
    return (
        "--dict-tokenizer", "re",
        "--dict-lower", "true",
        "--n-layers", str(layers),
        "--embedding-size", str(width),
        "--ffn-size", str(ffn),
        "--n-heads", str(heads),
    )  # fmt: skip


def build_model(
    directory: str | os.PathLike[str],
    args: Callable[[Path], list[str]],
    fill_dictionary: Callable[[Any, str], None],
    *,
    seed: int = 0,
    announce: Callable[[], None] | None = None,
    built: Callable[[Any], None] | None = None,
    prepare: Callable[[Any], None] | None = None,
) -> str:
    """Build (once per directory, under a file lock) a random-weight model; returns its path.

    `args(model_file)` are ParlAI's command-line arguments; `fill_dictionary(dictionary,
    dict_file)` fills the fresh DictionaryAgent and saves it to `dict_file`, before the agent is
    created from it. Only when it is built: `announce()` runs first, `built(agent)` on the new
    agent before it is saved (an exception there keeps it unsaved); `prepare(opt)` may adjust
    the parsed options before the dictionary and the agent are made.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model_file = directory / "model"
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (directory / "model.opt").exists():
            return str(model_file)
        if announce is not None:
            announce()
        import torch

        from bot.inference import compat

        compat.apply()
        from parlai.core.agents import create_agent
        from parlai.core.dict import DictionaryAgent
        from parlai.core.params import ParlaiParser

        torch.manual_seed(seed)
        opt = ParlaiParser(True, True).parse_args(args(model_file))
        if prepare is not None:
            prepare(opt)
        fill_dictionary(DictionaryAgent(opt), str(model_file) + ".dict")
        agent = create_agent(opt)
        if built is not None:
            built(agent)
        agent.save(str(model_file))
        return str(model_file)


def build_tiny_model(
    directory: str | os.PathLike[str],
    *,
    text_truncate: int = 64,
    label_truncate: int = 12,
    beam_size: int = 2,
    seed: int = 0,
    extra_words: tuple[str, ...] = (),
) -> str:
    """Create (once per directory) a tiny model; returns the model file path for BOT_MODEL."""

    def args(model_file: Path) -> list[str]:
        return parlai_args(
            model_file,
            *lowercase_words(layers=1, width=16, ffn=32, heads=2),
            *truncation(text_truncate, label_truncate),
            "--inference", "beam",
            "--beam-size", str(beam_size),
            "--beam-min-length", "2",
        )  # fmt: skip

    def fill_dictionary(dictionary: Any, dict_file: str) -> None:
        for word in (*VOCAB, ":", "\n", *extra_words):
            dictionary.add_token(word)
            dictionary.freq[word] = 10
        dictionary.save(dict_file, sort=False)

    return build_model(directory, args, fill_dictionary, seed=seed)


# A cased corpus for the byte-level BPE dictionary of `build_cased_bpe_model`: names, places
# and sentence starts keep their capitals, as in the data of BlenderBot 400M/1B/3B.
CASED_CORPUS = """
Hi, I'm Sarah from New York. How are you today?
Hello! My name is Tom and I live in London with my dog Max.
I love hiking in the Rocky Mountains. Do you like to travel?
We went to Paris last summer, and then to Rome and Berlin.
What do you do for a living? I'm a teacher at a school in Boston.
My favorite band is The Beatles. I listen to them every day.
That sounds great! I have never been to Japan or Canada.
Are you a student? I study Computer Science at MIT.
I'm doing well, thanks. What about you?
My sister Jessica is a doctor in San Francisco.
""".strip().splitlines()


def build_cased_bpe_model(
    directory: str | os.PathLike[str],
    *,
    text_truncate: int = 128,
    label_truncate: int = 12,
    beam_size: int = 2,
    seed: int = 0,
) -> str:
    """Create (once per directory) a tiny model built like BlenderBot 400M-distill (and 1B, 3B):
    a cased byte-level BPE dictionary (`bytelevelbpe`, `dict_lower` false, its vocabulary and
    merges trained here with the `tokenizers` package), pre-layer-norm, GELU, learned
    positions, a shallow encoder under a deeper decoder; returns the model file path."""

    def args(model_file: Path) -> list[str]:
        from tokenizers import ByteLevelBPETokenizer

        bpe = ByteLevelBPETokenizer(add_prefix_space=True)
        bpe.train_from_iterator(CASED_CORPUS, vocab_size=400, min_frequency=1, show_progress=False)
        bpe.save_model(str(model_file.parent), "bpe")
        return parlai_args(
            model_file,
            "--dict-tokenizer", "bytelevelbpe",
            "--bpe-vocab", str(model_file.parent / "bpe-vocab.json"),
            "--bpe-merge", str(model_file.parent / "bpe-merges.txt"),
            "--dict-lower", "false",
            "--variant", "prelayernorm",
            "--activation", "gelu",
            "--learn-positional-embeddings", "true",
            "--n-encoder-layers", "1",
            "--n-decoder-layers", "2",
            "--embedding-size", "32",
            "--ffn-size", "64",
            "--n-heads", "2",
            "--n-positions", "256",
            *truncation(text_truncate, label_truncate),
            "--inference", "beam",
            "--beam-size", str(beam_size),
            "--beam-min-length", "2",
            "--beam-block-ngram", "2",
        )  # fmt: skip

    def fill_dictionary(dictionary: Any, dict_file: str) -> None:
        # The dictionary took its tokens from the trained vocabulary (ParlAI's sync_with_dict).
        dictionary.save(dict_file, sort=False)

    return build_model(directory, args, fill_dictionary, seed=seed, built=word_starts_only)


def word_starts_only(agent: Any) -> None:
    """Make a random byte-level BPE model begin its replies with a word-initial token.

    ParlAI decodes byte-level BPE with a prefix space and asserts that the text starts with
    one (HuggingFaceBpeHelper.decode): a reply whose first token continues a word ("ing")
    raises in ParlAI's own agent as in ours. Trained models never start so; random weights
    do. The tokens that do not start a word ("Ġ" marks those that do) get embeddings a
    hundredth as long: their logits (shared input/output embeddings) sit near 0, below the
    best word-initial tokens', so beam search, greedy and top-k never pick them first.
    """
    import torch

    special = {agent.dict.null_token, agent.dict.start_token, agent.dict.end_token,
               agent.dict.unk_token}  # fmt: skip
    rows = [
        i
        for i in range(len(agent.dict))
        if not str(agent.dict[i]).startswith("\u0120") and agent.dict[i] not in special
    ]
    with torch.no_grad():
        agent.model.embeddings.weight[rows] *= 0.01
