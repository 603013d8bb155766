"""The report's models section: one row per registry model (and layer kind), one column per kernel.

The table a user reads first: "is *my model's* attention right on this kernel?".  Cases belong to a model
through :func:`conformance.models.case_model` (the ``models`` suite records ``<model>@<layer>.tp<k>.<batch>``
in ``batch_name``); records of other cases are not shown here.  A cell sums that model's cases on that kernel:

* ``pass`` when every case ran and passed (with the count), ``FAIL k/n`` when any failed, errored, crashed or
  timed out (the first such case and its reason are listed under the table; ``(known)`` when the ledger explains
  every one of them);
* ``unsupported`` when the kernel refused every case, with the first refusal's reason (a kernel that runs some
  cases and refuses others shows ``pass 5/7, 2 unsupported``).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from conformance.cases.case import AttentionCase
from conformance.records import CheckResult, Status

__all__ = ["model_sections"]


def _ref(r: CheckResult):
    from conformance.suites.models import case_model

    if not isinstance(r.case, dict) or "@" not in str(r.case.get("batch_name", "")):
        return None
    try:
        return case_model(AttentionCase.from_json(r.case))
    except (TypeError, ValueError, KeyError):
        return None


def _cell(rs: list[CheckResult], known: frozenset[tuple[str, str]] = frozenset()) -> dict[str, Any]:
    counts = Counter(r.status for r in rs)
    n = len(rs)
    bad = [r for r in rs if r.status.is_problem]
    refused = [r for r in rs if r.status is Status.UNSUPPORTED]
    ran = n - len(refused)
    if bad:
        status, text = "fail", f"FAIL {len(bad)}/{ran}"
        if all((r.case_id, r.backend) in known for r in bad):
            text += " (known)"
    elif ran == 0:
        status, text = "unsupported", "unsupported"
    else:
        status, text = "pass", f"pass {counts[Status.PASS]}/{ran}"
    if refused and ran:
        text += f", {len(refused)} unsupported"
    first = bad[0] if bad else refused[0] if refused else None
    return {
        "status": status,
        "text": text,
        "reason": (first.reason.splitlines() or [""])[0][:200] if first else "",
        "case_id": first.case_id if first else "",
    }


def model_sections(
    results: Iterable[CheckResult], backends: Sequence[str], known: Iterable[tuple[str, str]] = ()
) -> list[dict[str, Any]]:
    """``[{model, layer, tp, cases, cells: [cell per backend or None], notes: [text]}]`` sorted by model, layer;
    TP shards of one model and layer kind are summed into one row (``tp`` lists them).  ``known``: the (case id,
    backend) pairs whose problem a ledger entry explains (a cell whose failures are all known says so)."""
    known = frozenset(known)
    groups: dict[tuple[str, str], dict[str, list[CheckResult]]] = defaultdict(lambda: defaultdict(list))
    tps: dict[tuple[str, str], set[int]] = defaultdict(set)
    cases: dict[tuple[str, str], set[str]] = defaultdict(set)
    for r in results:
        ref = _ref(r)
        if ref is None:
            continue
        key = (ref.model, ref.layer)
        groups[key][r.backend].append(r)
        tps[key].add(ref.tp)
        cases[key].add(r.case_id)
    rows = []
    for key in sorted(groups):
        cells = [(_cell(groups[key][b], known) if groups[key].get(b) else None) for b in backends]
        notes = [
            f"{b}: {c['status']}: `{c['case_id']}`: {c['reason']}"
            for b, c in zip(backends, cells)
            if c is not None and c["status"] != "pass" and c["reason"]
        ]
        rows.append(
            {
                "model": key[0],
                "layer": key[1],
                "tp": ", ".join(f"tp{t}" for t in sorted(tps[key])),
                "cases": len(cases[key]),
                "cells": cells,
                "notes": notes,
            }
        )
    return rows
