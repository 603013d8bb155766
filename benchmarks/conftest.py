"""Options of the ``bench`` session: which adapters to time, and the once-per-run copy bandwidth.

Backends come from ``--bench-backend NAME`` (repeatable), from ``--backend NAME`` when
``tests/conftest.py`` is loaded in the same run (``nox -s bench`` also collects a test file under
``tests/``, so ``nox -s bench -- --backend fa4`` works), or else from the environment variable
``ATTNCONF_BENCH_BACKENDS`` (comma-separated), e.g.::

    python -m pytest benchmarks --benchmark-enable --bench-backend fa4 --benchmark-json bench.json
    ATTNCONF_BENCH_BACKENDS=fa4,torch-flash python -m pytest benchmarks -k anchor

This file does not register ``--backend`` itself: pytest checks option clashes per group only,
so two conftests of one run registering it would crash argparse.

Every number is taken by :mod:`conformance.perf.timing` (STYLE item 9) and stored in the benchmark's
``extra_info``; pytest-benchmark's own columns time the whole measurement loop, not the kernel.
"""

from __future__ import annotations

import os

import pytest
import torch

ENV = "ATTNCONF_BENCH_BACKENDS"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("attnconf-bench")
    group.addoption(
        "--bench-backend",
        action="append",
        default=[],
        dest="bench_backend",
        metavar="NAME",
        help=f"adapter to benchmark (repeatable); default: --backend, else ${ENV} (comma-separated)",
    )
    group.addoption(
        "--bench-cuda-graph",
        action="store_true",
        default=False,
        help="time CUDA-graph replays of each call (no launch gaps in short decode kernels)",
    )


def bench_backends(config: pytest.Config) -> list[str]:
    """Backend names from --bench-backend, else --backend (tests/conftest.py), else the environment."""
    names = list(config.getoption("bench_backend") or [])
    if not names:
        names = list(config.getoption("backend", default=None) or [])
    if not names:
        names = [n.strip() for n in os.environ.get(ENV, "").split(",") if n.strip()]
    return names


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend_name" in metafunc.fixturenames:
        names = bench_backends(metafunc.config)
        # With no backend, one parameter that skips and says how to choose one (never a silent pass).
        metafunc.parametrize("backend_name", names or [None], ids=names or ["no-backend"])


@pytest.fixture(scope="session")
def copy_gbps() -> float | None:
    """Achievable device bandwidth, measured once per session (None without CUDA)."""
    if not torch.cuda.is_available():
        return None
    from conformance.perf.timing import measure_copy_bandwidth

    return measure_copy_bandwidth("cuda")
