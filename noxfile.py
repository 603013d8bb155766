"""CI entry points.  ``nox -s tests`` on a CPU machine; on a GPU runner whose torch is preinstalled use
``nox --no-venv -s conformance -- --device cuda --backend fa2 --backend fa4``.

With ``--no-venv`` nothing is installed (the current interpreter must already have the project's
dependencies) and commands run with the interpreter that runs nox; otherwise each session installs the
CPU torch pin first, then the project.

A sweep split over several machines (``.github/workflows/gpu-conformance.yml``, or any CI system):
``shard`` runs one shard on each, ``merge`` joins their files and writes the report, ``gate`` compares
the merged run with a baseline results file and fails on a regression::

    nox --no-venv -s shard -- 0/4 --suite default --backend fa2 --device cuda   # -> shards/shard-0-of-4.jsonl
    nox --no-venv -s merge -- shards/*.jsonl --out merged.jsonl --report report
    nox --no-venv -s gate -- reports/h100-2026-11-24/default-h100.jsonl.gz merged.jsonl --out gate.md

The sessions that run attnconf (``conformance``, ``compare``, ``shard``, ``merge``, ``gate``) run it in the
directory nox was started from, so relative file arguments and default outputs are where the user typed them
(``nox -f path/to/noxfile.py -s gate -- old.jsonl new.jsonl`` reads ``./old.jsonl``), not in the noxfile's
directory, to which nox changes before any session.
"""

from __future__ import annotations

import argparse
import glob
import logging
import os
import shutil
import sys
from collections.abc import Mapping

import nox
from nox.virtualenv import PassthroughEnv

nox.options.sessions = ["tests"]
#: the checkout this noxfile is in: first on the PYTHONPATH of the attnconf commands (:func:`attnconf_env`)
CHECKOUT = os.path.dirname(os.path.abspath(__file__))
#: what nox logs before every session when uv is not installed; no session here uses uv (each makes a virtualenv,
#: or none with ``--no-venv``), so the notice says nothing about them
UV_NOTICE = "uv binary not found."


def not_uv_notice(record: logging.LogRecord) -> bool:
    """A filter of nox's logger: every record but :data:`UV_NOTICE`."""
    return record.getMessage() != UV_NOTICE


logging.getLogger("nox").addFilter(not_uv_notice)
TORCH_PIN = os.environ.get("ATTNCONF_TORCH", "torch==2.13.0")
#: the workflow linters, pinned as in the `test` extra (a newer zizmor may add audits)
WORKFLOW_LINTERS = ("check-jsonschema>=0.39", "zizmor~=1.32.0")
#: import-linter's ``lint-imports`` through the session's interpreter (the package has no ``__main__``)
LINT_IMPORTS = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"


def _install(session: nox.Session, *extras: str) -> None:
    if isinstance(session.virtualenv, PassthroughEnv):
        session.log("--no-venv: using the current interpreter's packages, installing nothing")
        return
    session.install(TORCH_PIN)
    session.install("-e", f".[{','.join(extras)}]" if extras else ".")


def _python(session: nox.Session, *args: str, **kwargs) -> None:
    """``python ARGS`` in the session's virtualenv; with ``--no-venv`` the interpreter running nox (which a
    CI job installed the project into), not whichever ``python`` comes first on PATH."""
    if isinstance(session.virtualenv, PassthroughEnv):
        session.run(sys.executable, *args, external=True, **kwargs)
    else:
        session.run("python", *args, **kwargs)


def attnconf_env(environ: Mapping[str, str], checkout: str = CHECKOUT) -> dict[str, str]:
    """The environment an attnconf command runs with from another directory than the checkout: ``PYTHONPATH`` with
    the checkout first, so ``python -m conformance`` imports this checkout's package as it does when run in the
    checkout (a ``--no-venv`` interpreter need not have the project installed), then ``PYTHONPATH`` as set."""
    rest = environ.get("PYTHONPATH", "")
    return {"PYTHONPATH": os.pathsep.join([checkout, rest]) if rest else checkout}


