"""Issue 32, item 1: a model without its weights file (or its dictionary) was served with random
weights. ParlAI builds a fresh model when `model.opt` is there and the weights are not (checked
here against ParlAI's own loader), so every place that accepts a model refuses an incomplete one
and names the missing file: `admin variants add`, the variants file, BOT_MODEL at start and the
model loader of a worker process."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bot.config import ConfigError, Settings
from bot.conversations.store import ConversationStore
from bot.engine.router import VariantResponder
from bot.inference.model import load_shared_agent
from bot.model_files import missing_model_files
from tests.integration.engine.test_live_variants import assert_add_refused
from tests.integration.engine.test_live_variants import (
    one_variant_admin as one_variant_admin,  # the fixture
)


def copy_without(model_file: str, dest: Path, *suffixes: str) -> str:
    """A copy of the model's files in `dest`, less those named by `suffixes` ("" = the
    weights); the copy's options point at its own dictionary."""
    dest.mkdir(parents=True, exist_ok=True)
    source = Path(model_file)
    for path in source.parent.glob(source.name + "*"):
        suffix = path.name[len(source.name) :]
        if suffix not in suffixes and path.is_file():
            shutil.copy(path, dest / path.name)
    copy = dest / source.name
    opt_file = Path(f"{copy}.opt")
    opt = json.loads(opt_file.read_text())
    opt.update(model_file=str(copy), dict_file=f"{copy}.dict")
    opt_file.write_text(json.dumps(opt))
    return str(copy)


def test_model_without_weights_is_what_parlai_would_serve_with_random_weights(
    tiny_model_file: str, tmp_path: Path
) -> None:
    """The defect's premise, on ParlAI's own loader: no weights file, yet an agent comes back."""
    from parlai.core.agents import create_agent_from_model_file

    weightless = copy_without(tiny_model_file, tmp_path / "m", "")
    agent = create_agent_from_model_file(weightless, {"datapath": str(tmp_path), "no_cuda": True})
    assert agent is not None  # random weights, had nothing stopped it
    assert missing_model_files(weightless) == [f"{weightless} (the weights)"]


def test_model_without_weights_or_dictionary_is_refused_by_the_loader(
    tiny_model_file: str, tmp_path: Path
) -> None:
    for suffix, what in (("", "(the weights)"), (".dict", "(the dictionary)")):
        model = copy_without(tiny_model_file, tmp_path / f"m{suffix}", suffix)
        settings = Settings(  # type: ignore[call-arg]
            _env_file=None, bot_model=model, data_dir=tmp_path, model_device="cpu"
        )
        with pytest.raises(ConfigError) as err:
            load_shared_agent(settings)
        assert f"{model}{suffix} {what}" in str(err.value)
        assert "incomplete" in str(err.value)


def test_model_without_weights_is_refused_by_admin_variants_add(
    one_variant_admin: Settings,
    tmp_path: Path,
    tiny_model_file: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    weightless = copy_without(tiny_model_file, tmp_path / "cand", "")
    why = f"missing {weightless} (the weights)"
    assert_add_refused(one_variant_admin, "cand", weightless, why, capsys)
    # The directory form of --model is refused the same way.
    assert_add_refused(one_variant_admin, "cand", str(tmp_path / "cand"), "(the weights)", capsys)


async def test_model_without_weights_is_refused_in_the_variants_file_and_bot_model(
    store: ConversationStore, tmp_path: Path, tiny_model_file: str, db_url: str
) -> None:
    weightless = copy_without(tiny_model_file, tmp_path / "cand", "")
    nodict = copy_without(tiny_model_file, tmp_path / "nodict", ".dict")
    base = Settings(  # type: ignore[call-arg]
        _env_file=None, database_url=db_url, data_dir=tmp_path, model_workers="inline"
    )
    vf = tmp_path / "v.toml"
    vf.write_text(
        f'[[variants]]\nname = "a"\nmodel = "{tiny_model_file}"\ncontrol = true\n'
        f'[[variants]]\nname = "cand"\nmodel = "{weightless}"\n'
    )
    with pytest.raises(ConfigError) as err:
        await VariantResponder.start(base.model_copy(update={"variants_file": vf}), store)
    assert str(err.value).startswith(f"VARIANTS_FILE {vf}")
    assert f"variant 'cand': the model at {weightless} is incomplete" in str(err.value)
    assert "(the weights)" in str(err.value)
    # BOT_MODEL is the single variant "default", checked the same way (the file above was
    # refused before anything was stored).
    with pytest.raises(ConfigError) as err:
        await VariantResponder.start(base.model_copy(update={"bot_model": nodict}), store)
    assert f"{nodict}.dict (the dictionary)" in str(err.value)


@pytest.mark.parametrize(
    ("tokenizer", "files", "missing"),
    [
        ("re", ["", ".dict"], []),
        ("bpe", ["", ".dict", ".dict.codecs"], []),
        ("bpe", ["", ".dict"], ["{m}.dict.codecs (the dictionary's BPE codes)"]),
        ("bytelevelbpe", ["", ".dict", ".dict-vocab.json", ".dict-merges.txt"], []),
        (
            "bytelevelbpe",
            ["", ".dict", ".dict-vocab.json"],
            ["{m}.dict-merges.txt or the options' bpe_merge (the byte-level BPE merges)"],
        ),
        ("re", [".dict"], ["{m} (the weights)"]),
        ("re", [""], ["{m}.dict (the dictionary)"]),
    ],
)
def test_model_files_named_by_what_is_missing(
    tmp_path: Path, tokenizer: str, files: list[str], missing: list[str]
) -> None:
    """The tokenizer's own files count as part of the dictionary (ParlAI's bpe helpers read
    them at load): subword-nmt's codes, byte-level BPE's vocabulary and merges."""
    model = tmp_path / "model"
    for suffix in files:
        Path(f"{model}{suffix}").write_text("x")
    Path(f"{model}.opt").write_text(
        json.dumps({"dict_file": "/elsewhere/model.dict", "dict_tokenizer": tokenizer})
    )
    assert missing_model_files(model) == [m.format(m=model) for m in missing]


def test_byte_level_files_named_by_the_options_count(tmp_path: Path) -> None:
    """A zoo-style model whose options name its BPE files elsewhere is complete."""
    (tmp_path / "bpe").mkdir()
    for name in ("model", "model.dict", "bpe/vocab.json", "bpe/merges.txt"):
        (tmp_path / name).write_text("x")
    (tmp_path / "model.opt").write_text(
        json.dumps(
            {
                "dict_tokenizer": "bytelevelbpe",
                "bpe_vocab": str(tmp_path / "bpe/vocab.json"),
                "bpe_merge": str(tmp_path / "bpe/merges.txt"),
            }
        )
    )
    assert missing_model_files(tmp_path / "model") == []
    (tmp_path / "bpe/merges.txt").unlink()
    assert len(missing_model_files(tmp_path / "model")) == 1
