"""What a ParlAI model on disk must have before it is served: its options, its weights and its
dictionary (with the tokenizer files the dictionary names).

ParlAI itself is lenient where a service must not be: a `model.opt` without its weights file
builds a model with freshly initialised (random) weights, and a missing dictionary shows only at
the first turn. Every place that accepts a model (`admin variants add`, the variants file,
BOT_MODEL at start, the loader of a model process) asks `missing_model_files` first and refuses
an incomplete model with a message that names the missing files.

The dictionary is found as ParlAI finds it when it loads a model file
(`parlai.core.agents.create_agent_from_opt_file`: the options' `dict_file`, else
`<model>.dict`), and its tokenizer's files as `parlai.utils.bpe` loads them: subword-nmt's
`<dict>.codecs` for `bpe`, and for byte-level BPE `<dict>-vocab.json` and `<dict>-merges.txt`,
else the options' `bpe_vocab` and `bpe_merge`.
"""

from __future__ import annotations

import json
from pathlib import Path

BYTE_LEVEL = ("bytelevelbpe", "slow_bytelevel_bpe")


def missing_model_files(model_file: str | Path) -> list[str]:
    """The files a complete model at `model_file` lacks, each with what it is for (empty:
    complete). Without its `.opt` nothing else can be known, so that is the only one named."""
    model = Path(model_file)
    opt_path = Path(f"{model}.opt")
    if not opt_path.is_file():
        return [f"{opt_path} (the model's options)"]
    missing: list[str] = []
    if not model.is_file():
        missing.append(f"{model} (the weights)")
    try:
        opt = json.loads(opt_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        return [*missing, f"{opt_path} is not readable JSON ({type(err).__name__})"]
    if not isinstance(opt, dict):
        return [*missing, f"{opt_path} holds no options"]
    named = opt.get("dict_file")
    dict_file = Path(f"{model}.dict")
    if _local(named) and Path(str(named)).is_file():
        dict_file = Path(str(named))
    if not dict_file.is_file():
        return [*missing, f"{dict_file} (the dictionary)"]
    tokenizer = opt.get("dict_tokenizer")
    if tokenizer == "bpe" and not Path(f"{dict_file}.codecs").is_file():
        missing.append(f"{dict_file}.codecs (the dictionary's BPE codes)")
    elif tokenizer in BYTE_LEVEL:
        missing += _byte_level_files(dict_file, opt)
    return missing


def _byte_level_files(dict_file: Path, opt: dict[str, object]) -> list[str]:
    vocab, merges = Path(f"{dict_file}-vocab.json"), Path(f"{dict_file}-merges.txt")
    out: list[str] = []
    for own, key, what in ((vocab, "bpe_vocab", "vocabulary"), (merges, "bpe_merge", "merges")):
        if own.is_file():
            continue
        named = opt.get(key)
        if not (_local(named) and Path(str(named)).is_file()):
            out.append(f"{own} or the options' {key} (the byte-level BPE {what})")
    return out


def _local(path: object) -> bool:
    return isinstance(path, str) and bool(path) and not path.startswith("zoo:")


def incomplete_model(model_file: str | Path) -> str | None:
    """None for a complete model, else one sentence naming what is missing and what to do."""
    missing = missing_model_files(model_file)
    if not missing:
        return None
    return (
        f"the model at {model_file} is incomplete: missing {'; '.join(missing)}. A model is "
        "served only with its options, its weights and its dictionary (copy every file that "
        "starts with its name), so that it never answers with untrained weights"
    )