def _attnconf(session: nox.Session, *args: str, **kwargs) -> None:
    """``python -m conformance ARGS`` in the directory nox was started from (``session.invoked_from``): relative
    paths among ARGS, and the outputs attnconf writes by default, are the user's, not the noxfile directory's."""
    env = {**kwargs.pop("env", {}), **attnconf_env(os.environ)}
    here = session.invoked_from
    if os.path.realpath(here) == os.path.realpath(os.getcwd()):
        _python(session, "-m", "conformance", *args, env=env, **kwargs)
        return
    session.log(f"attnconf runs in {here}, where nox was started: relative paths are read and written there")
    with session.chdir(here):
        _python(session, "-m", "conformance", *args, env=env, **kwargs)


def _parse(session: nox.Session, parser: argparse.ArgumentParser) -> tuple[argparse.Namespace, list[str]]:
    """The session's posargs: (the session's own, the rest for the attnconf command); a bad one is a
    session error with the parser's usage."""
    try:
        return parser.parse_known_args(session.posargs)
    except SystemExit as exc:
        session.error(f"{parser.prog}: bad arguments (exit {exc.code}); {parser.format_usage().strip()}")


#: pytest on every core (pytest-xdist); worksteal hands each worker a contiguous half of the tests (a module's cached
#: contexts stay on one worker) and lets an idle worker take the other's pending tests
_EVERY_CORE = ("-n", "auto", "--dist", "worksteal")
#: the README's test command (its second line, which .ci/run runs): everything but the ``slow`` tests
TEST_ARGS = (*_EVERY_CORE, "-m", "not slow", "tests")
#: ``nox -s slow``, which .ci/run runs after the README's lines: the ``slow`` end-to-end tests, less the 32k-token
#: memory benchmark (tests/attnref/conftest.py: minutes on 2 cores, run only when asked for by name)
BENCH_32K = "tests/attnref/test_bench.py::test_bench_peak_memory_32k"
SLOW_ARGS = (*_EVERY_CORE, "-m", "slow", "--deselect", BENCH_32K, "tests")


@nox.session
def tests(session: nox.Session) -> None:
    """CPU tests (GPU tests skip with a reason): the README's test command, then the ``slow`` ones (``nox -s slow``);
    ``nox -s tests -- ARGS`` runs ``pytest -q ARGS`` instead."""
    _install(session, "test")
    if session.posargs:
        _python(session, "-m", "pytest", "-q", *session.posargs)
        return
    _python(session, "-m", "pytest", "-q", *TEST_ARGS)
    _python(session, "-m", "pytest", "-q", *SLOW_ARGS)


@nox.session
def slow(session: nox.Session) -> None:
    """The ``slow`` end-to-end tests (``attnconf`` sweeps and fuzz campaigns in subprocesses, kills and resumes,
    process groups: each 5 s of CPU or more), which the README's test command leaves out: ``nox --no-venv -s slow``
    is .ci/run's step after the README's lines.  ``nox -s slow -- ARGS`` adds pytest arguments."""
    _install(session, "test")
    _python(session, "-m", "pytest", "-q", *SLOW_ARGS, *session.posargs)


@nox.session
def conformance(session: nox.Session) -> None:
    """Run a suite and write its report: ``nox -s conformance -- --suite default --backend fa2 --device cuda``."""
    _install(session, "test")
    args = list(session.posargs) or ["--suite", "smoke", "--backend", "sdpa-cpu", "--backend", "flex-cpu"]
    out = os.environ.get("ATTNCONF_OUT", "results.jsonl")
    _attnconf(session, "run", "--out", out, "--resume", *args, success_codes=[0, 1])
    _attnconf(session, "report", out, "--out", os.environ.get("ATTNCONF_REPORT", "report"))


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
    _attnconf(session, "compare", *session.posargs)


def shard_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nox -s shard --", description="one shard of a sweep (attnconf run --shard)")
    p.add_argument("shard", metavar="I/N", help="this job's shard: 0 <= I < N")
    p.add_argument("--out", help="results file (default shards/shard-I-of-N.jsonl)")
    return p


