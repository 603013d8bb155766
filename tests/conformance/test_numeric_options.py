"""Every numeric option of every ``attnconf`` subcommand is range-checked by the parser (issue 29): a value is
accepted and in range, or the command line is refused with exit 2 and one line naming the flag, never a traceback.

The parser runs in-process (:func:`conformance.cli.build_parser`, and :func:`conformance.cli.main` for refusals,
which stop before any command runs): no worker starts.  Values come from a fixed list of edge cases (NaN, inf,
1e309, -1, 0, 10**12, '', ' 3', unicode digits, ...) and from Hypothesis (floats, integers and text rendered as
the user would type them), in both spellings ``--flag VALUE`` and ``--flag=VALUE``.
"""

from __future__ import annotations

import contextlib
import io
import math
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conformance.cli import build_parser, main


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


@dataclass(frozen=True)
class Flag:
    """One numeric option: the command line before it, its name, the Namespace attribute, and the oracle saying
    whether a value must be accepted (independently of the implementation: from the documented range)."""

    prefix: tuple[str, ...]
    flag: str
    dest: str
    accepts: Callable[[str], bool]

    @property
    def id(self) -> str:
        return f"{self.prefix[0]} {self.flag}"


def float_in(low: float, high: float, *, low_open: bool = False) -> Callable[[str], bool]:
    def ok(text: str) -> bool:
        x = _float(text)
        return x is not None and math.isfinite(x) and (x > low if low_open else x >= low) and x <= high

    return ok


def int_in(low: int, high: int) -> Callable[[str], bool]:
    def ok(text: str) -> bool:
        x = _int(text)
        return x is not None and low <= x <= high

    return ok


def auto_or(inner: Callable[[str], bool], auto: Callable[[str], bool] = lambda t: t == "auto") -> Callable:
    return lambda text: auto(text) or inner(text)


def shard_ok(text: str) -> bool:
    parts = text.split("/")
    if len(parts) != 2:
        return False
    i, n = _int(parts[0]), _int(parts[1])
    return i is not None and n is not None and 0 <= i < n


def budget_ok(text: str) -> bool:
    import re

    t = text.strip().lower()
    if t.isascii() and t.isdigit():
        return len(t) < 20 and 1 <= int(t) < 10**18
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(s|m|h)", t)
    return bool(m) and 0 < float(m.group(1)) * {"s": 1, "m": 60, "h": 3600}[m.group(2)] < math.inf


def gpus_ok(text: str) -> bool:
    if text.strip() == "all":
        return True
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isascii() and p.isdigit() and len(p) < 5 and int(p) < 1024 for p in parts):
        return False
    return len(set(map(int, parts))) == len(parts)


WEEK = 7 * 24 * 3600
SEED = int_in(0, 2**32 - 1)
FLAGS = [
    Flag(("run",), "--timeout", "timeout", float_in(0, WEEK, low_open=True)),
    Flag(("run",), "--seed", "seed", SEED),
    Flag(("run",), "--limit", "limit", int_in(1, 10**5000)),
    Flag(("run",), "--jobs", "jobs", auto_or(int_in(1, 1024))),
    Flag(("run",), "--spare-workers", "spare_workers", auto_or(int_in(0, 16))),
    Flag(("run",), "--shard", "shard", shard_ok),
    Flag(("run",), "--gpus", "gpus", gpus_ok),
    Flag(("fuzz",), "--seed", "seed", SEED),
    Flag(("fuzz",), "--timeout", "timeout", float_in(0, WEEK, low_open=True)),
    Flag(("fuzz",), "--max-shrink-steps", "max_shrink_steps", int_in(0, 10**6)),
    Flag(("fuzz",), "--max-tokens", "max_tokens", int_in(64, 2**17)),
    Flag(("fuzz",), "--max-heads", "max_heads", int_in(1, 1024)),
    Flag(("fuzz",), "--budget", "budget", budget_ok),
    Flag(("compare", "old.jsonl", "new.jsonl"), "--ratio-threshold", "ratio_threshold", float_in(1, math.inf)),
    Flag(("compare", "old.jsonl", "new.jsonl"), "--ratio-floor", "ratio_floor", float_in(0, math.inf)),
    Flag(
        ("compare", "old.jsonl", "new.jsonl"),
        "--perf-threshold",
        "perf_threshold",
        auto_or(float_in(0, math.inf), lambda t: t.strip() == "auto"),
    ),
    Flag(("cases", "--suite", "smoke"), "--strength", "strength", int_in(1, 8)),
]

