"""Reports of one or more results files: ``DIR/report.md`` and a self-contained ``DIR/report.html``.

:func:`build_context` turns records into plain data (every number already formatted where a
template would otherwise repeat the logic); the two Jinja templates in ``templates/`` lay it out.
The report opens on its verdict and keeps the environment for last (:data:`SECTIONS`, the order of the page and of
its navigation): the verdict (a headline, what ran, one line per backend: judged, passed, unexpected, known,
unsupported, or *nothing judged*: :func:`conformance.running.outcome.unjudged_backends`), the unexpected problems
grouped by cause (:func:`problem_groups`) with their repro lines, what changed against a baseline when one is
given (:mod:`conformance.reporting.compare`'s comparison and summary, :func:`baseline_context`), the details
(ledger-known failures, unexpected passes and stale ledger entries, models, invariances, variants, backward,
per-backend totals with the harness time spent outside the kernel, where the time went
(:mod:`conformance.running.profile`), the feature x backend matrix, engines, fuzz findings, the declared
capability matrix, error-ratio histograms, performance), then the runs and their environments.

Several files are merged (shards of one sweep, or runs on several machines); when two records
share (case id, backend), the one read last wins; within one file a pair recorded twice is refused unless
``drop_duplicates`` (then the last record of the pair is kept).  Records are counted by their effective status
(:attr:`conformance.records.CheckResult.effective_status`: a ``pass`` whose statistics are NaN or inf is a fail,
and the report says how many there were).  Files are read by :func:`conformance.results_file.load_results`:
a missing or unreadable file, or one without any record, is a :class:`conformance.results_file.ResultsFileError`;
lines that are not records are skipped and kept in :attr:`RunSet.files` (``attnconf report`` counts them on
stderr and exits 2 when the files hold no result at all).

Size: one report's context, a few lines per section in the order of :data:`SECTIONS` (their layout is in the
templates); the verdict and baseline sections added in issue 28 belong to the same page.
"""

from __future__ import annotations

import base64
import datetime as _dt
import json
import re
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conformance.cases.case import FEATURES, AttentionCase
from conformance.running.env import refused_features
from conformance.reporting.backward_perf import backward_perf_rows, is_backward_timing
from conformance.reporting.engine_table import engine_sections
from conformance.reporting.invariance_table import invariance_sections
from conformance.reporting.variant_table import variant_sections
from conformance.backward.table import backward_section
from conformance.reporting.model_table import model_sections
from conformance.reporting.fuzz_table import fuzz_findings
from conformance.reporting.ledger import Ledger, LedgerEntry, builtin_suite_cases
from conformance.records import CheckResult, Header, judged_results, NONFINITE_PASS, Status
from conformance.results_file import load_results, ResultsFile
from conformance.running.outcome import short_reason, unjudged_backends

__all__ = [
    "HTML_KIND",
    "MD_KIND",
    "SECTIONS",
    "RunSet",
    "baseline_context",
    "build_context",
    "load_runs",
    "problem_groups",
]

#: Output kinds of the report's Markdown and HTML (:mod:`conformance.outputs`; the PNGs are :data:`PLOT_KIND`).
MD_KIND, HTML_KIND = "report-md", "report-html"

_TEMPLATES = Path(__file__).resolve().parent / "templates"
#: The report's sections in page order, (anchor, title): both templates open with links to them.
SECTIONS = (
    ("verdict", "Verdict"),
    ("unexpected", "Unexpected problems"),
    ("baseline", "Changes against the baseline"),
    ("details", "Details"),
    ("environment", "Environment"),
)
#: Problems listed in full per cause group in the HTML report before the rest are folded.
GROUP_SHOWN = 20
STATUSES = [s.value for s in Status]
#: What a header written by another tool (or an older runner) may lack; the templates need every key.
_RUN_DEFAULTS: dict[str, Any] = {
    "device": "?",
    "seed": "?",
    "shard": None,
    "timeout_s": "?",
    "time": False,
    "tol": [],
    "resume": False,
    "already_recorded": 0,
}
_ENV_KEYS = [
    "host",
    "os",
    "python",
    "torch",
    "cuda",
    "gpu",
    "driver",
    "compute_capability",
    "cpu",
    "device",
    "git_commit",
]


