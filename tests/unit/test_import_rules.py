"""The layer order of bot/ (docs/architecture.md), held by reading every import with `ast`:
no module imports one from a higher layer, and no modules import each other in a circle.
Every import counts: module level, inside functions and under TYPE_CHECKING alike."""

from __future__ import annotations

import ast
from pathlib import Path

BOT = Path(__file__).resolve().parents[2] / "bot"
# Top to bottom; a module belongs to the longest prefix that names it. A layer may import its
# own and the ones below it.
LAYERS: list[tuple[str, ...]] = [
    (
        "bot.__main__",
        "bot.app",
        "bot.runtime",
        "bot.terminal",
    ),  # entry points, the composition root
    ("bot.tg", "bot.dashboard", "bot.admin", "bot.training"),  # front-ends
    ("bot.service",),  # the queue runtime
    ("bot.reports",),  # the read side (forgetting a chat goes through the use case)
    ("bot.conversations",),  # the use cases
    ("bot.engine",),  # the seam: router, variants, the model-process client
    ("bot.inference",),  # what runs inside a model process
    # The types that cross the seam, and the variants' definitions they name.
    ("bot.engine.protocol", "bot.engine.pipe", "bot.engine.variants"),
    ("bot.db",),
    (
        "bot.config",
        "bot.logs",
        "bot.texts",
        "bot.persona",
        "bot.presets",
        "bot.safety",
        "bot.model_files",
        "bot",
    ),
]
# Only these may import bot.inference: the model-process client starts it, training trains it.
INFERENCE_USERS = ("bot.engine", "bot.training", "bot.inference", "bot.__main__")


def _module(path: Path) -> str:
    parts = path.relative_to(BOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, name: str, modules: set[str]) -> set[str]:
    """The bot modules `path` imports (`from pkg import mod` names the module, not the
    package)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            names = {f"{base}.{a.name}" for a in node.names}
            found.update(names & modules or {base})
            found.update({base} if names - modules else set())
    return {m for m in found if m == "bot" or m.startswith("bot.")}


def graph() -> dict[str, set[str]]:
    modules = {_module(p): p for p in BOT.rglob("*.py")}
    return {
        name: {m for m in _imports(path, name, set(modules)) if m in modules and m != name}
        for name, path in modules.items()
    }


def rank(module: str) -> int:
    best = max(
        (
            (len(prefix), i)
            for i, layer in enumerate(LAYERS)
            for prefix in layer
            if module == prefix or module.startswith(prefix + ".")
        ),
    )
    return best[1]


def test_no_module_imports_a_higher_layer() -> None:
    upward = sorted(
        f"{a} -> {b}" for a, targets in graph().items() for b in targets if rank(b) < rank(a)
    )
    assert upward == [], "imports from a lower layer up:\n  " + "\n  ".join(upward)


def test_only_the_model_process_client_and_training_import_inference() -> None:
    wrong = sorted(
        f"{a} -> {b}"
        for a, targets in graph().items()
        for b in targets
        if b.startswith("bot.inference") and not a.startswith(INFERENCE_USERS)
    )
    assert wrong == [], "\n  ".join(wrong)


def test_no_import_circles() -> None:
    edges = graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            component.append(v)
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    assert circles == [], f"import circles: {circles}"


def test_the_rules_see_the_tree() -> None:
    """The reader above is not blind: it finds the modules and a known edge."""
    edges = graph()
    assert len(edges) > 80 and "bot.db.models" in edges["bot.db.inbox"]
