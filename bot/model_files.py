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

import ast
import json
from dataclasses import dataclass
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


# --- zoo: paths without the internet --------------------------------------------------------
#
# ParlAI resolves `zoo:blender/blender_90M/model` by importing `parlai.zoo.blender.blender_90M`
# and calling its `download(datapath)`, which downloads only when the model's directory is not
# built: `parlai.core.build_data.built(directory, VERSION)` reads the directory's `.built`
# file, whose second line must be the module's VERSION. A `.built` with another (or no) version
# makes ParlAI delete the directory and download it again. Unreachable, its download retries for
# about 15 s and ends with "Connection broken too many times". So a zoo model is checked here
# first: staged (built), it loads offline; not staged, the download host is probed for a few
# seconds and, unreachable, the model is refused with the directory to stage it in.

ZOO_DOWNLOADS = "http://parl.ai/downloads/_models/"  # build_data.download_models' host
ZOO_PROBE_TIMEOUT_S = 3.0
# The options ParlAI passes through modelzoo_path when it loads a model (its .opt may name
# another zoo model: that one is downloaded too).
ZOO_OPTIONS = ("init_model", "dict_file", "dict_initpath", "bpe_vocab", "bpe_merge")


@dataclass(frozen=True)
class ZooModel:
    """Where ParlAI keeps a `zoo:` path's files, and the version its `.built` must name."""

    path: str  # zoo:blender/blender_400Mdistill/model
    module: str  # parlai.zoo.blender.blender_400Mdistill
    model_file: Path  # DATA_DIR/parlai/models/blender/blender_400Mdistill/model
    directory: Path  # the directory ParlAI marks built
    version: str | None  # the module's VERSION (None: it declares none)

    def not_built(self) -> str | None:
        """None when ParlAI considers the directory built (it will not download), else why."""
        marker = self.directory / ".built"
        if not marker.is_file():
            return f"no {marker}"
        if self.version is None:
            return None
        lines = marker.read_text(encoding="utf-8", errors="replace").split("\n")
        found = lines[1] if len(lines) > 1 else None
        if found == self.version:
            return None
        return (
            f"{marker} names version {found!r}, ParlAI's zoo expects {self.version!r} on its "
            "second line (otherwise ParlAI deletes the directory to download it again)"
        )


def zoo_model(datapath: str | Path, path: str) -> ZooModel:
    """The zoo model `path` (`zoo:...`) under ParlAI's `datapath` (DATA_DIR/parlai), found as
    `parlai.core.build_data.modelzoo_path` finds it, without importing ParlAI (which imports
    torch): the module's VERSION is read from its source."""
    import importlib.util

    rest = path.split(":", 1)[1]
    animal = rest[: rest.rfind("/")].replace("/", ".") if "/" in rest else rest
    if "." not in animal:
        animal += ".build"
    candidates = [f"parlai.zoo.{animal}", "parlai.zoo." + ".".join(animal.split(".")[:-1])]
    candidates[1] += ".build"
    for module in candidates:
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            spec = None
        if spec is not None and spec.origin:
            break
    else:
        raise ValueError(f"{path} names no ParlAI zoo module ({candidates[0]})")
    model_file = Path(datapath) / "models" / rest
    directory = model_file.parent if "/" in rest else model_file
    return ZooModel(path, module, model_file, directory, _version(Path(spec.origin)))


