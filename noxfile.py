"""CI entry points.  ``nox -s tests`` on a CPU machine; on a GPU runner whose torch is preinstalled use
``nox --no-venv -s conformance -- --device cuda --backend fa2 --backend fa4``.

With ``--no-venv`` nothing is installed (the current interpreter must already have the project's
dependencies); otherwise each session installs the CPU torch pin first, then the project.
"""

from __future__ import annotations

import os

import nox
from nox.virtualenv import PassthroughEnv

nox.options.sessions = ["tests"]
TORCH_PIN = os.environ.get("ATTNCONF_TORCH", "torch==2.13.0")


def _install(session: nox.Session, *extras: str) -> None:
    if isinstance(session.virtualenv, PassthroughEnv):
        session.log("--no-venv: using the current interpreter's packages, installing nothing")
        return
    session.install(TORCH_PIN)
    session.install("-e", f".[{','.join(extras)}]" if extras else ".")


def _python(session: nox.Session, *args: str) -> None:
    session.run("python", *args)


@nox.session
def tests(session: nox.Session) -> None:
    """CPU unit tests (GPU tests skip with a reason)."""
    _install(session, "test")
    _python(session, "-m", "pytest", "-q", *(session.posargs or ["tests"]))


@nox.session
def conformance(session: nox.Session) -> None:
    """Run a suite and write its report: ``nox -s conformance -- --suite default --backend fa2 --device cuda``."""
    _install(session, "test")
    args = list(session.posargs) or ["--suite", "smoke", "--backend", "sdpa-cpu", "--backend", "flex-cpu"]
    out = os.environ.get("ATTNCONF_OUT", "results.jsonl")
    session.run("python", "-m", "conformance", "run", "--out", out, "--resume", *args, success_codes=[0, 1])
    _python(session, "-m", "conformance", "report", out, "--out", os.environ.get("ATTNCONF_REPORT", "report"))


@nox.session
def bench(session: nox.Session) -> None:
    """pytest-benchmark: the reference on CPU, the kernels of the perf suite on CUDA."""
    _install(session, "test")
    _python(
        session,
        "-m",
        "pytest",
        "-q",
        "benchmarks",
        "tests/attnref/test_bench.py",
        "--benchmark-enable",
        "--benchmark-json",
        "benchmark.json",
        *session.posargs,
    )


@nox.session
def compare(session: nox.Session) -> None:
    """Upgrade diff: ``nox -s compare -- old.jsonl new.jsonl``; fails when anything regressed."""
    _install(session, "test")
    if len(session.posargs) < 2:
        session.error("usage: nox -s compare -- OLD.jsonl NEW.jsonl [options]")
    _python(session, "-m", "conformance", "compare", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over the packages and tests."""
    if not isinstance(session.virtualenv, PassthroughEnv):
        session.install("ruff")
    paths = ("attnref", "attnfast", "conformance", "tests", "benchmarks", "examples", "noxfile.py")
    session.run("ruff", "check", *paths)
    session.run("ruff", "format", "--check", *paths)
