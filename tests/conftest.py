"""pytest options of the conformance integration test (tests/conformance/test_conformance.py).

    python -m pytest tests/conformance/test_conformance.py --backend sdpa-cpu --backend flex-cpu --suite smoke
    python -m pytest tests/conformance/test_conformance.py --backend fa2 --device cuda --suite default

``--backend`` takes a registry name or ``module:Class`` and repeats; the default is ``sdpa-cpu`` on
the ``smoke`` suite on ``cpu``, which is what the README's test command (``python -m pytest -q -n auto ... tests``)
executes: about 100 small cases, 10-20 s on 2 cores.

Every test runs torch on one intra-op thread (:func:`_one_thread`), as ``attnconf run``'s CPU workers do.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest
from hypothesis import settings

# The project's one Hypothesis profile: no per-example deadline (a CPU shared with xdist workers and torch's first
# call make example times meaningless) and derandomized, so a CI run and a user's run of the README's test command
# try the same examples and a failure reproduces.  Each property keeps only its own ``max_examples`` (what one
# example costs).  ``HYPOTHESIS_PROFILE=explore`` draws new examples on every run instead (for a search, not CI).
settings.register_profile("attnconf", deadline=None, derandomize=True, print_blob=True)
settings.register_profile("explore", deadline=None, derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "attnconf"))

# The repository root on sys.path, so `tests.conformance.fakes:CrashingBackend` names the same module
# in this process, in `attnconf run` subprocesses and in their workers, also under plain `pytest`.
_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    """One intra-op thread for torch in the test processes (each pytest-xdist worker too) and, through
    ``OMP_NUM_THREADS=1`` unless the caller set it, in the processes the tests start; both restored at the end.

    The tests' tensors are tiny: thread wake-ups dominate, and under ``-n auto`` every core already runs a test
    process.  Measured on the 2-core machine (2026-11-26): 30 tests of tests/conformance/engines/test_vllm_diff.py
    took 13.8 s of CPU (30 s of wall time) with one thread and 32 s (87 s) with two, at load 6; the runner, OOM,
    fuzz-campaign and graphs-CLI test files, which start ``attnconf`` processes, 137 s of CPU with
    ``OMP_NUM_THREADS=1`` and 152 s without, at load 4.  One thread per worker is also what ``attnconf run``
    gives its CPU workers (conformance/running/pool.py); tests of that rule unset the variable themselves.
    """
    env = pytest.MonkeyPatch()
    if "OMP_NUM_THREADS" not in os.environ:
        env.setenv("OMP_NUM_THREADS", "1")
    torch = sys.modules.get("torch")  # imported by collection when any collected test uses it
    before = torch.get_num_threads() if torch is not None else None
    if torch is not None:
        torch.set_num_threads(1)
    yield
    if torch is not None:
        torch.set_num_threads(before)
    env.undo()


@pytest.fixture(autouse=True, scope="session")
def _ctrl_c_reaches_children():
    """SIGINT at Python's default in the test process when it was started with SIGINT ignored, so the processes the
    tests start get it at its default and a test's Ctrl-C (SIGINT) reaches them; restored at the end.

    A pytest started in the background of a non-interactive shell (``cmd &`` in a script) inherits SIGINT ignored,
    and an ignored signal stays ignored across ``exec``: ``attnconf run`` then ignored the Ctrl-C of
    tests/conformance/running/test_runner.py, finished its sweep and exited 0 (2026-11-26).
    """
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        yield
        return
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    except ValueError:  # not the main thread: nothing to change from here
        yield
        return
    yield
    signal.signal(signal.SIGINT, signal.SIG_IGN)


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
