"""The layout section of docs/architecture.md lists exactly the modules under bot/, so it cannot
drift.

The section is the code block between `<!-- layout:start -->` and `<!-- layout:end -->`. Each
line that starts with `bot/` names one path, then says what it holds:

- `bot/service/inbox.py  ...`: a module, one line for every `*.py` file except `__init__.py`;
- `bot/tg/  ...`: a package, one line for every folder with an `__init__.py` (that line stands for
  the package's `__init__.py`, so `__init__.py` files are not listed themselves).

The tree is what git knows under bot/ (`git ls-files bot`) plus new files git does not ignore yet,
less files deleted from the work tree: on a clean checkout that is exactly `git ls-files bot`, and
while editing, a module added or removed fails this test until docs/architecture.md says so too.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path, PurePosixPath

import pytest

ROOT = Path(__file__).resolve().parents[2]
START, END = "<!-- layout:start -->", "<!-- layout:end -->"
LAYOUT = ROOT / "docs" / "architecture.md"


def layout_paths() -> list[str]:
    """The `bot/...` paths named by the layout block, in order (duplicates kept)."""
    text = LAYOUT.read_text(encoding="utf-8")
    assert text.count(START) == 1 and text.count(END) == 1, f"layout markers missing in {LAYOUT}"
    section = text[text.index(START) + len(START) : text.index(END)]
    block = re.search(r"^```\n(.*?)^```$", section, re.M | re.S)
    assert block, "no code block between the layout markers"
    paths = []
    for line in block.group(1).splitlines():
        if not line.startswith("bot/"):
            continue
        path, _, what = line.partition(" ")
        assert what.strip(), f"{path}: the layout line does not say what it holds"
        paths.append(path)
    return paths


def tree_python_files() -> set[str]:
    """Every *.py file under bot/ that git tracks or would track, and that exists."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", "bot"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    return {p for p in listed if p.endswith(".py") and (ROOT / p).is_file()}


def expected_lines(files: set[str]) -> set[str]:
    """Module lines for files, package lines (`dir/`) for each `__init__.py`."""
    lines = set()
    for f in files:
        path = PurePosixPath(f)
        lines.add(f"{path.parent}/" if path.name == "__init__.py" else f)
    return lines


def test_layout_lists_exactly_the_modules_and_packages_of_bot() -> None:
    listed = layout_paths()
    duplicates = sorted({p for p in listed if listed.count(p) > 1})
    assert not duplicates, f"listed twice in the layout of docs/architecture.md: {duplicates}"
    want = expected_lines(tree_python_files())
    missing = sorted(want - set(listed))
    stale = sorted(set(listed) - want)
    assert not missing and not stale, f"layout out of date: add {missing}, remove {stale}"


def test_every_module_line_sits_under_its_package_line() -> None:
    """Grouped by package: a module comes after its package's line (top-level ones aside)."""
    seen: set[str] = set()
    for path in layout_paths():
        if path.endswith("/"):
            seen.add(path)
            continue
        package = f"{PurePosixPath(path).parent}/"
        assert package in seen, f"{path} is listed before its package line {package}"
