"""Issue 33.4: agents outside the generator family (retrieval rankers such as the poly-encoder,
BlenderBot 2/3, SeeKeR) are refused where a model is accepted, naming the agent and what is
supported: the model loader, BOT_MODEL at start, the variants file and `admin variants add`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bot.config import ConfigError, Settings
from bot.engine.variants import load_experiment
from bot.inference.model import load_shared_agent
from bot.model_files import unserved_agent
from tests.integration.engine.test_incomplete_models import copy_without
from tests.integration.engine.test_live_variants import assert_add_refused
from tests.integration.engine.test_live_variants import (
    one_variant_admin as one_variant_admin,  # the fixture
)


def with_agent(tiny_model_file: str, dest: Path, agent: str) -> str:
    """A complete copy of the tiny model whose options name `agent`."""
    copy = copy_without(tiny_model_file, dest)
    opt_file = Path(f"{copy}.opt")
    opt = json.loads(opt_file.read_text())
    opt["model"] = agent
    opt_file.write_text(json.dumps(opt))
    return copy


@pytest.mark.parametrize(
    ("agent", "why"),
    [
        ("transformer/polyencoder", "is a retrieval ranker"),
        ("transformer/biencoder", "is a retrieval ranker"),
        ("projects.blenderbot2.agents.blenderbot2:BlenderBot2FidAgent", "retrieval, search"),
        ("projects.seeker.agents.seeker:ComboFidGoldDocumentAgent", "retrieval, search"),
        ("rag", "retrieval, search"),
    ],
)
def test_agents_outside_the_generator_family_are_named(agent: str, why: str) -> None:
    assert why in (unserved_agent(agent) or "")


@pytest.mark.parametrize("agent", ["transformer/generator", "bart", "seq2seq", "hugging_face/gpt2"])
def test_generators_pass_the_options_check(agent: str) -> None:
    assert unserved_agent(agent) is None


def test_the_loader_refuses_a_polyencoder_before_loading_it(
    tiny_model_file: str, tmp_path: Path
) -> None:
    poly = with_agent(tiny_model_file, tmp_path / "poly", "transformer/polyencoder")
    settings = Settings(_env_file=None, data_dir=tmp_path, bot_model=poly)  # type: ignore[call-arg]
    with pytest.raises(ConfigError) as caught:
        load_shared_agent(settings)
    message = str(caught.value)
    assert "its agent transformer/polyencoder is a retrieval ranker" in message
    assert "Supported: TorchGeneratorAgent subclasses" in message
    assert "transformer/generator" in message


def test_the_loader_refuses_an_agent_that_is_no_generator(
    tiny_model_file: str, tmp_path: Path
) -> None:
    """Names the options check does not know are checked on the class: repeat_label is no
    TorchGeneratorAgent."""
    other = with_agent(tiny_model_file, tmp_path / "rl", "repeat_label")
    settings = Settings(_env_file=None, data_dir=tmp_path, bot_model=other)  # type: ignore[call-arg]
    with pytest.raises(ConfigError, match=r"its agent repeat_label is not a generator"):
        load_shared_agent(settings)


def test_the_variants_file_refuses_a_polyencoder(tiny_model_file: str, tmp_path: Path) -> None:
    poly = with_agent(tiny_model_file, tmp_path / "poly", "transformer/polyencoder")
    vf = tmp_path / "v.toml"
    vf.write_text(
        f'[[variants]]\nname = "a"\nmodel = "{tiny_model_file}"\ncontrol = true\n'
        f'[[variants]]\nname = "poly"\nmodel = "{poly}"\n'
    )
    settings = Settings(_env_file=None, data_dir=tmp_path, variants_file=vf)  # type: ignore[call-arg]
    with pytest.raises(ConfigError, match=r"variant 'poly': .*transformer/polyencoder is a retr"):
        load_experiment(settings)


def test_admin_variants_add_refuses_a_polyencoder(
    one_variant_admin: Settings,
    tmp_path: Path,
    tiny_model_file: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    poly = with_agent(tiny_model_file, tmp_path / "poly", "transformer/polyencoder")
    why = "transformer/polyencoder is a retrieval ranker"
    assert_add_refused(one_variant_admin, "poly", poly, why, capsys)
