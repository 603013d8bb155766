"""The report's invariance matrix: which kernel keeps which invariance, in which mode (issue 18).

Rows are (kernel, mode): mode ``num_splits = 1`` holds the cases that pin one split (vLLM's batch-invariant mode,
SGLang's deterministic inference), ``default`` the others, and ``engine <name>`` an engine's own records (its
CUDA-graph scenarios and its invariance scenarios, :mod:`conformance.engines.invariance`; ``engine <name>,
num_splits = 1`` its batch-invariant configuration).  Columns:

* ``run``, ``batch``, ``splits``: the invariance cases (``extra["invariance"]``, :mod:`conformance.graphs.invariance`);
* ``graph = eager``: every replay of a graph case equal to the same call run eagerly on the same buffers;
* ``graph vs own call``: every replay equal to the batch's own eager call (``extra["graph"]``,
  :mod:`conformance.graphs.replay`).

A cell reads ``kept k/n`` (bitwise equal in all ``n`` cases), ``broken k/n`` (``k`` cases differ; each break is
listed under the table with its case and the first differing pair), ``n/a`` (the kernel refused every case; the
first reason on hover and in the notes) or adds ``FAIL k`` when cases failed the numerical verdict or a promise.
A graph cell of cases where nothing was captured (the record's ``extra["graph"]["captured"]`` false: a CPU device,
where the replays run the graph-safe call eagerly) adds ``no graph captured`` (``k of n`` when only some), and a
note says what ran instead: no CUDA graph is claimed for them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from conformance.records import CheckResult, Status

__all__ = ["COLUMNS", "invariance_sections"]

#: The matrix's columns, in order.
COLUMNS = ("run", "batch", "neighbour", "splits", "graph = eager", "graph vs own call")


def _mode(case: dict[str, Any]) -> str:
    """``default``, ``num_splits = 1`` or, for an engine's own graph path, ``engine <name>[, num_splits = 1]``."""
    pinned = case.get("num_splits") == 1
    if case.get("engine"):
        return f"engine {case['engine']}" + (", num_splits = 1" if pinned else "")
    return "num_splits = 1" if pinned else "default"


def _uncaptured(r: CheckResult) -> bool:
    """Whether a graph record's replays ran without a captured graph (``captured`` false: a CPU device)."""
    g = r.extra.get("graph") if isinstance(r.extra, dict) else None
    return isinstance(g, dict) and g.get("captured") is False


def _entries(r: CheckResult) -> list[tuple[str, bool | None, str]]:
    """(column, kept or None when not run, evidence of a break) for one record."""
    case = r.case if isinstance(r.case, dict) else {}
    kind = case.get("invariance", "")
    graph = case.get("graph")
    if not kind and not graph:
        return []
    if r.status is Status.UNSUPPORTED or (kind and "invariance" not in r.extra) or (graph and "graph" not in r.extra):
        cols = [kind] if kind else ["graph = eager", "graph vs own call"]
        return [(c, None, r.reason) for c in cols]
    if kind:
        inv = r.extra["invariance"]
        broken = [p for p in inv.get("pairs", []) if not p.get("equal")]
        first = broken[0] if broken else None
        why = (
            f"'{first['b']}' vs '{first['a']}': {first['rows']} rows, max |diff| {first['max_abs']:.3g}"
            if first
            else ""
        )
        return [(kind, bool(inv.get("kept")), why)]
    g = r.extra["graph"]
    out: list[tuple[str, bool | None, str]] = []
    for col, keys in (("graph = eager", ("vs_eager",)), ("graph vs own call", ("vs_plain", "vs_own_call"))):
        # records written before the graph paths shared one loop (SGLang's engine) name it vs_own_call
        found = [next((p[k] for k in keys if k in p), None) for p in g.get("replays", [])]
        present = [d for d in found if d is not None]
        if not found or len(present) < len(found):
            out.append((col, None, f"no {keys[0]} comparison in the record's replays"))
            continue
        bad = [(i, d) for i, d in enumerate(present) if not d["equal"]]
        why = ", ".join(f"replay {i}: {d['rows']} rows, max |diff| {d['max_abs']:.3g}" for i, d in bad[:2])
        out.append((col, not bad, why))
    return out


def invariance_sections(results: Iterable[CheckResult], backends: list[str]) -> dict[str, Any] | None:
    """``{columns, rows: [{backend, mode, cells: [cell or None]}], notes: [text]}``, or None without such records."""
    cells: dict[tuple[str, str, str], dict[str, Any]] = defaultdict(
        lambda: {"kept": 0, "broken": 0, "na": 0, "fail": 0, "uncaptured": 0, "reason": ""}
    )
    notes: list[str] = []
    uncaptured: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))  # device -> backend -> ids
    for r in results:
        for col, kept, why in _entries(r):
            cell = cells[(r.backend, _mode(r.case), col)]
            if kept is None:
                cell["na"] += 1
                cell["reason"] = cell["reason"] or why
                continue
            cell["kept" if kept else "broken"] += 1
            if _uncaptured(r):
                cell["uncaptured"] += 1
                uncaptured[r.device or "?"][r.backend].add(r.case_id)
            if r.status.is_problem:
                cell["fail"] += 1
            if not kept:
                notes.append(f"{r.backend} ({_mode(r.case)}), {col}: `{r.case_id}`: {why}")
    if not cells:
        return None
    for device, by_backend in sorted(uncaptured.items()):
        listed = ", ".join(f"{b} {len(ids)}" for b, ids in sorted(by_backend.items()))
        notes.append(
            f"No graph captured on device `{device}` (graph cases per kernel: {listed}): each replay ran the "
            "graph-safe call eagerly on the bucket's buffers, which checks the buffer logic (padding, stale table "
            "entries, live key counts), not a CUDA graph"
        )
    rows = []
    engine_modes = sorted({m for _, m, _ in cells if m.startswith("engine ")})
    for b in backends:
        for mode in ("default", "num_splits = 1", *engine_modes):
            row = [cells.get((b, mode, c)) for c in COLUMNS]
            if any(x is not None for x in row):
                rows.append({"backend": b, "mode": mode, "cells": [_text(x) for x in row]})
    return {"columns": list(COLUMNS), "rows": rows, "notes": notes}


def _text(cell: dict[str, Any] | None) -> dict[str, Any] | None:
    if cell is None:
        return None
    ran = cell["kept"] + cell["broken"]
    if ran == 0:
        return {"status": "unsupported", "text": "n/a", "reason": cell["reason"]}
    text = f"kept {ran}/{ran}" if not cell["broken"] else f"broken {cell['broken']}/{ran}"
    if cell["uncaptured"]:
        text += ", no graph captured" if cell["uncaptured"] == ran else f", no graph captured in {cell['uncaptured']}"
    if cell["fail"]:
        text += f", FAIL {cell['fail']}"
    status = "fail" if cell["fail"] else ("pass" if not cell["broken"] else "broken")
    return {"status": status, "text": text, "reason": cell["reason"]}