@dataclass
class RunSet:
    """Headers and deduplicated results of the files read, in file order."""

    sources: list[str] = field(default_factory=list)
    headers: list[Header] = field(default_factory=list)
    results: list[CheckResult] = field(default_factory=list)
    #: each file as read, with the lines it skipped
    files: list[ResultsFile] = field(default_factory=list)
    #: records marked ``pass`` whose statistics are not finite, in :attr:`results` as fails
    nonfinite_passes: int = 0


def load_runs(paths: Iterable[Path | str], drop_duplicates: bool = False) -> RunSet:
    """Read results files; a record of a later file with the same (case id, backend) replaces an earlier one.
    :class:`conformance.results_file.ResultsFileError` for a missing or unreadable file, one without records, or one
    recording a pair twice (unless ``drop_duplicates``: the last record of it is kept)."""
    runs = RunSet()
    latest: dict[tuple[str, str], CheckResult] = {}
    for path in paths:
        read = load_results(
            path, allow_skipped=True, need_header=False, need_results=False, drop_duplicates=drop_duplicates
        )
        runs.files.append(read)
        headers, results = read.headers, read.results
        runs.sources.append(str(path))
        runs.headers.extend(headers)
        for r in results:
            latest.pop((r.case_id, r.backend), None)  # re-insert so the order follows the last write
            latest[r.case_id, r.backend] = r
    runs.results, runs.nonfinite_passes = judged_results(latest.values())
    return runs


def _median_ms(xs: Sequence[float]) -> str:
    return f"{statistics.median(xs) * 1e3:.2f}" if xs else "n/a"


def _fmt(x: float | None, spec: str = ".3g") -> str:
    return "n/a" if x is None else format(x, spec)


def _worst(r: CheckResult) -> str:
    s = r.stats
    if s is None:
        return "n/a (no output compared)"
    text = (
        f"max abs {s.max_abs:.3g} at (token, head, dim) {tuple(s.worst)}; error ratio {s.error_ratio:.3g} "
        f"(allowed {s.allowed_max_abs:.3g}, baseline {s.baseline_max_abs:.3g}); mismatch {s.mismatch_frac:.2%}"
    )
    if s.lse_max_abs is not None:
        text += f"; lse max abs {s.lse_max_abs:.3g} (allowed {_fmt(s.lse_allowed)})"
    if s.nonfinite:
        text += f"; {s.nonfinite} non-finite"
    if s.failed_checks:
        text += f"; failed: {', '.join(s.failed_checks)}"
    return text


def _case(r: CheckResult) -> AttentionCase | None:
    try:
        return AttentionCase.from_json(r.case)
    except (KeyError, TypeError, ValueError):
        return None  # a record from a newer case model this version cannot rebuild


def _failure(r: CheckResult, entry: LedgerEntry | None = None) -> dict[str, Any]:
    case = _case(r)
    row: dict[str, Any] = {
        "backend": r.backend,
        "case_id": r.case_id,
        "status": r.status.value,
        "summary": case.summary() if case else "(case not readable)",
        "worst": _worst(r),
        "reason": r.reason.strip() or "(no reason recorded)",
        "repro": r.repro,
        "version": r.version,
    }
    if entry is not None:
        row.update(ledger_reason=entry.reason, evidence=list(entry.evidence), pattern=entry.pattern)
    return row


#: A number in a reason (not one inside a name such as ``bf16`` or ``fp8``): a cause is its reason without them.
_NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def _cause(r: CheckResult) -> str:
    """What a problem's cause group is named by: a fail's failed checks, else the first line of its reason with its
    numbers written ``N`` (``worker killed by SIGSEGV (exit status N)``)."""
    if r.status is Status.FAIL and r.stats is not None and r.stats.failed_checks:
        return "failed " + ", ".join(r.stats.failed_checks)
    return _NUMBER.sub("N", short_reason(r.reason, 200)) or "(no reason recorded)"


