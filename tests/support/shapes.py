"""Tiny random models with the shape of every BlenderBot in ParlAI's zoo, and of `-m bart`.

Each keeps every structural option of the real model (agent, variant, activation, positional
embeddings and their count, encoder/decoder depth ratio, embedding scaling and sharing,
tokenizer and its casing, history delimiter and end token, context and label truncation) and
its decoding options, with tiny widths (embedding 16-32, ffn 32-64, 2-4 heads), so that a model
builds in about a second. `SHAPES` is the one table; `build_shape` builds a shape once per
directory through `tests.support.tinymodel.build_model` (the same file lock).

What is shrunk, and why it changes nothing the tests look at: widths and depths (scaled,
keeping the shallow-encoder/deep-decoder ratio of the distilled and 3B models), dictionary
sizes (a few hundred BPE symbols learned from a slice of the chitchat dataset), and
`label_truncate` (24 instead of 128: random weights never end a reply, so every reply runs to
`label_truncate`; `beam_min_length` 20 stays below it, so the end token is still blocked for
20 steps and free after). BART's GPT-2 dictionary is a download; here it is a byte-level BPE
trained locally (the same tokenizer family, cased, `bytelevelbpe` instead of `gpt2`).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.tinymodel import build_model, parlai_args, truncation, word_starts_only

# Every tiny reply is at most this long (the zoo models' 128 would only make the tests slower).
TINY_LABEL_TRUNCATE = 24

# The zoo models' decoding options, as their model.opt files have them (see SHAPES).
ZOO_BEAM = {
    "inference": "beam",
    "beam_size": 10,
    "beam_min_length": 20,
    "beam_block_ngram": 3,
    "beam_context_block_ngram": 3,
    "beam_length_penalty": 0.65,
}


# Two encoder and two decoder layers of 16 dims, ffn 64: the width of a shape with its own
# structure (the 90M's and BART's).
TINY_2_LAYERS: dict[str, Any] = {
    "n_encoder_layers": 2,
    "n_decoder_layers": 2,
    "embedding_size": 16,
    "ffn_size": 64,
}

# What the 400M-distill, 1B-distill and 3B shapes share, the 2.7B recipe (sources in SHAPES):
# a cased byte-level BPE, pre-layer-norm, sinusoidal positions, 128 tokens of context, the
# two-space delimiter and a global end token, the zoo's beam; one encoder layer at this width.
BLENDER_2_7B_RECIPE: dict[str, Any] = {
    "agent": "transformer/generator",
    "tokenizer": "bytelevelbpe",
    "lower": False,
    "variant": "prelayernorm",
    "n_encoder_layers": 1,
    "ffn_size": 64,
    "n_heads": 4,
    "n_positions": 128,
    "learn_positional_embeddings": False,
    "embeddings_scale": True,
    "text_truncate": 128,
    "delimiter": "  ",
    "global_end_token": True,
    "decoding": ZOO_BEAM,
}


@dataclass(frozen=True)
class Shape:
    """One zoo model's structure and decoding, at a tiny width."""

    name: str
    agent: str  # ParlAI's --model
    tokenizer: str  # dict_tokenizer: "bpe" (subword-nmt) or "bytelevelbpe"
    lower: bool  # dict_lower
    variant: str
    n_encoder_layers: int
    n_decoder_layers: int
    embedding_size: int
    ffn_size: int
    n_heads: int
    n_positions: int
    learn_positional_embeddings: bool
    embeddings_scale: bool
    text_truncate: int  # text_truncate and truncate
    decoding: dict[str, Any]
    delimiter: str = "\n"
    global_end_token: bool = False  # history_add_global_end_token=end
    activation: str = "gelu"
    share_word_embeddings: bool = True
    label_truncate: int = TINY_LABEL_TRUNCATE
    # the real model's size, for the reader: (embedding, ffn, heads, encoder, decoder layers)
    real: tuple[int, int, int, int, int] = (0, 0, 0, 0, 0)
    extra: dict[str, Any] = field(default_factory=dict)

    def args(self, model_file: Path, bpe_dir: Path) -> list[str]:
        """ParlAI's command line for this shape."""
        args = parlai_args(
            model_file,
            "--dict-tokenizer", self.tokenizer,
            "--dict-lower", str(self.lower),
            "--n-layers", str(self.n_encoder_layers),
            "--n-encoder-layers", str(self.n_encoder_layers),
            "--n-decoder-layers", str(self.n_decoder_layers),
            "--embedding-size", str(self.embedding_size),
            "--ffn-size", str(self.ffn_size),
            "--n-heads", str(self.n_heads),
            "--n-positions", str(self.n_positions),
            "--variant", self.variant,
            "--activation", self.activation,
            "--learn-positional-embeddings", str(self.learn_positional_embeddings),
            "--embeddings-scale", str(self.embeddings_scale),
            "--share-word-embeddings", str(self.share_word_embeddings),
            *truncation(self.text_truncate, self.label_truncate),
            "--delimiter", self.delimiter,
            agent=self.agent,
        )  # fmt: skip
        if self.global_end_token:
            args += ["--history-add-global-end-token", "end"]
        if self.tokenizer == "bytelevelbpe":
            args += [
                "--bpe-vocab", str(bpe_dir / "vocab.json"),
                "--bpe-merge", str(bpe_dir / "merges.txt"),
            ]  # fmt: skip
        for key, value in {**self.decoding, **self.extra}.items():
            args += ["--" + key.replace("_", "-"), str(value)]
        return args


