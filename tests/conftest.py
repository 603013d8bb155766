"""pytest options of the conformance integration test (tests/conformance/test_conformance.py).

    python -m pytest tests/conformance/test_conformance.py --backend sdpa-cpu --backend flex-cpu --suite smoke
    python -m pytest tests/conformance/test_conformance.py --backend fa2 --device cuda --suite default

``--backend`` takes a registry name or ``module:Class`` and repeats; the default is ``sdpa-cpu`` on
the ``smoke`` suite on ``cpu``, which is what the plain CI run (``python -m pytest -q tests``)
executes: about 100 small cases, 10-20 s on 2 cores.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# The repository root on sys.path, so `tests.conformance.fakes:CrashingBackend` names the same module
# in this process, in `attnconf run` subprocesses and in their workers, also under plain `pytest`.
_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("attnconf", "attention conformance")
    # default None, not ["sdpa-cpu"]: with action="append" a list default is extended, not replaced.
    group.addoption(
        "--backend",
        action="append",
        default=None,
        metavar="NAME",
        help="backend for test_conformance (registry name or module:Class); repeatable; default sdpa-cpu",
    )
    group.addoption("--suite", default="smoke", help="conformance suite for test_conformance (default smoke)")
    group.addoption("--device", default="cpu", help="device for test_conformance: cpu, cuda, cuda:N (default cpu)")
    group.addoption("--ledger-dir", default=None, help="known-failure ledgers (default conformance/ledgers)")