def problem_groups(unexpected: Sequence[CheckResult]) -> list[dict[str, Any]]:
    """The unexpected problems grouped by (backend, status, cause: :func:`_cause`), most problems first:
    ``{backend, status, cause, count, problems: [rows as the report lists them]}``."""
    groups: dict[tuple[str, str, str], list[CheckResult]] = {}
    for r in unexpected:
        groups.setdefault((r.backend, r.status.value, _cause(r)), []).append(r)
    ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    return [
        {"backend": b, "status": st, "cause": cause, "count": len(rs), "problems": [_failure(r) for r in rs]}
        for (b, st, cause), rs in ordered
    ]


def _selected(runs: RunSet) -> dict[str, str]:
    """The backends the files' runs selected (by the name their records carry) and those with records, each with
    why it was not available (``''`` when it was, on any run): what :func:`unjudged_backends` reads."""
    selected: dict[str, str] = {}
    for h in runs.headers:
        for key, info in h.backends.items():
            name = info.get("name") or key
            why = info.get("unavailable_reason", "not available") if info.get("available") == "no" else ""
            selected[name] = why if selected.get(name, why) else ""
    for r in runs.results:
        selected.setdefault(r.backend, "")
    return dict(sorted(selected.items()))


def _verdict(runs: RunSet, totals: list[dict[str, Any]], verdict: Any, infos: dict) -> dict[str, Any]:
    """The report's opening: a headline, what ran, one line per backend (its counts, or why it judged nothing)."""
    unexpected = Counter(r.backend for r in verdict.unexpected)
    known = Counter(r.backend for r, _ in verdict.known)
    by_name = {t["backend"]: t for t in totals}
    nothing = {name: why for name, why, _ in unjudged_backends(runs.results, _selected(runs))}
    lines = []
    for name in _selected(runs):
        t = by_name.get(name)
        counts = t["counts"] if t else {s: 0 for s in STATUSES}
        total = t["total"] if t else 0
        lines.append(
            {
                "backend": name,
                "version": t["version"] if t else infos.get(name, {}).get("version", "?"),
                "total": total,
                "judged": total - counts["unsupported"],
                "passed": counts["pass"],
                "unexpected": unexpected.get(name, 0),
                "known": known.get(name, 0),
                "unsupported": counts["unsupported"],
                "nothing_judged": nothing.get(name),
            }
        )
    n_unexp = len(verdict.unexpected)
    tail = f"{len(verdict.known)} known"
    if verdict.unexpected_passes:
        tail += f", {len(verdict.unexpected_passes)} unexpected pass(es)"
    if n_unexp:
        who = sorted(unexpected)
        headline = f"{n_unexp} unexpected problem(s) in {', '.join(who)} ({tail})"
    else:
        headline = f"No unexpected problem ({tail})"
    if nothing:
        headline += f"; {len(nothing)} backend(s) judged nothing: {', '.join(nothing)}"
    devices = sorted({str(h.run_options.get("device") or h.env.get("device") or "?") for h in runs.headers})
    ran = f"{len(runs.results)} (case, backend) pairs of {len({r.case_id for r in runs.results})} cases"
    if devices:
        ran += f" on device {', '.join(devices)}"
    if devices and all(d == "cpu" for d in devices):
        ran += " (CPU backends only: no GPU kernel ran, and no CUDA graph was captured)"
    return {"headline": headline, "bad": bool(n_unexp or nothing), "ran": ran, "lines": lines}


def _backend_infos(runs: RunSet) -> dict[str, dict[str, str]]:
    infos: dict[str, dict[str, str]] = {}
    for h in runs.headers:
        for name, info in h.backends.items():
            infos[name] = {**infos.get(name, {}), **info}
    return infos