def _blender(
    name: str, *, n_decoder_layers: int, embedding_size: int, real: tuple[int, int, int, int, int]
) -> Shape:
    """A BlenderBot on the 2.7B recipe: its depth and width here, and the real model's size."""
    return Shape(
        name=name,
        **BLENDER_2_7B_RECIPE,
        n_decoder_layers=n_decoder_layers,
        embedding_size=embedding_size,
        real=real,
    )


# The table. Sources, per model (ParlAI 1.7.2 unless said):
SHAPES: dict[str, Shape] = {
    # BlenderBot 90M, zoo:blender/blender_90M (parlai/zoo/blender/blender_90M.py, BST0B.tgz).
    # Architecture: the 90M fine-tuning command in ParlAI's projects/blender/README.md
    # (https://github.com/facebookresearch/ParlAI/tree/main/projects/blender): embedding 512,
    # 8 layers, ffn 2048, 16 heads, --learn-positional-embeddings True --n-positions 512
    # --variant xlm --activation gelu --text-truncate 512 --label-truncate 128
    # --dict-tokenizer bpe --dict-lower True (the tutorial_transformer_generator dictionary);
    # embeddings_scale and share_word_embeddings are ParlAI's defaults (True), as the Hugging
    # Face conversion says (facebook/blenderbot-90M config.json: scale_embedding true,
    # max_position_embeddings 512). Decoding: beam 10, min length 20, 3-gram blocking, length
    # penalty 0.65 (the same config's num_beams, min_length, no_repeat_ngram_size,
    # length_penalty; the BlenderBot paper, arXiv 2004.13637, section 6), context blocking 3
    # (the settings ParlAI's human evaluations used for BlenderBot90M: ParlAI's
    # parlai/crowdsourcing/projects/humaneval/README.md).
    "blender_90M": Shape(
        name="blender_90M",
        agent="transformer/generator",
        tokenizer="bpe",
        lower=True,
        variant="xlm",
        **TINY_2_LAYERS,
        n_heads=4,
        n_positions=512,
        learn_positional_embeddings=True,
        embeddings_scale=True,
        text_truncate=512,
        decoding=ZOO_BEAM,
        real=(512, 2048, 16, 8, 8),
    ),
    # BlenderBot 400M distilled, zoo:blender/blender_400Mdistill (blender_400Mdistill.py,
    # BST400Mdistill_v1.1.tgz): the 2.7B recipe (below) distilled to 2 encoder and 12 decoder
    # layers of 1280 dims, ffn 5120, 32 heads (Hugging Face facebook/blenderbot-400M-distill
    # config.json: encoder_layers 2, decoder_layers 12, d_model 1280, max_position_embeddings
    # 128, layernorm_variant prelayernorm, activation gelu; generation: num_beams 10,
    # min_length 20, no_repeat_ngram_size 3, encoder_no_repeat_ngram_size 3, length_penalty
    # 0.65). Kept: 1 encoder, 3 decoder layers.
    "blender_400Mdistill": _blender(
        "blender_400Mdistill", n_decoder_layers=3, embedding_size=16, real=(1280, 5120, 32, 2, 12)
    ),
    # BlenderBot 1B distilled, zoo:blender/blender_1Bdistill (blender_1Bdistill.py,
    # BST1Bdistill_v1.1.tgz): 2 encoder, 12 decoder layers of 2560 dims, ffn 10240, 32 heads
    # (Hugging Face facebook/blenderbot-1B-distill config.json), otherwise the 2.7B recipe.
    # Twice the 400M's width here too.
    "blender_1Bdistill": _blender(
        "blender_1Bdistill", n_decoder_layers=3, embedding_size=32, real=(2560, 10240, 32, 2, 12)
    ),
    # BlenderBot 2.7B, zoo:blender/blender_3B (blender_3B.py, BST3B.tgz): the 2.7B fine-tuning
    # command in projects/blender/README.md and in parlai/zoo/model_list.py ("Reddit 2.7B"):
    # --embedding-size 2560 --ffn-size 10240 --variant prelayernorm --n-heads 32
    # --n-positions 128 --n-encoder-layers 2 --n-decoder-layers 24
    # --history-add-global-end-token end --delimiter '  ' --dict-tokenizer bytelevelbpe
    # --activation gelu --text-truncate 128 --truncate 128 --label-truncate 128 (no
    # --learn-positional-embeddings: sinusoidal; no --dict-lower: cased). Decoding as the
    # 400M's (Hugging Face facebook/blenderbot-3B generation config). Kept: 1 encoder, 6
    # decoder layers.
    "blender_3B": _blender(
        "blender_3B", n_decoder_layers=6, embedding_size=32, real=(2560, 10240, 32, 2, 24)
    ),
    # BART, `-m bart` (parlai/agents/bart/bart.py; its defaults are BART_ARGS in
    # parlai/zoo/bart/build.py): 12+12 layers of 1024 dims, ffn 4096, 16 heads,
    # n_positions 1024, variant bart, gelu, learn_positional_embeddings True,
    # embeddings_scale False, no global end token, dict_tokenizer gpt2 (here: a local
    # byte-level BPE, the GPT-2 files being a download). BartAgent seeds the decoder with
    # END, START and wraps the context in START ... END (its own generation hooks: the
    # service keeps ParlAI's search for it). Decoding: ParlAI's defaults (greedy). BART sets
    # no truncation (text_truncate None); a served model must fit n_positions, so 1024 here.
    "bart": Shape(
        name="bart",
        agent="bart",
        tokenizer="bytelevelbpe",
        lower=False,
        variant="bart",
        **TINY_2_LAYERS,
        n_heads=2,
        n_positions=1024,
        learn_positional_embeddings=True,
        embeddings_scale=False,
        text_truncate=1024,
        decoding={"inference": "greedy", "beam_size": 1},
        real=(1024, 4096, 16, 12, 12),
    ),
}


