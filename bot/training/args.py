"""The `parlai train_model` arguments of a run, built from its recipe."""

from __future__ import annotations

from pathlib import Path

from bot.training.recipe import Recipe


def parlai_args(recipe: Recipe, data_dir: Path, model_file: Path, max_train_s: float) -> list[str]:
    """The `parlai train_model` arguments of a run."""
    r = recipe
    return [
        "--task", "fromfile:parlaiformat",
        "--fromfile-datapath", str(data_dir / "chitchat"),
        "--fromfile-datatype-extension", "true",
        "--model", "transformer/generator",
        "--model-file", str(model_file),
        "--dict-file", str(model_file) + ".dict",
        # Lower-cased BPE learnt offline by subword-nmt: no unknown words (the data is full of
        # typos and slang that a word vocabulary would turn into __unk__), a small vocabulary
        # (cheap softmax on CPU), the same scheme as BlenderBot 90M.
        "--dict-tokenizer", "bpe",
        "--dict-lower", "true",
        "--dict-maxtokens", str(r.bpe_symbols),
        "--dict-minfreq", "2",
        "--n-encoder-layers", str(r.n_layers),
        "--n-decoder-layers", str(r.n_layers),
        "--embedding-size", str(r.embedding_size),
        "--ffn-size", str(r.ffn_size),
        "--n-heads", str(r.n_heads),
        "--n-positions", str(max(r.text_truncate, r.label_truncate) + 8),
        # Pre-layer-norm trains stably at a high learning rate, which a short run needs.
        "--variant", "prelayernorm",
        "--activation", "gelu",
        "--dropout", str(r.dropout),
        "--attention-dropout", "0.0",
        "--text-truncate", str(r.text_truncate),
        "--truncate", str(r.text_truncate),
        "--label-truncate", str(r.label_truncate),
        "--batchsize", str(r.batch_size),
        *(["--dynamic-batching", r.dynamic_batching] if r.dynamic_batching else []),
        "--optimizer", "adam",
        "--learningrate", str(r.learning_rate),
        "--gradient-clip", "1.0",
        # invsqrt: warm up, then decay slowly; needs no step count known in advance.
        "--lr-scheduler", "invsqrt",
        "--warmup-updates", str(r.warmup_updates),
        "--invsqrt-lr-decay-gamma", str(r.warmup_updates),
        "--max-train-time", f"{max_train_s:.0f}",
        "--num-epochs", "-1",
        "--validation-every-n-secs", f"{max(30.0, max_train_s / 3):.0f}",
        "--validation-max-exs", str(r.validation_max_exs),
        "--validation-metric", "ppl",
        "--short-final-eval", "true",
        "--skip-generation", "true",
        "--log-every-n-secs", "5",
        "--inference", r.inference,
        "--topk", str(r.topk),
        "--beam-delay", str(r.beam_delay),
        "--beam-size", str(r.beam_size),
        "--beam-min-length", str(r.beam_min_length),
        "--beam-block-ngram", str(r.beam_block_ngram),
        "--beam-context-block-ngram", str(r.beam_context_block_ngram),
        "--no-cuda",
        "--seed", str(r.seed),
        "--save-after-valid", "false",
    ]  # fmt: skip
