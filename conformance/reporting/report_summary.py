"""The machine-readable summary of ``attnconf report --json`` (:func:`report_json`): the verdict a script acts on,
then what the report lists.

``schema`` (2) rises whenever keys are added; a key once there keeps its name and meaning, so a reader of schema
N reads any later summary by the keys it knows (schema 2 added ``verdict`` and ``baseline``).

Keys: ``exit_status`` (the report command's own: 0 written; a refused report writes ``{"exit_status": 2,
"refusal": {"file", "reason"}, "verdict": null}``), ``verdict`` (:func:`verdict_json`: the exit status the
results imply for a gate, with its reasons, one line per backend and the unexpected problems grouped by cause),
``baseline`` (with ``--baseline``: ``attnconf compare OLD NEW --json``'s summary of the comparison, as
:mod:`conformance.reporting.compare_summary` writes it; null without), ``files`` (per file read: path,
headers, results, the lines skipped with their numbers, ``duplicates_dropped`` (``--drop-duplicates``),
``schema``: the newest its records state),
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

from conformance.exits import Exit
from conformance.reporting.report import RunSet

__all__ = ["SCHEMA", "gate_status", "report_json", "verdict_json"]

SCHEMA = 2
#: The order in which a gate's statuses win when several apply: findings first (1), then an input a strict
#: command refuses (2), then nothing judged (4).
_PRECEDENCE = (Exit.PROBLEMS, Exit.USAGE, Exit.NO_EVIDENCE)


def _line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def gate_status(*statuses: int | None) -> int:
    """The one status of several (None: not there): the first of 1, 2, 4 that is among them, else the highest (0
    when every one is 0 or there is none)."""
    present = {int(s) for s in statuses if s is not None}
    for status in _PRECEDENCE:
        if status in present:
            return int(status)
    return max(present, default=0)


def _baseline_status(cmp: Any) -> tuple[int, list[str]]:
    """What ``attnconf compare OLD NEW`` (no ``--allow-*`` flag) would exit on the report's comparison, and why:
    2 when NEW lacks pairs of OLD or a file has lines that are not records (compare refuses those), else the
    comparison's own status (1 regressed, 4 a family judged nothing)."""
    if cmp.not_in_new or cmp.old_skipped or cmp.new_skipped:
        why = []
        if cmp.not_in_new:
            why.append(f"{cmp.new_source} lacks {len(cmp.not_in_new)} (case, family) pair(s) of {cmp.old_source}")
        for side, skipped in (("old", cmp.old_skipped), ("new", cmp.new_skipped)):
            if skipped:
                why.append(f"the {side} file has {len(skipped)} line(s) that are not records")
        return Exit.USAGE, [f"baseline: not a whole comparison (attnconf compare refuses it): {'; '.join(why)}"]
    status = cmp.exit_status
    if status == Exit.PROBLEMS:
        counts = [
            f"{len(items)} {name}"
            for name, items in (
                ("new failure(s)", cmp.new_failures),
                ("error-ratio regression(s)", cmp.ratio_regressions),
                ("gradient regression(s)", cmp.grad_regressions),
                ("gradient number(s) missing", cmp.grad_missing),
                ("performance regression(s)", cmp.perf_regressions),
                ("capability(ies) lost", cmp.capability_lost),
            )
            if items
        ]
        return status, [f"baseline: regressed against {cmp.old_source}: {', '.join(counts)}"]
    if status == Exit.NO_EVIDENCE:
        return status, [f"baseline: nothing judged: family {fam} {why}" for fam, why in cmp.unjudged]
    return status, []


def verdict_json(ctx: dict[str, Any], comparison: Any = None) -> dict[str, Any]:
    """The verdict of a report's context (:func:`report.build_context`) and its baseline ``comparison``
    (:class:`~conformance.reporting.compare.Comparison`, or None):

    ``exit_status`` what the results imply for a gate, :func:`gate_status` of ``results_exit_status`` (what
    ``attnconf run`` without ``--strict`` exits on them: 1 an unexpected problem, 4 a selected backend judged
    nothing, else 0) and ``baseline_exit_status`` (null without a baseline; else what ``attnconf compare OLD
    NEW`` exits: :func:`_baseline_status`); ``reasons`` (one line per cause of a status other than 0, empty on 0);
    ``headline`` and ``ran`` (the report's first lines); ``backends`` (per selected backend: version, total,
    judged, passed, unexpected, known, unsupported, and ``nothing_judged``: null, or why it judged nothing);
    ``problem_groups`` (the unexpected problems by backend, status and cause, most first: each with its count
    and its problems' case id, status, one-line reason, worst error and repro)."""
    verdict = ctx["verdict"]
    lines = verdict["lines"]
    reasons = []
    unexpected = sum(b["unexpected"] for b in lines)
    if unexpected:
        who = sorted({b["backend"] for b in lines if b["unexpected"]})
        reasons.append(f"{unexpected} unexpected problem(s) in {', '.join(who)}")
    nothing = [b for b in lines if b["nothing_judged"] is not None]
    reasons += [f"backend {b['backend']} judged nothing: {b['nothing_judged']}" for b in nothing]
    results_status = Exit.PROBLEMS if unexpected else Exit.NO_EVIDENCE if nothing else Exit.OK
    baseline_status = None
    if comparison is not None:
        baseline_status, why = _baseline_status(comparison)
        reasons += why
    keys = ("backend", "version", "total", "judged", "passed", "unexpected", "known", "unsupported", "nothing_judged")
    return {
        "exit_status": gate_status(results_status, baseline_status),
        "results_exit_status": int(results_status),
        "baseline_exit_status": None if baseline_status is None else int(baseline_status),
        "reasons": reasons,
        "headline": verdict["headline"],
        "ran": verdict["ran"],
        "backends": [{k: b[k] for k in keys} for b in lines],
        "problem_groups": [
            {
                "backend": g["backend"],
                "status": g["status"],
                "cause": g["cause"],
                "count": g["count"],
                "problems": [
                    {
                        "case_id": p["case_id"],
                        "status": p["status"],
                        "reason": _line(p["reason"]),
                        "worst": p["worst"],
                        "repro": p["repro"],
                    }
                    for p in g["problems"]
                ],
            }
            for g in ctx["problem_groups"]
        ],
    }


def report_json(runs: RunSet, ctx: dict[str, Any], md: Path, html: Path, comparison: Any = None) -> dict[str, Any]:
    """The summary of a written report (module docstring); ``ctx`` is :func:`report.build_context`'s,
    ``comparison`` the baseline's :class:`~conformance.reporting.compare.Comparison` (None without one)."""
    from conformance.reporting.compare_summary import to_json

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
        "verdict": verdict_json(ctx, comparison),
        "baseline": None if comparison is None else to_json(comparison),
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
