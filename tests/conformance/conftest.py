"""Fixtures shared by the CLI tests of this directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from conformance.cli import main
from conformance.suites.registry import get_suite


@pytest.fixture(scope="module")
def smoke_results_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real run's results file: the first ``smoke`` case on the exact fake backend, one worker, an empty ledger."""
    d = tmp_path_factory.mktemp("data")
    (d / "ledgers").mkdir()
    out = d / "r.jsonl"
    case_id = get_suite("smoke")[0].id
    argv = ["run", "--suite", "smoke", "--case", case_id, "--backend", "tests.conformance.fakes:ExactBackend"]
    assert main([*argv, "--jobs", "1", "--no-progress", "--ledger-dir", str(d / "ledgers"), "--out", str(out)]) == 0
    return out
