"""The packages as layers: import-linter's contracts (``[tool.importlinter]`` in pyproject.toml) hold, fail on any
upward import (module level, inside a function, under ``TYPE_CHECKING``), and name the layers in the order
``docs/reference/layout.md`` gives, every sub-package and top-level module once.

``nox -s lint`` runs ``lint-imports`` too; import-linter is in the ``test`` extra (pinned).  Each check runs it in a
subprocess (``--no-cache``: nothing written into the tree), the second one on a scratch copy of the packages with
violations planted.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("attnref", "attnfast", "conformance")
LAYOUT = REPO / "docs" / "reference" / "layout.md"
#: import-linter's ``lint-imports`` through this interpreter (the package has no ``__main__``)
LINT_IMPORTS = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` over the packages under ``root`` with ``root/pyproject.toml``'s contracts."""
    try:
        import importlinter  # noqa: F401
    except ModuleNotFoundError:
        pytest.fail("import-linter is not installed: it is in the test extra (pip install -e '.[test]')")
    env = {**os.environ, "PYTHONPATH": str(root)}  # the packages under root, not an installed copy
    return subprocess.run(
        [sys.executable, "-c", LINT_IMPORTS, "--no-cache", "--no-logo", str(root / "pyproject.toml")],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def contracts() -> list[dict]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def layers() -> list[set[str]]:
    """The layers contract's layers, top first, each the set of its modules."""
    (contract,) = [c for c in contracts() if c["type"] == "layers"]
    return [{m.strip().strip("()") for m in re.split(r"[|:]", layer)} for layer in contract["layers"]]


def test_the_contracts_hold() -> None:
    res = lint_imports(REPO)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert f"Contracts: {len(contracts())} kept, 0 broken." in out, out


#: (file, text appended to it, the line import-linter must report): one upward import of each kind, one import
#: between two engines, one from the reference into the harness
PLANTED = [
    # lazy, as verdict/check.py's composition_of once imported the engines
    ("conformance/verdict/check.py", "\n\ndef _planted():\n    from conformance.engines import get_engine\n",
     "conformance.verdict.check -> conformance.engines"),
    # module level, as the runner once imported the report
    ("conformance/running/runner.py", "\nfrom conformance.reporting import report_render\n",
     "conformance.running.runner -> conformance.reporting.report_render"),
    # under TYPE_CHECKING: an annotation is a dependency too
    ("conformance/cases/sweep.py", "\nimport typing\n\nif typing.TYPE_CHECKING:\n    from attnfast import base\n",
     "conformance.cases.sweep -> attnfast.base"),
    # the bottom of the stack reaching up to the suites
    ("conformance/records.py", "\n\ndef _planted():\n    import conformance.suites.registry\n",
     "conformance.records -> conformance.suites.registry"),
    ("conformance/engines/vllm_v1/fa.py", "\n\ndef _planted():\n    from conformance.engines.sglang import fa\n",
     "conformance.engines.vllm_v1.fa -> conformance.engines.sglang.fa"),
    ("attnref/core.py", "\n\ndef _planted():\n    from conformance.records import CheckResult\n",
     "attnref.core -> conformance.records"),
]  # fmt: skip


def test_the_contracts_fail_on_each_planted_violation(tmp_path: Path) -> None:
    """A copy of the packages with the violations above planted: every one is reported, and the run fails."""
    for package in PACKAGES:
        shutil.copytree(REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    assert lint_imports(tmp_path).returncode == 0  # the copy holds as the tree does
    for rel, text, _ in PLANTED:
        with (tmp_path / rel).open("a", encoding="utf-8") as f:
            f.write(text)
    res = lint_imports(tmp_path)
    out = res.stdout + res.stderr
    assert res.returncode != 0, out
    missed = [line for _, _, line in PLANTED if line not in out]
    assert not missed, f"not reported: {missed}\n{out}"


def sub_packages() -> set[str]:
    """Every sub-package and top-level module of ``conformance``, and ``attnref`` and ``attnfast`` whole."""
    root = REPO / "conformance"
    found = {f"conformance.{p.parent.name}" for p in root.glob("*/__init__.py")}
    found |= {f"conformance.{p.stem}" for p in root.glob("*.py") if p.name != "__init__.py"}
    return found | {"attnref", "attnfast"}


def test_the_layers_name_every_sub_package_once() -> None:
    named = [m for layer in layers() for m in layer]
    assert len(named) == len(set(named)), sorted(m for m in named if named.count(m) > 1)
    assert set(named) == sub_packages(), (
        f"not in a layer: {sorted(sub_packages() - set(named))}; no such package: {sorted(set(named) - sub_packages())}"
    )


def documented_layers(text: str) -> list[set[str]]:
    """The layers of ``layout.md``'s table, top first: rows ``| N | `path` | ...``, a path per row."""
    rows: dict[int, set[str]] = {}
    for number, path in re.findall(r"^\| (\d+) \| `([^`]+)` \|", text, re.MULTILINE):
        module = path.rstrip("/").removesuffix(".py").replace("/", ".")
        assert module not in {m for ms in rows.values() for m in ms}, f"{path} has two rows"
        rows.setdefault(int(number), set()).add(module)
    assert list(rows) == list(range(1, len(rows) + 1)), f"layers numbered out of order: {list(rows)}"
    return list(rows.values())


def test_layout_md_gives_the_contracts_order() -> None:
    """The layer order is written in docs/reference/layout.md, one row per sub-package; the contract says the same."""
    assert documented_layers(LAYOUT.read_text(encoding="utf-8")) == layers()


def test_the_layout_check_sees_a_row_out_of_place() -> None:
    text = LAYOUT.read_text(encoding="utf-8")
    assert documented_layers(text) == layers()
    moved = text.replace("| 9 | `conformance/perf/`", "| 10 | `conformance/perf/`", 1)  # beside the verdict
    assert moved != text and documented_layers(moved) != layers()
    with pytest.raises(AssertionError, match="out of order"):
        documented_layers(text.replace("| 10 | `conformance/verdict/`", "| 18 | `conformance/verdict/`", 1))
    with pytest.raises(AssertionError, match="has two rows"):
        documented_layers(text + "| 3 | `conformance/cli/` | again |\n")