@nox.session
def shard(session: nox.Session) -> None:
    """One shard of a sweep: ``nox -s shard -- I/N --suite default --backend fa2 --device cuda [run options]``.

    Other options go to ``attnconf run``.  Writes ``shards/shard-I-of-N.jsonl`` (or ``--out``).  Failures
    found by the run (exit 1) do not fail the session (``merge`` reports them, ``gate`` decides), nor does a
    backend that judged no case of this shard (exit 4: a shard may hold none of the cases a backend supports;
    ``merge`` fails when the whole sweep judged nothing of it); usage errors do.
    """
    _install(session)
    args, run_args = _parse(session, shard_parser())
    try:
        i, n = (int(x) for x in args.shard.split("/"))
    except ValueError:
        session.error(f"nox -s shard: the first argument must be I/N, got {args.shard!r}")
    out = args.out or os.path.join("shards", f"shard-{i}-of-{n}.jsonl")
    run = ["run", "--shard", f"{i}/{n}", "--out", out, "--no-progress", *run_args]
    _attnconf(session, *run, success_codes=[0, 1, 4])


def merge_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nox -s merge --", description="shard files -> report + merged file")
    p.add_argument("shards", nargs="+", help="the shard files (results of `nox -s shard`)")
    p.add_argument("--out", default="merged.jsonl", help="merged results file (default merged.jsonl)")
    p.add_argument("--report", default="report", help="report directory (default report/)")
    p.add_argument("--summary", help="also write the merge summary (Markdown) here")
    p.add_argument("--allow-incomplete", action="store_true", help="do not fail on missing shards or pairs")
    p.add_argument(
        "--allow-unjudged",
        action="store_true",
        help="do not fail when a backend judged no case in any shard (attnconf merge exits 4 then)",
    )
    return p


@nox.session
def merge(session: nox.Session) -> None:
    """Shards -> report + one results file: ``nox -s merge -- SHARD... [--out merged.jsonl] [--report DIR]``.

    The report is written first (it shows every shard's runner, even when the merge then fails); the merge
    fails the session when shards or (case, backend) pairs are missing, when the files disagree, or when a backend
    judged no case in any shard (exit 4: every pair unsupported, e.g. the kernel not installed on the runners).
    """
    _install(session, "report")
    args, unknown = _parse(session, merge_parser())
    if unknown:
        session.error(f"nox -s merge: unknown arguments {unknown}; {merge_parser().format_usage().strip()}")
    _attnconf(session, "report", *args.shards, "--out", args.report)
    extra = (["--summary", args.summary] if args.summary else []) + (
        ["--allow-incomplete"] if args.allow_incomplete else []
    )
    extra += ["--allow-unjudged"] if args.allow_unjudged else []
    _attnconf(session, "merge", *args.shards, "--out", args.out, *extra)


def gate_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nox -s gate --", description="compare a baseline with a new run")
    p.add_argument("baseline", help="the baseline results file (.jsonl or .jsonl.gz)")
    p.add_argument("new", nargs="+", help="the new run: a merged file, or its shard files (merged first)")
    p.add_argument(
        "--all-families",
        action="store_true",
        help="compare every backend family of the baseline (default: only those the new run was asked for)",
    )
    return p