#: The values the issue names, and their neighbours.
EDGES = [
    "nan", "NaN", "-nan", "inf", "-inf", "Infinity", "1e309", "-1e309", "-1", "-0", "0", "0.0", "1", "2", "3",
    "10**12", "1000000000000", "1e12", "4294967295", "4294967296", "1e-320", "", " ", " 3", "3 ", "1_000",
    "0x10", "1.5", "١٢", "auto", " auto", "all", "0/1", "1/1", "0/0", "-1/2", "3/2", "0,0", "0,1", "12s", "1.5h",
    "0s", "99999999999999999999999999999999999999h", "9" * 5000, "--", "-", "abc", "\n", "1\n2",
]  # fmt: skip


@pytest.fixture(scope="module")
def parser():
    return build_parser()


#: (flag id, value) of every refusal seen, to count the bad inputs tried
REFUSED: set[tuple[str, str]] = set()


def check(parser, flag: Flag, value: str, spelled_together: bool) -> None:
    argv = [*flag.prefix, f"{flag.flag}={value}"] if spelled_together else [*flag.prefix, flag.flag, value]
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            args = parser.parse_args(argv)
        except SystemExit as exc:
            code = exc.code
        else:
            code = None
    text = err.getvalue()
    assert "Traceback" not in text
    if code is None:
        assert flag.accepts(value), f"{flag.id} accepted {value!r}"
        got = getattr(args, flag.dest)
        if isinstance(got, float):
            assert math.isfinite(got)
        return
    REFUSED.add((flag.id, value))
    assert code == 2, (flag.id, value, text)
    lines = text.strip().splitlines()
    assert len(lines) == 1, (flag.id, value, text)
    # the flag is named, unless argparse read a value starting with '-' as an option (it then names the flag too)
    assert flag.flag in lines[0], (flag.id, value, text)
    if spelled_together or not value.startswith("-"):
        assert not flag.accepts(value), f"{flag.id} refused {value!r}: {text}"


@pytest.mark.parametrize("flag", FLAGS, ids=[f.id for f in FLAGS])
@pytest.mark.parametrize("value", EDGES, ids=[repr(v[:12]) for v in EDGES])
def test_edge_values(parser, flag: Flag, value: str) -> None:
    check(parser, flag, value, spelled_together=True)
    if value and not value.startswith("-"):
        check(parser, flag, value, spelled_together=False)


def _typed() -> st.SearchStrategy[str]:
    floats = st.floats(allow_nan=True, allow_infinity=True)
    return st.one_of(
        floats.map(repr),
        floats.map(lambda x: f"{x:g}"),
        floats.map(lambda x: f"{x:.17e}"),
        st.integers(min_value=-(2**70), max_value=2**70).map(str),
        st.integers(min_value=-5, max_value=5000).map(str),
        st.text(max_size=12),
        st.text(alphabet="0123456789.-+eE/,smh naif_ ", max_size=10),
    )


@pytest.mark.parametrize("flag", FLAGS, ids=[f.id for f in FLAGS])
@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=_typed(), together=st.booleans())
def test_drawn_values(parser, flag: Flag, value: str, together: bool) -> None:
    if "\x00" in value:
        value = value.replace("\x00", "")  # no argv holds a NUL
    check(parser, flag, value, spelled_together=together or not value or value.startswith("-"))


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--jobs", str(10**12)],
        ["run", "--timeout", "1e12"],
        ["fuzz", "--seed", "-1"],
        ["fuzz", "--timeout", "0"],
        ["fuzz", "--max-heads", str(10**12)],
        ["compare", "a", "b", "--ratio-threshold", "nan"],
        ["compare", "a", "b", "--ratio-threshold=-1"],
        ["compare", "a", "b", "--ratio-threshold", "0.5"],
        ["compare", "a", "b", "--ratio-floor", "inf"],
        ["compare", "a", "b", "--perf-threshold", "nan"],
        ["cases", "--suite", "smoke", "--coverage", "--strength", "99"],
    ],
)
def test_the_reported_values_are_refused_by_main_with_one_line(argv: list[str], capsys) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and argv[-2].split("=")[0] in err[0] and "Traceback" not in err[0]


def test_the_bad_inputs_tried_are_counted() -> None:
    """Runs last in this module (pytest keeps file order): the refusals seen above, by flag."""
    if not REFUSED:
        pytest.skip("run with the tests above")
    assert len({f for f, _ in REFUSED}) == len(FLAGS)  # every flag refused something
    print(f"\nnumeric options: {len(REFUSED)} distinct (flag, value) refusals tried over {len(FLAGS)} flags")