def _capabilities(backends: list[str], infos: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    """backend -> refused feature -> reason, from the headers, else from the adapters' declarations."""
    caps: dict[str, dict[str, str]] = {}
    for b in backends:
        info = infos.get(b, {})
        if any(k.startswith("refuses.") for k in info) or "capabilities_error" in info or "devices" in info:
            caps[b] = refused_features(info)
            continue
        try:
            from attnfast.registry import get_backend

            caps[b] = {f: s.reason for f, s in get_backend(b).capabilities().items() if not s.ok}
        except Exception:  # noqa: BLE001, S112 - an old header for a backend not installed here: leave it out
            continue
    return caps


def _b64(png: bytes | None) -> str | None:
    return base64.b64encode(png).decode("ascii") if png else None


def _merge_shards(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry for the shards of one sweep (same suite, environment, backends and options)."""
    merged: dict[str, dict[str, Any]] = {}
    for run in runs:
        shard = run["run"].get("shard")
        argv = re.sub(r" --(shard|out|report) \S+", "", run["argv"])
        options = {k: v for k, v in run["run"].items() if k not in ("shard", "cases")}
        key = json.dumps([run["suite"], run["env"], run["backends"], options, argv], sort_keys=True, default=str)
        if key not in merged:
            merged[key] = {**run, "shards": []}
        entry = merged[key]
        entry["started"] = min(entry["started"] or "", run["started"] or "") or entry["started"]
        if shard:
            entry["shards"].append(tuple(shard))
    out = []
    for entry in merged.values():
        shards = sorted(entry["shards"])
        entry["shards"] = ""
        if len(shards) > 1:
            entry["run"] = {**entry["run"], "shard": None}
            entry["shards"] = f"{len(shards)} of {shards[0][1]} ({', '.join(str(i) for i, _ in shards)})"
            entry["argv"] = (
                re.sub(r" --(shard|out|report) \S+", "", entry["argv"]) + "  (per shard: --shard I/N --out FILE)"
            )
        out.append(entry)
    return out


def build_context(runs: RunSet, ledger: Ledger, plots: bool = True) -> dict[str, Any]:
    """Everything the templates show, as plain data (see the module docstring for the sections)."""
    from . import plots as plotting

    results = runs.results
    backends = sorted({r.backend for r in results})
    infos = _backend_infos(runs)
    by_backend: dict[str, list[CheckResult]] = defaultdict(list)
    for r in results:
        by_backend[r.backend].append(r)
    totals = []
    for b in backends:
        rs = by_backend[b]
        ran = [r for r in rs if r.status not in (Status.CRASH, Status.TIMEOUT, Status.UNSUPPORTED)]
        counts = Counter(r.status.value for r in rs)
        totals.append(
            {
                "backend": b,
                "version": infos.get(b, {}).get("version", rs[0].version),
                "total": len(rs),
                "counts": {s: counts.get(s, 0) for s in STATUSES},
                "problems": sum(r.status.is_problem for r in rs),
                "harness_ms": _median_ms([r.harness_s for r in ran]),
                "kernel_ms": _median_ms([r.kernel_s for r in ran]),
                "roundtrip_ms": _median_ms([r.extra["roundtrip_s"] for r in ran if "roundtrip_s" in r.extra]),
            }
        )
    cells: dict[str, dict[str, Counter]] = defaultdict(lambda: defaultdict(Counter))
    for r in results:
        case = _case(r)
        for f in case.features() if case else ():
            cells[f][r.backend][r.status.value] += 1
    matrix = [
        {"feature": f, "cells": [{s: cells[f][b].get(s, 0) for s in STATUSES} for b in backends]}
        for f in FEATURES
        if f in cells
    ]
    verdict = ledger.classify(results, suite_case_ids=builtin_suite_cases)
    caps = _capabilities(backends, infos)
    cap_backends = [b for b in backends if b in caps]
    capability = [
        {"feature": f, "description": FEATURES[f], "cells": [caps[b].get(f) for b in cap_backends]} for f in FEATURES
    ]
    ratios = {b: [r.stats.error_ratio for r in by_backend[b] if r.stats is not None] for b in backends}
    timed = sorted(
        ((r, r.timing) for r in results if r.timing is not None and not is_backward_timing(r)),
        key=lambda rt: (rt[0].case_id, rt[0].backend),
    )
    perf = [
        {
            "backend": r.backend,
            "case_id": r.case_id,
            "median_ms": _fmt(t.median_ms, ".4g"),
            "p20_ms": _fmt(t.p20_ms, ".4g"),
            "p80_ms": _fmt(t.p80_ms, ".4g"),
            "tflops": _fmt(t.tflops, ".1f"),
            "gbps": _fmt(t.gbps, ".0f"),
            "roofline": _fmt(t.roofline_pct, ".0f"),
            "bound": t.bound or "",
            "method": t.method,
            "status": r.status.value,
        }
        for r, t in timed
    ]
    ratio_png = plotting.error_ratio_histograms(ratios) if plots else None
    tput = {b: [(r.case_id, t.tflops) for r, t in timed if r.backend == b] for b in backends}
    tput_png = plotting.throughput_plot(tput) if plots and perf else None
    runs_ctx = _merge_shards(
        [
            {
                "suite": h.suite,
                "started": h.started,
                "argv": " ".join(h.argv),
                "run": {**_RUN_DEFAULTS, **h.env.get("run", {})},
                "env": {k: h.env[k] for k in _ENV_KEYS if k in h.env},
                "backends": {
                    n: f"{i.get('version', '?')} ({i.get('family', '?')}, available: {i.get('available', '?')})"
                    for n, i in h.backends.items()
                },
            }
            for h in runs.headers
        ]
    )
    return {
        "sections": SECTIONS,
        "group_shown": GROUP_SHOWN,
        "verdict": _verdict(runs, totals, verdict, infos),
        "problem_groups": problem_groups(verdict.unexpected),
        "baseline": None,
        "generated": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "sources": runs.sources,
        "runs": runs_ctx,
        "statuses": STATUSES,
        "backends": backends,
        "totals": totals,
        "n_results": len(results),
        "nonfinite_passes": runs.nonfinite_passes,
        "nonfinite_pass_text": NONFINITE_PASS,
        "n_cases": len({r.case_id for r in results}),
        "matrix": matrix,
        "unexpected": [_failure(r) for r in verdict.unexpected],
        "known": [_failure(r, e) for r, e in verdict.known],
        "unexpected_passes": [
            {
                "backend": r.backend,
                "case_id": r.case_id,
                "pattern": e.pattern,
                "reason": e.reason,
                "source": e.source,
            }
            for r, e in verdict.unexpected_passes
        ],
        "fixed": [
            {
                "backend": r.backend,
                "case_id": r.case_id,
                "version": r.version,
                "pattern": e.pattern,
                "reason": e.reason,
                "source": e.source,
            }
            for r, e in verdict.fixed
        ],
        "stale": [
            {"backend": e.backend, "pattern": e.pattern, "reason": e.reason, "source": e.source} for e in verdict.stale
        ],
        "engines": engine_sections(results, backends),
        "models": model_sections(results, backends, [(r.case_id, r.backend) for r, _ in verdict.known]),
        "invariance": invariance_sections(results, list(backends)),
        "variants": variant_sections(results, list(backends)),
        "backward": backward_section(results, list(backends)),
        "fuzz": fuzz_findings(runs.sources),
        "cap_backends": cap_backends,
        "capability": capability,
        "ratio_png": _b64(ratio_png),
        "tput_png": _b64(tput_png),
        "perf": perf,
        "backward_perf": backward_perf_rows(results),
        "time_profile": _time_profile(runs.sources),
        "_pngs": {"error_ratio.png": ratio_png, "throughput.png": tput_png},
    }


def baseline_context(cmp: Any) -> dict[str, Any]:
    """The report's "changes against the baseline" section of a comparison
    (:class:`conformance.reporting.compare.Comparison`, as ``attnconf compare`` makes it): its verdict and
    ``attnconf compare``'s own summary (:func:`conformance.reporting.compare_markdown.render_markdown`), its
    headings two levels down to sit under the section's."""
    from conformance.reporting.compare_markdown import render_markdown

    text = render_markdown(cmp)
    shifted = "\n".join("##" + line if line.startswith("#") else line for line in text.splitlines())
    return {
        "old": cmp.old_source,
        "new": cmp.new_source,
        "verdict": cmp.verdict,
        "bad": cmp.exit_status != 0,
        "not_compared": len(cmp.not_in_new),
        "markdown": shifted,
    }


def _time_profile(sources: Sequence[str]) -> str:
    """The "where the time went" table of the files' runs (:mod:`conformance.running.profile`); empty when no record
    carries a time split (files written before it existed)."""
    from conformance.running.profile import file_profiles, render_profiles

    profiles = []
    for source in sources:
        try:
            profiles.extend(file_profiles(source))
        except (OSError, EOFError, ValueError):  # unreadable here: load_runs already said what it could read
            continue
    if not any(p.unsplit < p.pairs for p in profiles):
        return ""
    return render_profiles(profiles)