@nox.session
def gate(session: nox.Session) -> None:
    """``nox -s gate -- BASELINE NEW [NEW...] [compare options, e.g. --out gate.md]``: fails on a regression,
    on every refusal of ``attnconf compare`` (exit 2: a file unreadable, empty or with skipped lines, another
    suite or tolerance, the new run lacking (case, family) pairs of the baseline), and when a backend family
    judged nothing (exit 4: every pair compared unsupported on one side or both, e.g. the new run on a runner
    without the kernel); ``attnconf compare`` succeeds only with exit 0.

    Several NEW files are merged first (``attnconf merge``: a missing shard or pair fails the gate too).  The
    gate compares the backend families the new run was asked for (``compare --only-new-families``; the
    baseline's other families are listed as outside the comparison), and every baseline pair of those families
    must be in the new run; ``--all-families`` compares them all, and compare's ``--allow-subset`` /
    ``--allow-skipped`` accept less, said in the summary.
    """
    _install(session)
    args, compare_args = _parse(session, gate_parser())
    new = args.new[0]
    if len(args.new) > 1:
        new = os.path.join(os.path.abspath(session.create_tmp()), "gate-merged.jsonl")
        _attnconf(session, "merge", *args.new, "--out", new)
    scope = [] if args.all_families else ["--only-new-families"]
    session.log(
        "gate: "
        + (
            "every backend family of the baseline"
            if args.all_families
            else "the backend families the new run was asked for"
        )
        + "; "
        + (
            "accepting a subset of the baseline's pairs (--allow-subset)"
            if "--allow-subset" in compare_args
            else "every baseline pair of those families must be in the new run"
        )
    )
    _attnconf(session, "compare", args.baseline, new, *scope, *compare_args)


