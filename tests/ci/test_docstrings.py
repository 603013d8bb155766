"""Docstrings state the contract; history, measured figures and case counts live in ``docs/``.

Two rules over every module of ``attnref/``, ``attnfast/`` and ``conformance/`` (read with :mod:`ast`, nothing
imported):

* a module docstring is at most :data:`MODULE_MAX` lines, except the modules of :data:`ALLOWED_LONG`, each with
  its reason;
* no docstring (module, class or function) states how many cases a suite holds: that number changes with every
  sweep, and ``attnconf cases --suite NAME`` prints it (its last line: ``N cases; per feature: ...``).  A sentence
  naming a suite (or the word "suite") with a count of cases (``1,372 covering cases``, ``~18,200``, ``about
  16,100``) fails; a count in a dated measurement belongs to ``docs/`` or ``reports/``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from conformance.suites.descriptions import SUITE_DESCRIPTIONS

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("attnref", "attnfast", "conformance")

#: The longest module docstring, in lines: a contract (what the module provides, its invariants, what a caller
#: may rely on, where a new X goes).
MODULE_MAX = 40

#: Modules whose docstring may exceed :data:`MODULE_MAX` for now, each with why.  Remove an entry once its reason
#: is gone (the test fails on an entry that is no longer needed).
ALLOWED_LONG: dict[str, str] = {}
#: Modules whose docstrings may still state a suite's case count, each with why (same rule for stale entries).
ALLOWED_COUNTS: dict[str, str] = {}

_SUITES = "|".join(re.escape(name) for name in sorted(SUITE_DESCRIPTIONS, key=len, reverse=True))
_SUITE = re.compile(rf"``(?:{_SUITES})``|\bsuites?\b")
#: a count of cases: "1,372 covering cases", "~18,200", "about 16,100 " (an approximate size), "5,400 cases"
_COUNT = re.compile(r"(?:~|\babout )\d[\d,]{2,}\b|\b\d[\d,]*\d (?:[a-z-]+ ){0,2}cases\b")
_SENTENCE = re.compile(r"(?<=[.;:])\s+(?=[A-Z`(*])|\n\s*\n")


def _modules() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py"))


def _rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def _docstrings(tree: ast.Module):
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                yield getattr(node, "lineno", 1), doc


def long_module_docstrings() -> dict[str, int]:
    """Every module whose docstring exceeds :data:`MODULE_MAX` lines, with its line count."""
    out = {}
    for path in _modules():
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")), clean=False)
        if doc is not None and doc.count("\n") + 1 > MODULE_MAX:
            out[_rel(path)] = doc.count("\n") + 1
    return out


def suite_counts(text: str) -> list[str]:
    """The sentences of ``text`` that state a count of a suite's cases."""
    flat = " ".join(text.split("\n"))
    return [s for s in _SENTENCE.split(flat) if _COUNT.search(s) and _SUITE.search(s)]


def test_module_docstrings_are_short():
    long = long_module_docstrings()
    unexplained = {path: n for path, n in long.items() if path not in ALLOWED_LONG}
    assert not unexplained, (
        f"module docstrings over {MODULE_MAX} lines (keep the contract, move history and figures to docs/): "
        f"{unexplained}"
    )
    stale = sorted(set(ALLOWED_LONG) - set(long))
    assert not stale, f"ALLOWED_LONG names modules that are short now (drop them): {stale}"


def test_no_docstring_states_a_suite_case_count():
    found, counted = [], set()
    for path in _modules():
        for line, doc in _docstrings(ast.parse(path.read_text(encoding="utf-8"))):
            hits = [f"{_rel(path)}:{line}: {s.strip()[:160]}" for s in suite_counts(doc)]
            counted |= {_rel(path)} if hits else set()
            found += [] if _rel(path) in ALLOWED_COUNTS else hits
    assert not found, "suite case counts in docstrings (point to `attnconf cases --suite NAME`):\n" + "\n".join(found)
    stale = sorted(set(ALLOWED_COUNTS) - counted)
    assert not stale, f"ALLOWED_COUNTS names modules that state no count now (drop them): {stale}"


@pytest.mark.parametrize(
    "text",
    [
        "``full`` (~18,200: 15,646 sweep cases with long contexts)",
        "The case id of every case of every built-in suite (about 16,100; 5-10 s to build)",
        "Suite ``default``'s sweeps (2,142 hand-picked cases; the suite adds its covering-array cases)",
        "``smoke`` (~150 small cases, a minute on 2 CPU cores)",
        "The ``peer-*`` suites (about 215,000 cases: minutes to build) are left out.",
    ],
)
def test_counts_are_recognised(text):
    assert suite_counts(text)


@pytest.mark.parametrize(
    "text",
    [
        "A case with 2 splits and 16 heads; the suite holds it.",
        "Checked on an H100 (reports/x/README.md: 120 cases, the kernel's wrong rows).",
        "``full`` adds contexts up to 32k keys; ``attnconf cases --suite full`` prints its count.",
        "a number of cases >= 1 (200) or a wall time",
    ],
)
def test_other_numbers_pass(text):
    assert not suite_counts(text)
