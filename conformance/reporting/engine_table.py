"""The report's engine section: one table per engine replay, its scenarios against the kernels that ran them.

A cell is the record's status (``pass`` with its error ratio, ``fail``/``error`` with the first line of the
reason, ``unsupported`` with the refused call and why), so the section answers "which modes of this engine
pass on which kernel" at a glance; records of plain cases are not shown here.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from conformance.records import CheckResult, Status

__all__ = ["engine_sections"]

_LETTER = {"pass": "p", "fail": "F", "unsupported": "u", "error": "E", "crash": "C", "timeout": "T"}


def _cell(r: CheckResult) -> dict[str, str]:
    if r.status is Status.PASS and r.stats is not None:
        text = f"pass {r.stats.error_ratio:.2f}"
    else:
        text = r.status.value
    return {"status": r.status.value, "letter": _LETTER[r.status.value], "text": text, "reason": r.reason[:160]}


def engine_sections(results: Iterable[CheckResult], backends: Sequence[str]) -> list[dict[str, Any]]:
    """``[{engine, seed, rows: [{scenario, case_id, cells: [cell per backend or None], notes}]}]``, by engine;
    ``notes`` holds ``"backend: status: reason"`` for every cell that is not a pass."""
    rows: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    seeds: dict[str, str] = {}
    for r in results:
        engine = r.case.get("engine") if isinstance(r.case, dict) else None
        if not engine:
            continue
        seeds[engine] = str((r.extra.get("engine") or {}).get("seed", ""))
        row = rows[engine].setdefault(
            r.case_id, {"scenario": r.case.get("scenario", ""), "case_id": r.case_id, "by_backend": {}}
        )
        row["by_backend"][r.backend] = _cell(r)
    out = []
    for engine in sorted(rows):
        table = sorted(rows[engine].values(), key=lambda x: (x["scenario"], x["case_id"]))
        for row in table:
            row["cells"] = [row["by_backend"].get(b) for b in backends]
            row["notes"] = [
                f"{b}: {c['status']}: {c['reason']}" for b, c in row.pop("by_backend").items() if c["status"] != "pass"
            ]
        out.append({"engine": engine, "seed": seeds.get(engine, ""), "rows": table})
    return out
