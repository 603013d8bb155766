"""``attnconf fuzz`` uses the runner through its public names only: no module of conformance/fuzz imports a
``_private`` name (or a ``_private`` module) of another package, so the runner may change what it keeps private."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

FUZZ = Path(__file__).resolve().parents[3] / "conformance" / "fuzz"


def private_imports(source: str, package: str = "conformance.fuzz") -> list[str]:
    """``module: name`` of every import in ``source`` that reaches a ``_``-prefixed name or module outside
    ``package`` (relative imports stay inside it; ``__future__`` and dunder names are not private)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level or module == package or module.startswith(package + ".") or module == "__future__":
                continue
            modules = [module]
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.Import):
            modules, names = [alias.name for alias in node.names], []
        else:
            continue
        for module in modules:
            if any(part.startswith("_") and not part.startswith("__") for part in module.split(".")):
                found.append(module)
        found += [f"{modules[0]}: {n}" for n in names if n.startswith("_") and not n.startswith("__")]
    return found


@pytest.mark.parametrize("path", sorted(FUZZ.glob("*.py")), ids=lambda p: p.name)
def test_fuzz_imports_no_private_name_of_another_package(path: Path) -> None:
    assert private_imports(path.read_text()) == []


def test_the_check_finds_what_fuzz_used_to_import() -> None:
    before = "from conformance.running.runner import _check_names, _describe, _record\nimport conformance._toml\n"
    assert private_imports(before) == [
        "conformance.running.runner: _check_names",
        "conformance.running.runner: _describe",
        "conformance.running.runner: _record",
        "conformance._toml",
    ]
    inside = "from conformance.fuzz.draw import _private\nfrom .group import _also\n"
    inside += "from __future__ import annotations\n"
    assert private_imports(inside) == []