def _version(source: Path) -> str | None:
    """The version a zoo module builds: the one string it assigns to `VERSION` or `version`,
    passes as `version=` or takes as the default of a `version` argument (None: none, or not
    one)."""
    try:
        tree = ast.parse(source.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    found: set[str] = set()
    for node in ast.walk(tree):
        values: list[ast.expr] = []
        if (
            isinstance(node, ast.Assign)
            and any(
                isinstance(t, ast.Name) and t.id in ("VERSION", "version") for t in node.targets
            )
        ) or (isinstance(node, ast.keyword) and node.arg == "version"):
            values.append(node.value)
        elif isinstance(node, ast.arguments):
            named = node.args[len(node.args) - len(node.defaults) :]
            values += [d for a, d in zip(named, node.defaults, strict=True) if a.arg == "version"]
        found.update(
            v.value for v in values if isinstance(v, ast.Constant) and isinstance(v.value, str)
        )
    return found.pop() if len(found) == 1 else None


def unstaged_zoo_models(datapath: str | Path, path: str) -> list[tuple[ZooModel, str]]:
    """The zoo models loading `path` would download, each with why it is not staged: `path`
    itself, else the zoo paths its staged `.opt` names (ZOO_OPTIONS). Empty: loads offline."""
    model = zoo_model(datapath, path)
    why = model.not_built()
    if why is not None:
        return [(model, why)]
    out: list[tuple[ZooModel, str]] = []
    try:
        opt = json.loads(Path(f"{model.model_file}.opt").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return []  # incomplete_model names it
    named = {opt.get(k) for k in ZOO_OPTIONS} if isinstance(opt, dict) else set()
    for other in sorted(n for n in named if isinstance(n, str) and n.startswith("zoo:")):
        if other.split("/")[:-1] != path.split("/")[:-1]:
            out += unstaged_zoo_models(datapath, other)
    return out


def zoo_unreachable(timeout_s: float = ZOO_PROBE_TIMEOUT_S) -> str | None:
    """None when ParlAI's download host answers within `timeout_s` (any HTTP answer), else
    why not. Goes through the same proxies (http_proxy, ...) as ParlAI's own download."""
    import requests

    try:
        requests.head(ZOO_DOWNLOADS, timeout=(timeout_s, timeout_s), allow_redirects=False)
    except requests.RequestException as err:
        return f"{type(err).__name__}"
    return None


def zoo_refusal(
    datapath: str | Path, path: str, *, timeout_s: float = ZOO_PROBE_TIMEOUT_S
) -> str | None:
    """None when the zoo model `path` can load: staged, or its download host reachable (then
    ParlAI downloads it). Else one sentence: which directory to stage it in, and how."""
    try:
        unstaged = unstaged_zoo_models(datapath, path)
    except ValueError as err:
        return f"{err}: check the spelling against ParlAI's model zoo"
    if not unstaged:
        return None
    reason = zoo_unreachable(timeout_s)
    if reason is None:
        return None
    where = "; ".join(
        f"{m.path} in {m.directory} ({why}; .built's second line: "
        f"{m.version or 'the version the zoo module downloads'})"
        for m, why in unstaged
    )
    return (
        f"{path} is not staged here and ParlAI's model zoo ({ZOO_DOWNLOADS}) cannot be "
        f"reached ({reason} within {timeout_s:g} s). Place the model's files (model, "
        f"model.opt, model.dict and the dictionary's BPE files) and a .built marker: {where}. "
        "docs/models.md, 'A zoo model without internet', says how; or let this machine reach "
        "parl.ai"
    )


# --- the agents the service runs ------------------------------------------------------------
#
# The service serves ParlAI's generator agents: TorchGeneratorAgent subclasses that answer from
# the conversation alone (clones, persona pinning, our batched search and schedulers rest on
# that). Retrieval rankers pick a reply from candidates, and BlenderBot 2/3, SeeKeR and the
# other retrieval-augmented generators need search engines, memories and modules of their own:
# both are refused when a model is accepted, from the `.opt`'s `model` key, before loading.
SERVED_AGENTS = (
    "TorchGeneratorAgent subclasses that answer from the conversation alone: "
    "transformer/generator (BlenderBot 1 and the default model), bart, seq2seq"
)
RANKERS = ("polyencoder", "biencoder", "crossencoder", "ranker", "retriever", "memnn")
RETRIEVAL_AUGMENTED = ("projects.", "parlai.projects.", "rag", "fid", "bb3", "seeker")


def unserved_agent(agent: object) -> str | None:
    """None for an agent name (`.opt` `model`) the service may run, else why not. Options
    without one pass here: the model loader checks the agent class itself."""
    if not isinstance(agent, str) or not agent:
        return None
    name = agent.lower()
    if any(word in name for word in RANKERS):
        return f"its agent {agent} is a retrieval ranker, which picks replies from candidates"
    if name.startswith(RETRIEVAL_AUGMENTED) or name.startswith("internal:"):
        return (
            f"its agent {agent} generates with retrieval, search or memory modules "
            "(BlenderBot 2/3, SeeKeR, RAG/FiD), which this service does not run"
        )
    return None


def unservable_model(model_file: str | Path) -> str | None:
    """None for a model the service can serve, else one sentence saying why not and what to
    do: an incomplete model (incomplete_model), or an agent it does not run."""
    incomplete = incomplete_model(model_file)
    if incomplete is not None:
        return incomplete
    try:
        opt = json.loads(Path(f"{model_file}.opt").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):  # pragma: no cover - checked above
        return None
    why = unserved_agent(opt.get("model"))
    if why is None:
        return None
    return f"the model at {model_file} cannot be served: {why}. Supported: {SERVED_AGENTS}"
