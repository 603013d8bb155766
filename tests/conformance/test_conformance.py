"""Every (case, backend) of the selected suite as one pytest test (options in tests/conftest.py).

pass -> passed; unsupported -> skipped with the backend's reason; a failure that the backend's
ledger (conformance/ledgers/<backend>.toml) explains -> xfail with the ledger's reason; anything
else fails with the record's reason and repro command.  Runs in-process (no crash isolation: use
``attnconf run`` for kernels that may crash); the reference is computed once per case.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from conformance.verdict.check import CaseContext, check_backend, prepare_context
from conformance.running.env import resolve_backend
from conformance.ledger.entries import Ledger, load_ledger
from conformance.records import Status
from conformance.suites.registry import get_suite


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "conformance_pair" not in metafunc.fixturenames:
        return
    backends = metafunc.config.getoption("--backend") or ["sdpa-cpu"]
    cases = get_suite(metafunc.config.getoption("--suite"))
    # Cases outer, backends inner, so the one-case context cache below serves every backend.
    pairs = [(c, b) for c in cases for b in backends]
    metafunc.parametrize("conformance_pair", pairs, ids=[f"{c.id}-{b}" for c, b in pairs])


@pytest.fixture(scope="session")
def device(request: pytest.FixtureRequest) -> str:
    dev = request.config.getoption("--device")
    if dev.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            pytest.skip(f"--device {dev} needs a CUDA device; torch.cuda.is_available() is False")
    return dev


@pytest.fixture(scope="session")
def ledger(request: pytest.FixtureRequest) -> Ledger:
    return load_ledger(request.config.getoption("--ledger-dir"))


@pytest.fixture(scope="session")
def contexts() -> Iterator[dict[tuple[str, str], CaseContext]]:
    """The last case's context only: a suite's contexts together would not fit in memory."""
    yield {}


def test_conformance(conformance_pair, device: str, ledger: Ledger, contexts: dict) -> None:
    case, spec = conformance_pair
    backend = resolve_backend(spec)
    available = backend.is_available()
    if not available:
        pytest.skip(f"{spec} is not available here: {available.reason}")
    key = (case.id, device)
    if key not in contexts:
        contexts.clear()
        contexts[key] = prepare_context(case, seed=0, device=device)
    result = check_backend(contexts[key], backend)
    if result.status is Status.UNSUPPORTED:
        pytest.skip(f"unsupported: {result.reason}")
    if result.status is Status.PASS:
        return
    entry = ledger.explain(result)
    if entry is not None:
        pytest.xfail(f"known failure ({entry.source}): {entry.reason}")
    pytest.fail(f"{result.status.value}: {case.summary()}\n{result.reason}\nrepro: {result.repro}", pytrace=False)
