"""The machine-readable summary of ``attnconf report --json`` (:func:`report_json`).

Keys (schema 1): ``exit_status`` (0; a refused report writes ``{"exit_status": 2, "refusal": {"file",
"reason"}}``), ``files`` (per file read: path, headers, results, the lines skipped with their numbers,
``duplicates_dropped`` (``--drop-duplicates``), ``schema``: the newest its records state),
``skipped_lines`` (total), ``results`` and ``cases``, ``backends`` (per backend: version, total, counts per
status, problems), ``ledger`` (counts of known and unexpected failures, unexpected passes, stale entries),
``unexpected`` (one object per unexpected failure: backend, case id, status, one-line reason, repro),
``known`` (per ledger entry: backend, pattern, reason, how many failures it explains, their case ids),
``unexpected_passes``, ``stale``, ``nonfinite_passes`` (records marked pass whose statistics are NaN or inf,
counted as fails), ``out`` (the Markdown and HTML files).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conformance.reporting.report import RunSet

__all__ = ["SCHEMA", "report_json"]

SCHEMA = 1


def _line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def report_json(runs: RunSet, ctx: dict[str, Any], md: Path, html: Path) -> dict[str, Any]:
    """The summary of a written report (module docstring); ``ctx`` is :func:`report.build_context`'s."""
    known: dict[tuple[str, str, str], list[str]] = {}
    for row in ctx["known"]:
        known.setdefault((row["backend"], row.get("pattern", ""), row.get("ledger_reason", "")), []).append(
            row["case_id"]
        )
    files: list[dict[str, Any]] = [
        {
            "path": str(f.path),
            "headers": len(f.headers),
            "results": len(f.results),
            "skipped_lines": [{"line": s.line, "reason": s.reason} for s in f.skipped],
            "duplicates_dropped": f.dropped_duplicates,
            "schema": f.schema,
        }
        for f in runs.files
    ]
    return {
        "schema": SCHEMA,
        "exit_status": 0,
        "refusal": None,
        "files": files,
        "skipped_lines": sum(len(f["skipped_lines"]) for f in files),
        "results": ctx["n_results"],
        "cases": ctx["n_cases"],
        "backends": {
            t["backend"]: {k: t[k] for k in ("version", "total", "counts", "problems")} for t in ctx["totals"]
        },
        "ledger": {
            "known": len(ctx["known"]),
            "unexpected": len(ctx["unexpected"]),
            "unexpected_passes": len(ctx["unexpected_passes"]),
            "stale": len(ctx["stale"]),
        },
        "unexpected": [
            {
                k: (_line(row[k]) if k == "reason" else row[k])
                for k in ("backend", "case_id", "status", "reason", "repro")
            }
            for row in ctx["unexpected"]
        ],
        "known": [
            {"backend": b, "pattern": pattern, "reason": _line(reason), "count": len(ids), "case_ids": ids}
            for (b, pattern, reason), ids in sorted(known.items())
        ],
        "unexpected_passes": [
            {k: row[k] for k in ("backend", "case_id", "pattern", "reason")} for row in ctx["unexpected_passes"]
        ],
        "stale": [{k: row[k] for k in ("backend", "pattern", "reason")} for row in ctx["stale"]],
        "nonfinite_passes": runs.nonfinite_passes,
        "out": {"markdown": str(md), "html": str(html)},
    }
