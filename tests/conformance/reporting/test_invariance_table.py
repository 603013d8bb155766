"""The report's invariance matrix (conformance/reporting/invariance_table.py)."""

from __future__ import annotations

from conformance.records import CheckResult, Status
from conformance.reporting.invariance_table import COLUMNS, invariance_sections


def _rec(backend, case, status=Status.PASS, extra=None, reason=""):
    return CheckResult(
        case_id=str(sorted(case.items())),
        backend=backend,
        family="f",
        status=status,
        case=case,
        reason=reason,
        extra=extra or {},
    )


def _eq(equal=True, rows=0):
    return {"equal": equal, "rows": rows, "total_rows": 4, "max_abs": 0.0 if equal else 0.5}


def test_cells_modes_and_notes():
    inv_kept = {"invariance": {"kind": "run", "kept": True, "promised": True, "pairs": [{"a": "x", "b": "y", **_eq()}]}}
    inv_broken = {
        "invariance": {
            "kind": "batch",
            "kept": False,
            "promised": False,
            "pairs": [{"a": "in batch", "b": "alone", **_eq(False, 1)}],
        }
    }
    graph = {"graph": {"replays": [{"vs_eager": _eq(), "vs_plain": _eq(False, 2)}]}}
    sglang = {"graph": {"replays": [{"vs_eager": _eq(), "vs_own_call": _eq()}]}}  # an old record's key, still read
    records = [
        _rec("k", {"invariance": "run"}, extra=inv_kept),
        _rec("k", {"invariance": "batch", "num_splits": 1}, Status.FAIL, inv_broken),
        _rec("k", {"graph": [2, 1]}, extra=graph),
        _rec("k", {"graph": [2, 1], "engine": "sglang_fa"}, extra=sglang),
        _rec("k", {"invariance": "splits"}, Status.UNSUPPORTED, reason="splits: no num_splits"),
        _rec("k", {"requests": [[1, 1]]}),  # neither: not in the matrix
    ]
    m = invariance_sections(records, ["k", "other"])
    assert m["columns"] == list(COLUMNS)
    rows = {(r["backend"], r["mode"]): [c and c["text"] for c in r["cells"]] for r in m["rows"]}
    # columns: run, batch, neighbour, splits, graph = eager, graph vs own call
    assert rows[("k", "default")] == ["kept 1/1", None, None, "n/a", "kept 1/1", "broken 1/1"]
    assert rows[("k", "num_splits = 1")] == [None, "broken 1/1, FAIL 1", None, None, None, None]
    assert rows[("k", "engine sglang_fa")] == [None, None, None, None, "kept 1/1", "kept 1/1"]
    assert not any(b == "other" for b, _ in rows)
    assert any("'alone' vs 'in batch': 1 rows" in n for n in m["notes"])
    assert any("graph vs own call" in n and "replay 0: 2 rows" in n for n in m["notes"])


def test_no_matrix_without_such_records_and_missing_comparisons_are_not_a_pass():
    assert invariance_sections([_rec("k", {"requests": [[1, 1]]})], ["k"]) is None
    bare = _rec("k", {"graph": [1]}, extra={"graph": {"replays": [{"vs_eager": _eq()}]}})
    m = invariance_sections([bare], ["k"])
    cells = m["rows"][0]["cells"]
    assert cells[4]["text"] == "kept 1/1" and cells[5]["text"] == "n/a"
    assert "no vs_plain comparison" in cells[5]["reason"]


def test_graph_cells_say_when_no_graph_was_captured():
    """A CPU device records ``captured: false`` (the replays ran eagerly): the cell and a note say so, so a CPU run
    never reads as CUDA graphs kept (issue 28); a captured graph's cell is unchanged."""
    eager = {"graph": {"captured": False, "replays": [{"vs_eager": _eq(), "vs_plain": _eq()}]}}
    captured = {"graph": {"captured": True, "replays": [{"vs_eager": _eq(), "vs_plain": _eq()}]}}
    records = [
        _rec("k", {"graph": [2, 1]}, extra=eager),
        _rec("k", {"graph": [3, 1]}, extra=captured),
        _rec("e", {"graph": [2, 1]}, extra=eager),
        _rec("g", {"graph": [2, 1]}, extra=captured),
    ]
    m = invariance_sections(records, ["k", "e", "g"])
    rows = {r["backend"]: [c and c["text"] for c in r["cells"]][4:] for r in m["rows"]}
    assert rows == {
        "k": ["kept 2/2, no graph captured in 1"] * 2,
        "e": ["kept 1/1, no graph captured"] * 2,
        "g": ["kept 1/1"] * 2,
    }
    notes = [n for n in m["notes"] if "captured" in n]
    assert len(notes) == 1 and notes[0].startswith(
        "No graph captured on device `cpu` (graph cases per kernel: e 1, k 1)"
    )
    assert "not a CUDA graph" in notes[0]