WORKFLOWS = sorted(glob.glob(".github/workflows/*.yml"))


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over the packages and tests; mypy over ``attnref``, ``attnfast``, ``conformance`` and ``benchmarks``
    (``[tool.mypy]`` in pyproject.toml; it reads torch's and the other dependencies' annotations, so the project is
    installed with its test extra, which pins mypy); import-linter's contracts (``[tool.importlinter]``: the packages
    as layers, docs/reference/layout.md); the GitHub workflows through check-jsonschema (the GitHub workflow schema),
    zizmor (offline audit; syntax and schema errors fail) and actionlint when on PATH."""
    if not isinstance(session.virtualenv, PassthroughEnv):
        session.install("ruff", *WORKFLOW_LINTERS)
    _install(session, "test")
    paths = ("attnref", "attnfast", "conformance", "tests", "benchmarks", "examples", "noxfile.py")
    session.run("ruff", "check", *paths)
    session.run("ruff", "format", "--check", *paths)
    _python(session, "-m", "mypy")
    _python(session, "-c", LINT_IMPORTS, "--no-cache", "--no-logo")
    if WORKFLOWS:
        session.run("check-jsonschema", "--builtin-schema", "vendor.github-workflows", *WORKFLOWS)
        session.run("zizmor", "--offline", "--strict-collection", "--no-progress", *WORKFLOWS)
        if shutil.which("actionlint"):
            session.run("actionlint", *WORKFLOWS, external=True)


@nox.session
def docs(session: nox.Session) -> None:
    """The documentation site (``mkdocs.yml``, ``docs/``) built with warnings as errors (``mkdocs build --strict``)
    into ``site/``: ``nox -s docs [-- mkdocs build options, e.g. --site-dir DIR]``.  The project is installed too:
    the CLI reference is generated from its parser and the attnref API reference from its docstrings."""
    _install(session, "docs")
    _python(session, "-m", "mkdocs", "build", "--strict", *session.posargs)


#: the lowest mutation score ``nox -s mutation`` accepts (issue 17): mutants detected / mutants counted
MUTATION_THRESHOLD = 0.95
#: what ``mutmut export-cicd-stats`` writes
MUTMUT_STATS = os.path.join("mutants", "mutmut-cicd-stats.json")


def mutation_score(stats: dict) -> tuple[int, int]:
    """(detected, counted) from mutmut's CI/CD stats: a mutant is detected when a test failed on it (killed) or
    hung past mutmut's time limit (timeout; mutmut's badge counts it so too); every mutant is counted except
    those mutmut skipped.  Survivors, mutants no test reaches and mutants an interrupted run did not try count
    as not detected, so an incomplete run cannot reach the threshold."""
    for key in ("killed", "timeout", "total", "skipped"):
        if not isinstance(stats.get(key), int):
            raise ValueError(f"{MUTMUT_STATS}: field {key!r} must be an integer, got {stats.get(key)!r}")
    return stats["killed"] + stats["timeout"], stats["total"] - stats["skipped"]


def mutmut_results():
    """``scripts/mutation/mutmut_results.py``: mutmut's per-mutant results (the score of each module, the mutants not
    tried yet), one module for this session and for the scripts that run mutants on device hosts without nox;
    imported when the mutation session runs, so that no other session needs ``scripts/``."""
    folder = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "mutation")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    import mutmut_results

    return mutmut_results


def mutated_modules(pyproject: str = "pyproject.toml") -> list[str]:
    """The source files ``[tool.mutmut]`` mutates, as mutmut 3.8 picks them: every ``.py`` file under
    ``source_paths`` that matches an ``only_mutate`` glob and no ``do_not_mutate`` one.  ``ValueError`` when an
    ``only_mutate`` glob matches no file (a module renamed or moved would otherwise leave the set silently)."""
    import fnmatch

    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    with open(pyproject, "rb") as f:
        cfg = tomllib.load(f)["tool"]["mutmut"]
    files = sorted(
        os.path.join(root, name).replace(os.sep, "/")
        for src in cfg["source_paths"]
        for root, _, names in os.walk(src)
        for name in names
        if name.endswith(".py")
    )
    only, never = cfg.get("only_mutate") or ["*"], cfg.get("do_not_mutate", [])
    for pattern in only:
        if not any(fnmatch.fnmatch(f, pattern) for f in files):
            raise ValueError(f"{pyproject}: [tool.mutmut] only_mutate {pattern!r} matches no file")
    return [
        f for f in files if any(fnmatch.fnmatch(f, p) for p in only) and not any(fnmatch.fnmatch(f, p) for p in never)
    ]


def stale_copies(pyproject: str = "pyproject.toml", mutants: str = "mutants") -> list[str]:
    """The files under ``mutants/`` that mutmut 3.8 leaves stale, which ``nox -s mutation`` deletes before a run.

    mutmut copies a source file that is not a Python module into ``mutants/`` only when the copy is absent
    (``utils/file_utils.copy_src_dir``), and copies ``also_copy`` (``tests/``, ``attnfast/``, ...) over the old copy
    without removing what the checkout no longer has.  So after a change the tests would run against old data (a
    ledger's TOML) and old or moved files (a test module renamed, a module moved to another package) would still be
    collected or imported.  Returned, sorted: under ``source_paths``, every copy whose source is gone (a module's
    ``.meta`` and ``.spans`` with it) and every non-``.py`` copy whose bytes differ from its source; under the
    ``also_copy`` folders, every copy whose source is gone.  mutmut's own results (``*.meta``, ``*.spans``,
    ``mutmut-*.json``) and caches (``__pycache__``, ``.hypothesis``, ``.benchmarks``) are never returned; nothing is
    before the first run (no ``mutants/``)."""
    import filecmp

    if not os.path.isdir(mutants):  # before the first run
        return []
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    with open(pyproject, "rb") as f:
        cfg = tomllib.load(f)["tool"]["mutmut"]
    sources = [p.rstrip("/") for p in cfg["source_paths"]]
    copied = [p.rstrip("/") for p in [*cfg.get("also_copy", []), "tests", "test"] if os.path.isdir(p.rstrip("/"))]
    caches = {"__pycache__", ".hypothesis", ".benchmarks", ".pytest_cache"}
    stale = []
    for top in dict.fromkeys(sources + copied):
        for root, dirs, names in os.walk(os.path.join(mutants, top)):
            dirs[:] = [d for d in dirs if d not in caches]
            for name in names:
                copy = os.path.join(root, name)
                source = os.path.relpath(copy, mutants)
                for suffix in (".meta", ".spans"):  # a mutated module's results: stale when the module is gone
                    if source.endswith(".py" + suffix):
                        source = source[: -len(suffix)]
                if not os.path.exists(source):
                    stale.append(copy)
                elif top in sources and not source.endswith(".py") and not filecmp.cmp(source, copy, shallow=False):
                    stale.append(copy)
    return sorted(stale)


def _mutmut(session: nox.Session, *args: str, **kwargs) -> None:
    if isinstance(session.virtualenv, PassthroughEnv):  # the mutmut installed beside the interpreter running nox
        exe = os.path.join(os.path.dirname(sys.executable), "mutmut")
        session.run(exe if os.path.exists(exe) else "mutmut", *args, external=True, **kwargs)
    else:
        session.run("mutmut", *args, **kwargs)


@nox.session
def mutation(session: nox.Session) -> None:
    """Mutation testing of ``attnref/``, ``conformance/verdict/`` and the modules that decide a CI verdict with
    mutmut (``[tool.mutmut]`` in pyproject.toml): ``nox -s mutation [-- --max-children N] [MUTANT-NAME-GLOB...]``.

    Prints the mutants not killed, the kill rate of each mutated module and of all, and fails when one of them is
    below ``MUTATION_THRESHOLD`` (mutants a run with name globs left untried count as not detected).  Results are kept
    in ``mutants/``: a rerun tries only mutants of changed functions and those not tried yet, with or without name
    globs (``mutmut_results().untried_mutants``; delete the folder for a clean run).  Not run by CI (.ci/run):
    docs/guides/mutation-testing.md gives the time it takes.
    """
    import json

    _install(session, "test", "mutation")
    # one torch thread per mutant process: mutmut already runs one process per core
    env = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    stale = stale_copies()
    for path in stale:  # mutmut would test against them (stale_copies); it copies the current ones again
        os.remove(path)
    if stale:
        session.log(f"nox -s mutation: removed {len(stale)} stale copies from mutants/ (e.g. {stale[0]})")
    try:
        todo = mutmut_results().untried_mutants(list(session.posargs))
    except (OSError, ValueError) as exc:
        session.error(f"nox -s mutation: cannot read which mutants have results: {exc}")
    if todo is None:
        session.log(f"nox -s mutation: every mutant of {' '.join(session.posargs)} has a result; nothing to run")
    else:
        _mutmut(session, "run", *todo, env=env)
    _mutmut(session, "export-cicd-stats")
    try:
        with open(MUTMUT_STATS, encoding="utf-8") as f:
            detected, counted = mutation_score(json.load(f))
        per_module = mutmut_results().module_scores(mutated_modules())
    except (OSError, ValueError) as exc:
        session.error(f"nox -s mutation: cannot read the kill rate: {exc}")
    _mutmut(session, "results")  # the mutants not killed, by name (`mutmut show NAME` prints the diff)
    low = []
    for module, (m_detected, m_counted, missed) in per_module.items():
        if not m_counted:
            session.log(f"{module}: no mutants")
            continue
        m_rate, mark = m_detected / m_counted, ""
        if m_rate < MUTATION_THRESHOLD:
            low.append(f"{module} {m_detected}/{m_counted} = {m_rate:.1%}")
            mark = "  BELOW THRESHOLD"
        session.log(f"{module}: {m_detected}/{m_counted} = {m_rate:.1%}, {len(missed)} not detected{mark}")
    if sum(c for _, c, _ in per_module.values()) != counted or sum(d for d, _, _ in per_module.values()) != detected:
        session.error(f"nox -s mutation: mutants/*.meta and {MUTMUT_STATS} disagree on the counts: a broken run")
    rate = detected / counted if counted else 0.0
    verdict = "ok" if counted and rate >= MUTATION_THRESHOLD and not low else "BELOW THRESHOLD"
    session.log(
        f"mutation score: {detected}/{counted} killed = {rate:.1%} (threshold {MUTATION_THRESHOLD:.0%} overall and "
        f"per module): {verdict}"
    )
    if not (counted and rate >= MUTATION_THRESHOLD):
        session.error(f"nox -s mutation: {detected}/{counted} = {rate:.1%} killed, below {MUTATION_THRESHOLD:.0%}")
    if low:
        session.error(f"nox -s mutation: {len(low)} module(s) below {MUTATION_THRESHOLD:.0%}: {'; '.join(low)}")
