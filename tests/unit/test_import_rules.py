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
    ("bot.engine",),  # the router, the live variants, the allocation
    # The backends, each in its own module or package: a model process (or this one), Ray Serve.
    ("bot.engine.backends",),
    ("bot.inference",),  # what runs inside a model process
    # The seam's floor: the types that cross it, what a backend is and starts a model with, the
    # variants' definitions they name, and the backends' registry with their variant keys.
    SEAM := (
        "bot.engine.protocol",
        "bot.engine.pipe",
        "bot.engine.spec",
        "bot.engine.variants",
        "bot.engine.backends.registry",
        "bot.engine.backends.ray.sizing",
    ),
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
# Only these may import bot.inference: training trains its model, the composition root may
# build anything. The service side (bot.engine) starts the model's code by name only
# (bot.engine.spec.resolve), and bot.inference imports nothing of bot.engine but the seam.
INFERENCE_USERS = ("bot.training", "bot.inference", "bot.__main__", "bot.app", "bot.terminal")


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


def _in(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def upward(edges: dict[str, set[str]]) -> list[str]:
    """Every import from a lower layer up."""
    return sorted(
        f"{a} -> {b}" for a, targets in edges.items() for b in targets if rank(b) < rank(a)
    )


def inference_users(edges: dict[str, set[str]]) -> list[str]:
    """Every import of bot.inference from outside INFERENCE_USERS (bot.engine above all)."""
    return sorted(
        f"{a} -> {b}"
        for a, targets in edges.items()
        for b in targets
        if _in(b, ("bot.inference",)) and not _in(a, INFERENCE_USERS)
    )


def beyond_the_seam(edges: dict[str, set[str]]) -> list[str]:
    """Every import of bot.inference's into bot.engine beyond the seam's floor."""
    return sorted(
        f"{a} -> {b}"
        for a, targets in edges.items()
        for b in targets
        if _in(a, ("bot.inference",))
        and _in(b, ("bot.engine",))
        and b != "bot.engine"
        and rank(b) != rank(SEAM[0])
    )


def test_no_module_imports_a_higher_layer() -> None:
    wrong = upward(graph())
    assert wrong == [], "imports from a lower layer up:\n  " + "\n  ".join(wrong)


def test_the_engine_never_imports_the_model_side() -> None:
    wrong = inference_users(graph())
    assert wrong == [], "\n  ".join(wrong)


def test_the_model_side_imports_only_the_seam_of_the_engine() -> None:
    wrong = beyond_the_seam(graph())
    assert wrong == [], "\n  ".join(wrong)


def test_the_seam_rules_report_a_planted_edge() -> None:
    """The three checks above can fail: each reports an edge planted in a small graph."""
    planted = {
        "bot.engine.router": {"bot.inference.responder", "bot.engine.spec"},
        "bot.engine.backends.local": {"bot.inference.process"},
        "bot.inference.process": {"bot.engine.backends.local", "bot.engine.pipe"},
        "bot.engine.spec": {"bot.engine.router"},
    }
    assert inference_users(planted) == [
        "bot.engine.backends.local -> bot.inference.process",
        "bot.engine.router -> bot.inference.responder",
    ]
    assert beyond_the_seam(planted) == ["bot.inference.process -> bot.engine.backends.local"]
    assert upward(planted) == [
        "bot.engine.spec -> bot.engine.router",
        "bot.inference.process -> bot.engine.backends.local",
    ]


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
