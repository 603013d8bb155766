"""Small results files for the report's verdict tests (test_report_verdict.py) and its browser test
(test_report_browser.py): records built directly, no kernel runs.

``write_results`` writes one run on ``cpu``: backend ``kern`` with unexpected failures of two causes, a crash, a
known failure, passes and an unsupported case; ``other`` with passes only; ``refuser`` whose every pair is
unsupported (it judged nothing); a CUDA-graph case replayed eagerly (nothing captured, as on a CPU); kernel-variant
notes written in Markdown.  ``write_baseline`` writes the run it is compared with: the same pairs, with ``kern``'s
window cases passing (so they are new failures in ``write_results``'s file).
"""

from __future__ import annotations

from pathlib import Path

from conformance.cases.case import AttentionCase
from conformance.records import CheckResult, ErrorStats, Header, Status
from conformance.results_writer import append_record

__all__ = ["CASES", "LEDGER", "stats", "write_baseline", "write_files", "write_results"]

#: Window cases (``kern`` fails them), plain causal cases, a sinks case (``kern`` refuses it), a graph case.
WINDOWS = [
    AttentionCase(requests=((5 + i, 9 + i),), num_heads=4, num_kv_heads=2, head_dim=16, window=(3, 0)) for i in range(6)
]
PLAIN = [
    AttentionCase(requests=((7, 7 + i), (1, 4)), num_heads=2, num_kv_heads=2, head_dim=8, causal=True) for i in range(4)
]
SINK = AttentionCase(requests=((2, 2),), num_heads=2, num_kv_heads=1, head_dim=8, sinks=True)
CASES = [*WINDOWS, *PLAIN, SINK]

#: A ledger for ``kern`` that knows the last window case's failure (a test ledger directory's file).
LEDGER = {
    "kern.toml": f'[[failure]]\npattern = "{WINDOWS[-1].id}"\nreason = "KNOWN-WINDOW-BUG"\n'
    'glob_reason = "a test ledger"\n'
}

_BACKENDS = ("kern", "other", "refuser")


def _header() -> Header:
    return Header(
        suite="smoke",
        backends={b: {"name": b, "family": b, "version": "1.0", "available": "yes"} for b in _BACKENDS},
        env={"host": "box", "torch": "2.13.0+cpu", "device": "cpu", "run": {"device": "cpu", "seed": 0}},
        argv=["attnconf", "run", "--suite", "smoke", "--out", "r.jsonl"],
        started="2026-11-27T00:00:00+00:00",
        sweep={"suite": "smoke", "seed": 0, "tol": [], "device": "cpu"},
    )


def stats(ratio: float, failed: tuple[str, ...] = ()) -> ErrorStats:
    """Error statistics of a record whose error ratio is ``ratio`` (failing ``failed`` checks); test_report.py too."""
    return ErrorStats(
        max_abs=ratio * 0.01,
        max_rel=ratio,
        mean_abs=ratio * 1e-3,
        worst=(3, 1, 5),
        mismatch_frac=0.25 if failed else 0.0,
        error_ratio=ratio,
        baseline_max_abs=0.004,
        baseline_mean_abs=4e-4,
        allowed_max_abs=0.01,
        cosine=0.99,
        failed_checks=failed,
    )


def _rec(case: AttentionCase, backend: str, status: str, reason: str = "", **kw) -> CheckResult:
    if status in ("pass", "fail") and "stats" not in kw:
        kw["stats"] = stats(0.3)
    return CheckResult(
        case_id=case.id,
        backend=backend,
        family=backend,
        status=Status(status),
        case=case.to_json(),
        reason=reason,
        version="1.0",
        repro=f"attnconf run --backend {backend} --case-json @{case.id}.json",
        kernel_s=0.002,
        harness_s=0.01,
        **kw,
    )


def _graph_record(backend: str) -> CheckResult:
    """A CUDA-graph case replayed without a captured graph (``captured`` false: what a CPU device records)."""
    eq = {"equal": True, "rows": 0, "total_rows": 4, "max_abs": 0.0}
    case = PLAIN[0].to_json() | {"graph": [2, 1]}
    extra = {
        "graph": {"captured": False, "replays": [{"vs_eager": eq, "vs_plain": eq}, {"vs_eager": eq, "vs_plain": eq}]}
    }
    return CheckResult(
        case_id=PLAIN[0].id + "_graph2.1",
        backend=backend,
        family=backend,
        status=Status.PASS,
        case=case,
        version="1.0",
        stats=stats(0.2),
        extra=extra | {"variant": {"entry": "flash_attn_varlen_func", "num_splits": 1}},
        repro=f"attnconf run --backend {backend} --case graph",
    )


def _records(baseline: bool) -> list[CheckResult]:
    out = []
    for i, case in enumerate(WINDOWS):
        if baseline:
            out.append(_rec(case, "kern", "pass"))
        elif i < 3:
            reason = f"max_error: |out-ref| {0.5 + i:.1e} at (token {i}, head 1, dim 5)"
            out.append(_rec(case, "kern", "fail", reason, stats=stats(40.0 + i, ("max_error",))))
        elif i < 5:
            out.append(_rec(case, "kern", "fail", f"lse: |lse-ref| {2 + i:.1e}", stats=stats(3.0 + i, ("lse",))))
        else:
            out.append(_rec(case, "kern", "fail", "max_error: known", stats=stats(9.0, ("max_error",))))
    for case in PLAIN:
        out.append(_rec(case, "kern", "pass"))
    if not baseline:
        out[-1] = _rec(PLAIN[-1], "kern", "crash", "worker killed by SIGSEGV (exit status -11)\nFatal Python error")
    out.append(_rec(SINK, "kern", "unsupported", "sinks: no sink argument"))
    for case in CASES:
        out.append(_rec(case, "other", "pass"))
        out.append(_rec(case, "refuser", "unsupported", "refuses every case: planted"))
    out.append(_graph_record("other"))
    return out


def write_results(path: Path) -> Path:
    """The small run described in the module docstring, written to ``path``."""
    append_record(path, _header())
    for r in _records(baseline=False):
        append_record(path, r)
    return path


def write_baseline(path: Path) -> Path:
    """The baseline of :func:`write_results`: the same pairs, ``kern`` passing every window case and plain case."""
    append_record(path, _header())
    for r in _records(baseline=True):
        append_record(path, r)
    return path


def write_files(tmp: Path) -> dict[str, Path]:
    """In ``tmp``: the ledger directory of :data:`LEDGER`, :func:`write_results`' run and :func:`write_baseline`'s,
    by name (``tmp``, ``new``, ``old``, ``ledgers``): what the verdict tests report on."""
    ledgers = tmp / "ledgers"
    ledgers.mkdir()
    for name, text in LEDGER.items():
        (ledgers / name).write_text(text)
    return {
        "tmp": tmp,
        "new": write_results(tmp / "new.jsonl"),
        "old": write_baseline(tmp / "old.jsonl"),
        "ledgers": ledgers,
    }
