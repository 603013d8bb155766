"""The report's "Fuzz findings" section: the failures of ``attnconf fuzz`` files, grouped by the axis values their
minimal cases share (:mod:`conformance.fuzz.group`).

Per backend: the drawn cases that ran, their failures, and the draws skipped before running (rejected by the
case model, or refused by every backend's declarations).  Per group: the label (``layout=NHD x dims=80/80``),
how many failures it holds and of which kind, its simplest minimal case (id, shapes, the shrink path from its
original, the one-line repro command) and the originals it came from.

The section reads the files itself rather than the report's deduplicated results: two failures that shrink to
the same minimal case are two members of their group, though the report's other sections show that case once.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from conformance.cases.case import AttentionCase
from conformance.fuzz.group import fuzz_role, group_failures
from conformance.records import CheckResult
from conformance.results_file import read_records

__all__ = ["fuzz_findings"]

#: Originals listed per group (the rest are counted).
_MAX_ORIGINALS = 8


def _summary(r: CheckResult) -> str:
    try:
        return AttentionCase.from_json(r.case).summary()
    except (KeyError, TypeError, ValueError):
        return "(case not readable by this version)"


def _first_check(reason: str) -> str:
    """The first line of a reason, and of a failure text its first sub-check (the others follow ``" | "``)."""
    lines = reason.strip().splitlines()
    return lines[0].split(" | ")[0] if lines else ""


def fuzz_findings(sources: Iterable[str | Path]) -> dict[str, Any] | None:
    """``{"backends": [...], "groups": [...]}`` over the fuzz records of ``sources``; None when none has any."""
    records: list[CheckResult] = []
    for src in sources:
        path = Path(src)
        if path.is_file():
            records.extend(r.judged() for r in read_records(path)[1] if fuzz_role(r))
    if not records:
        return None
    originals = [r for r in records if fuzz_role(r).get("role") == "original"]
    per_backend: dict[str, dict[str, Any]] = defaultdict(lambda: {"cases": 0, "statuses": Counter(), "skipped": 0})
    for r in originals:
        row = per_backend[r.backend]
        row["cases"] += 1
        row["statuses"][r.status.value] += 1
        row["skipped"] += sum(int(v) for v in fuzz_role(r).get("skipped", {}).values())  # draws before this one
    originals_by_id = {(r.backend, r.case_id): r for r in originals}
    groups = []
    for g in group_failures(r for r in records if fuzz_role(r).get("role") in ("minimal", "replay")):
        rep = g.representative
        info = fuzz_role(rep)
        origin_ids = [str(fuzz_role(m).get("original_id", m.case_id)) for m in g.members]
        statuses = Counter(
            originals_by_id[(g.backend, o)].status.value if (g.backend, o) in originals_by_id else "replay"
            for o in origin_ids
        )
        groups.append(
            {
                "backend": g.backend,
                "label": g.label,
                "kind": g.kind,
                "count": g.count,
                "statuses": ", ".join(f"{s} {n}" for s, n in statuses.most_common()),
                "minimal_id": rep.case_id,
                "minimal_summary": _summary(rep),
                "original_id": str(info.get("original_id", rep.case_id)),
                "path": list(info.get("path", [])),
                "complete": bool(info.get("complete", True)),
                "tried": int(info.get("tried", 0)),
                "reason": _first_check(rep.reason),
                "repro": rep.repro,
                "originals": origin_ids[:_MAX_ORIGINALS],
                "more_originals": max(0, len(origin_ids) - _MAX_ORIGINALS),
            }
        )
    backends = [
        {
            "backend": b,
            "cases": row["cases"],
            "failures": sum(n for s, n in row["statuses"].items() if s in ("fail", "error", "crash", "timeout")),
            "statuses": ", ".join(f"{s} {n}" for s, n in sorted(row["statuses"].items())),
            "skipped": row["skipped"],
            "groups": sum(1 for g in groups if g["backend"] == b),
        }
        for b, row in sorted(per_backend.items())
    ]
    return {"backends": backends, "groups": groups}
