"""The knobs of one training run, and the cap on its time budget."""

from __future__ import annotations

from dataclasses import dataclass

MAX_MINUTES = 15.0


@dataclass(frozen=True)
class Recipe:
    """Architecture, data and optimisation knobs of one training run.

    The defaults are sized for ~12 minutes on 2 CPU cores, where compute, not data, is the
    limit: a 2-layer, 128-dim model sees about 3x more examples in the budget than a 3-layer,
    256-dim one (measured 2,650 vs 660 tokens/s on a loaded 2-core machine), and in a run this
    short the extra examples matter more than the capacity it could never use.
    """

    n_layers: int = 2
    embedding_size: int = 128
    ffn_size: int = 512
    n_heads: int = 4
    dropout: float = 0.0  # far less than one epoch: nothing to overfit yet
    text_truncate: int = 96
    label_truncate: int = 32
    batch_size: int = 16
    # "full" packs batches by length (no padding waste); None keeps ParlAI's plain batches.
    dynamic_batching: str | None = "full"
    learning_rate: float = 3e-3
    warmup_updates: int = 50
    bpe_symbols: int = 8000
    # Data: previous turns shown as context, share of examples with persona lines.
    context_turns: int = 2
    persona_rate: float = 0.25
    max_label_words: int = 30
    valid_share: float = 0.03
    validation_max_exs: int = 500
    max_conversations: int | None = None
    # Generation settings written into the saved model. Plain beam search answers nearly every
    # message of a minutes-old model with its single most likely reply ("That's cool!");
    # delayed beam samples the first `beam_delay` tokens from the top `topk` and lets the beam
    # finish them, which varies the openings and keeps the rest fluent.
    inference: str = "delayedbeam"
    topk: int = 10
    beam_delay: int = 3
    beam_size: int = 5
    beam_min_length: int = 3
    beam_block_ngram: int = 3
    beam_context_block_ngram: int = 3
    seed: int = 42


DEFAULT_RECIPE = Recipe()
