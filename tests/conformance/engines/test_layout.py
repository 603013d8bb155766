"""The layout of ``conformance/engines/``: one sub-package per engine, imports in one direction, modules kept small.

The import graph and the cycle search are ``tests/test_package_layout.py``'s (what counts as an edge is said
there), over ``conformance/engines/`` alone.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

import conformance.engines
from tests.test_package_layout import find_cycle
from tests.test_package_layout import import_graph as package_import_graph

ROOT = Path(conformance.engines.__file__).parent
PREFIX = "conformance.engines"
#: the framework every engine shares; everything else under ``engines/`` is one engine's sub-package.
SHARED = {
    f"{PREFIX}.base",
    f"{PREFIX}.calls",
    f"{PREFIX}.graph_call",
    f"{PREFIX}.invariance",
    f"{PREFIX}.merge",
    f"{PREFIX}.v0_graph_common",  # vLLM V0's CUDA-graph decode, shared by vllm_v0 and vllm_diff (both V0 seeds)
}
#: lines a module may reach before it must be split (the developers' guide: "split a module before it passes ~400").
MAX_LINES = 420


def module_files(root: Path, prefix: str) -> dict[str, Path]:
    """``dotted name -> file`` of every module under ``root`` (a package ``__init__`` is the package's name)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join([prefix, *parts])] = path
    return out


def import_graph(root: Path, prefix: str) -> dict[str, set[str]]:
    """``module -> modules under root it imports`` (the edges of ``tests/test_package_layout.py``'s graph)."""
    return package_import_graph(module_files(root, prefix))


def _engine_package(name: str) -> str | None:
    """The engine sub-package a module belongs to (None: the shared framework or the registry)."""
    parts = name.split(".")
    return parts[2] if len(parts) > 3 or (len(parts) == 3 and name not in SHARED) else None


GRAPH = import_graph(ROOT, PREFIX)


def test_the_engines_modules_import_one_another_without_a_cycle():
    assert find_cycle(GRAPH) is None, " -> ".join(find_cycle(GRAPH) or [])


def test_every_engine_lives_in_its_own_sub_package_and_imports_no_other_engine():
    engines = {_engine_package(n) for n in GRAPH} - {None}
    assert engines == {"sglang", "vllm_diff", "vllm_mla", "vllm_v0", "vllm_v1"}
    top = {n for n, p in module_files(ROOT, PREFIX).items() if p.parent == ROOT}
    assert top == {PREFIX, *SHARED}, "only the registry and the shared framework at the top"
    for name, edges in GRAPH.items():
        own = _engine_package(name)
        for target in edges:
            other = _engine_package(target)
            if own is None and name != PREFIX:
                assert other is None, f"the shared framework ({name}) imports an engine ({target})"
            elif own is not None:
                assert other in (None, own), f"{name} imports another engine's module {target}"
                assert target != PREFIX, f"{name} imports the registry ({PREFIX}), which imports every engine"


def test_every_registered_engine_is_a_sub_package_module():
    for name, target in conformance.engines.ENGINES.items():
        module = target.partition(":")[0]
        assert module in GRAPH, f"ENGINES[{name!r}] = {target!r} is not a module under engines/"
        assert name == "merge" or _engine_package(module) is not None, f"{name} should live in a sub-package"


@pytest.mark.parametrize("name", sorted(GRAPH))
def test_modules_stay_below_the_split_size(name):
    lines = len(module_files(ROOT, PREFIX)[name].read_text().splitlines())
    assert lines <= MAX_LINES, f"{name} has {lines} lines: split it by concern"


# ---------------------------------------------------------------------------------------------- the checker itself
def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def test_the_checker_finds_a_cycle_hidden_in_a_lazy_import(tmp_path):
    _write(
        tmp_path,
        {
            "__init__.py": "",
            "base.py": "",
            "eng/__init__.py": "from .fa import Engine\n",
            "eng/runner.py": "from ..base import x\n\ndef slot():\n    from .dcp import dcp_slot\n",
            "eng/dcp.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .fa import Engine\n",
            "eng/fa.py": "from . import runner\nfrom .runner import slot\n",
        },
    )
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.eng.fa"] == {"pkg.eng.runner"}  # ``from . import runner`` is the module, not the __init__
    assert graph["pkg.eng.runner"] == {"pkg.base", "pkg.eng.dcp"}
    assert find_cycle(graph) == ["pkg.eng.fa", "pkg.eng.runner", "pkg.eng.dcp", "pkg.eng.fa"]
    _write(tmp_path, {"eng/dcp.py": "x = 1\n"})
    assert find_cycle(import_graph(tmp_path, "pkg")) is None
    _write(tmp_path, {"eng/dcp.py": "from conformance import x\nfrom .. import eng\n"})  # back to the package
    cycle = ["pkg.eng", "pkg.eng.fa", "pkg.eng.runner", "pkg.eng.dcp", "pkg.eng"]
    assert find_cycle(import_graph(tmp_path, "pkg")) == cycle
