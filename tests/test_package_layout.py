"""The layout of the whole package (``attnref/``, ``attnfast/``, ``conformance/``): no import cycle, modules kept small.

The import graph is read from the source (``ast``), as in ``tests/conformance/engines/test_layout.py`` but over
the three top-level packages together, so that a cycle through two of them (``attnfast`` -> ``conformance`` ->
``attnfast``) is seen too.  Every ``import`` and ``from ... import`` counts wherever it stands (module level,
inside a function, under ``TYPE_CHECKING``): a lazy import only hides a cycle from the interpreter, not from the
design (``reporting/shards.py`` once imported ``build_parser`` from ``cli.py`` inside a function while ``cli.py``
imported ``shards.py``: the report layer depended on the command line).  An edge goes to the module named
(``from pkg import name`` to ``pkg.name`` when that is a module, else to ``pkg``, its ``__init__``); the implicit
import of a module's parent packages is not an edge (a package ``__init__`` re-exporting its modules is no cycle
unless one of them imports the package back).

No cycle is the least of it: the packages form layers, no import going up (import-linter's contracts in
pyproject.toml, ``tests/ci/test_layers.py``); this test still finds a cycle inside one layer, between modules.

The size rule is the developers' guide's "split a module before it passes ~400 lines": a module over
:data:`MAX_LINES` must say why in its docstring, on a line starting ``Size:``.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("attnref", "attnfast", "conformance")
#: lines a module may have without a ``Size:`` line in its docstring saying why it is longer
MAX_LINES = 450


def module_files(repo: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """``dotted name -> file`` of every module of the packages (a package ``__init__`` is the package's name)."""
    out = {}
    for package in packages:
        for path in sorted((repo / package).rglob("*.py")):
            parts = list(path.relative_to(repo).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def import_graph(files: dict[str, Path]) -> dict[str, set[str]]:
    """``module -> modules of files it imports`` (see the module docstring for what counts as an edge)."""
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                    source = f"{base}.{node.module}" if node.module else base
                else:
                    source = node.module or ""
                targets = [f"{source}.{a.name}" if f"{source}.{a.name}" in files else source for a in node.names]
            edges.update(t for t in targets if t in files and t != name)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as ``[a, b, ..., a]``, or None (depth-first search, nodes grey while on the stack)."""
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def oversized(path: Path, limit: int = MAX_LINES) -> str | None:
    """Why a module is too long (its line count, no ``Size:`` reason in its docstring), or None when it is fine."""
    text = path.read_text(encoding="utf-8")
    lines = len(text.splitlines())
    if lines <= limit:
        return None
    doc = ast.get_docstring(ast.parse(text, str(path))) or ""
    if any(line.strip().startswith("Size:") and line.strip() != "Size:" for line in doc.splitlines()):
        return None
    return f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path}: {lines} lines"


FILES = module_files(REPO, PACKAGES)


def test_the_package_has_no_import_cycle():
    cycle = find_cycle(import_graph(FILES))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_report_layer_does_not_import_the_command_line():
    graph = import_graph(FILES)
    cli = {n for n in FILES if n == "conformance.cli" or n.startswith("conformance.cli.")}
    for name, edges in graph.items():
        if name.startswith(("conformance.reporting", "conformance.records", "conformance.running")):
            assert not edges & cli, f"{name} imports the command line: {sorted(edges & cli)}"


def test_no_module_passes_the_split_size_without_a_reason():
    too_long = [why for path in FILES.values() if (why := oversized(path))]
    assert not too_long, (
        f"modules over {MAX_LINES} lines: split them by concern, or say why in a 'Size: ...' docstring line: "
        + "; ".join(too_long)
    )


# ---------------------------------------------------------------------------------------------- the checkers themselves
def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def test_the_checker_finds_a_cycle_across_packages_hidden_in_a_lazy_import(tmp_path):
    _write(
        tmp_path,
        {
            "a/__init__.py": "",
            "a/base.py": "def f():\n    from b.cli import build\n",
            "b/__init__.py": "",
            "b/cli.py": "from . import shards\n",
            "b/shards.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from a.base import f\n",
        },
    )
    graph = import_graph(module_files(tmp_path, ("a", "b")))
    assert graph["b.cli"] == {"b.shards"}  # ``from . import shards`` is the module, not the __init__
    assert find_cycle(graph) == ["a.base", "b.cli", "b.shards", "a.base"]
    _write(tmp_path, {"b/shards.py": "import os\n"})
    assert find_cycle(import_graph(module_files(tmp_path, ("a", "b")))) is None
    _write(tmp_path, {"b/shards.py": "from .. import b\nfrom b import cli\n"})  # back to the package, then cli
    assert find_cycle(import_graph(module_files(tmp_path, ("a", "b")))) == ["b.cli", "b.shards", "b.cli"]


@pytest.mark.parametrize(
    ("doc", "lines", "flagged"),
    [
        ('"""Short."""\n', 10, False),
        ('"""Long, no reason."""\n', MAX_LINES, True),
        ('"""Long.\n\nSize: one table of 300 rows, data not logic.\n"""\n', MAX_LINES, False),
        ('"""Long.\n\nSize:\n"""\n', MAX_LINES, True),  # a reason must be given, not just the word
        ('"""Long."""\n# Size: a comment is not the docstring\n', MAX_LINES, True),
    ],
)
def test_the_size_rule_wants_a_reason_in_the_docstring(tmp_path, doc, lines, flagged):
    path = tmp_path / "m.py"
    path.write_text(doc + "x = 1\n" * lines)
    assert (oversized(path) is not None) == flagged
