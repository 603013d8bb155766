"""The type checker: ``python -m mypy`` with the checked-in configuration (``[tool.mypy]`` in pyproject.toml) reports
no error over ``attnref/``, ``attnfast/``, ``conformance/`` and ``benchmarks/``, and checks every module of the four
directories (a benchmark left out of the checked files breaks unseen: no CI step runs the benchmarks).

Marked ``slow`` (20 s of CPU and 0.8 GB on a cold cache, most of it reading torch's annotations): ``nox -s slow`` runs
it, and so does .ci/run; ``nox -s lint`` runs mypy too.  mypy is in the ``test`` extra (pinned); without it the test
skips.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("attnref", "attnfast", "conformance", "benchmarks")


@pytest.mark.slow
def test_mypy_reports_no_error_over_every_module_of_the_packages() -> None:
    pytest.importorskip("mypy", reason="mypy is in the test extra")
    res = subprocess.run(
        [sys.executable, "-m", "mypy"], cwd=REPO, capture_output=True, text=True, timeout=900, check=False
    )
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    found = re.search(r"^Success: no issues found in (\d+) source files$", res.stdout, re.MULTILINE)
    assert found, out
    modules = sum(1 for p in PACKAGES for _ in (REPO / p).rglob("*.py"))
    assert int(found.group(1)) == modules, f"mypy checked {found.group(1)} files, {', '.join(PACKAGES)} hold {modules}"