@functools.lru_cache(maxsize=1)
def corpus() -> tuple[str, ...]:
    """Real chat lines (the chitchat dataset ships with its package): the first 300
    conversations, for the dictionaries and the test conversations."""
    import chitchat_dataset

    out: list[str] = []
    for convo in list(chitchat_dataset.Dataset().values())[:300]:
        for turn in convo["messages"]:
            for msg in turn:
                text = " ".join(str(msg["text"]).split())
                if 2 <= len(text) <= 200:
                    out.append(text)
    return tuple(out)


def _train_bytelevel(bpe_dir: Path) -> None:
    """A byte-level BPE (vocab.json, merges.txt) learned from the corpus in about a second."""
    from tokenizers import ByteLevelBPETokenizer

    bpe_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = ByteLevelBPETokenizer(add_prefix_space=True)
    tokenizer.train_from_iterator(list(corpus()), vocab_size=800, min_frequency=2)
    tokenizer.save_model(str(bpe_dir))


def build_shape(directory: str | os.PathLike[str], shape: Shape, *, seed: int = 0) -> str:
    """Build (once per directory) the tiny model of `shape`; returns its model file."""
    directory = Path(directory)
    bpe_dir = directory / "bpe"

    def args(model_file: Path) -> list[str]:
        if shape.tokenizer == "bytelevelbpe":
            _train_bytelevel(bpe_dir)
        return shape.args(model_file, bpe_dir)

    def fill_dictionary(dictionary: Any, dict_file: str) -> None:
        if shape.tokenizer == "bpe":
            os.environ.setdefault("TQDM_DISABLE", "1")  # subword-nmt's progress bar
            for text in corpus()[:3000]:
                dictionary.add_to_dict(dictionary.tokenize(text))
        # bpe: learns the codecs; bytelevelbpe: the vocabulary came with the tokenizer
        dictionary.save(dict_file, sort=shape.tokenizer == "bpe")

    def prepare(opt: Any) -> None:
        if shape.agent == "bart":
            # BartAgent downloads bart_large unless it converts a model: here it builds one
            opt["converting"] = True

    def built(agent: Any) -> None:
        if shape.tokenizer == "bytelevelbpe":
            word_starts_only(agent)

    return build_model(directory, args, fill_dictionary, seed=seed, prepare=prepare, built=built)
