"""Where a sweep's time went: per-record timings (``extra["t"]``) and the table built from them.

**Per record** (written by :mod:`conformance.running.runner`, read back by ``attnconf report``): a result's
``extra["t"]`` holds seconds, rounded to 10 us, under short keys; a key is left out when its value is 0::

    in    inputs of the case            (the first backend of a case in a worker: its context)
    ref   fp32 reference                (idem)
    base  same-precision baseline       (idem)
    prep  support check, input copies, the adapter's prepare
    comp  the kernel call, when it is the first of its compile key in that worker process (a JIT compile,
          or a load from FA4's disk cache)
    kern  the kernel call otherwise
    ver   the verdict (comparison against the reference)
    bench --time's timing loop
    enc   the record's JSON encoding in the worker
    idle  how long the worker waited for this request after its previous reply
    par   the parent's work for it: turning the reply into a record (in the worker's thread of the parent)
          plus an equal share of the parent's writer work (JSON, write, fsync, progress bar) for the batch of
          records it wrote before this one
    at    when the record was written, in seconds since the run started

``extra["worker_s"]`` (the worker's own time for the request) and ``extra["roundtrip_s"]`` (the parent's wait
for the reply) stay where they were; ``ipc`` is their difference (pipes, JSON, thread hand-offs), ``other`` is
``worker_s`` minus the phases (request parsing, bookkeeping).  A ``crash`` or ``timeout`` record has no worker
time: its round trip counts as ``lost``.  Records of older runs have no ``t`` and are counted apart.

**The table** (:class:`Profile`): the columns summed per backend, the run's wall time, workers and busy time
(``wall x workers - busy`` is idle capacity: start-up, the compile phase's tail, the sweep's tail), when
50/90/99% of the pairs had been written, and the slowest cases.  :func:`profile_records` builds it from records;
:func:`file_profiles` from a results file (one per run: a resumed file holds several).
"""

from __future__ import annotations

import gzip
import json
import math
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conformance.records import CheckResult, Header, Status

__all__ = [
    "COLUMNS",
    "PHASE_KEYS",
    "Profile",
    "RunClock",
    "file_profiles",
    "profile_records",
    "record_times",
    "render_profiles",
]

#: the worker's reply phase -> the record's ``extra["t"]`` key
PHASE_KEYS = {
    "inputs_s": "in",
    "reference_s": "ref",
    "baseline_s": "base",
    "prepare_s": "prep",
    "compile_s": "comp",
    "kernel_s": "kern",
    "verdict_s": "ver",
    "bench_s": "bench",
    "encode_s": "enc",
}
_WORKER = ("inputs", "reference", "baseline", "prepare", "compile", "kernel", "verdict", "bench", "encode", "other")
#: the table's time columns, in order: the worker's phases (they add up to ``busy``), then the rest
COLUMNS = (*_WORKER, "busy", "ipc", "idle", "parent", "lost")
_SHORT = dict(zip(PHASE_KEYS.values(), _WORKER))
SLOWEST = 10
PROFILE_SCHEMA = 1


def _r(x: float) -> float:
    return round(x, 5)


def record_times(data: Mapping[str, Any], judge_s: float) -> dict[str, float]:
    """``extra["t"]`` of a record from its worker reply ``data`` (its ``phases``, ``idle_s``) and the parent's
    time turning the reply into the record; ``par`` grows and ``at`` is set when the record is written."""
    t = {PHASE_KEYS[k]: _r(v) for k, v in data.get("phases", {}).items() if k in PHASE_KEYS}
    t = {k: v for k, v in t.items() if v > 0}  # what rounds to 0 is left out
    if data.get("idle_s", 0) > 0:
        t["idle"] = _r(data["idle_s"])
    t["par"] = _r(judge_s)
    return t


class RunClock:
    """The runner's side of the accounting: stamps each record's ``extra["t"]`` (:meth:`judged` in the worker's
    thread of the parent, :meth:`written` in the writer just before the line is written) and adds up the
    parent's writer time per batch (:meth:`batch`)."""

    def __init__(self, t_start: float) -> None:
        self.t_start = t_start
        #: the writer's seconds per record of the last batch, charged to the records of the next one
        self.carry = 0.0
        self.main_s = 0.0
        self.judge_s = 0.0
        self.batches = 0

    @staticmethod
    def judged(extra: dict[str, Any], reply: Any, judge_s: float) -> None:
        """Put the reply's timings into a record's ``extra`` (its ``t``; ``roundtrip_s``, ``worker_s`` where the
        record has none, as a harness error's or a crash's)."""
        extra.setdefault("roundtrip_s", reply.wall_s)
        if reply.kind == "ok":
            if "worker_s" in reply.data:
                extra.setdefault("worker_s", reply.data["worker_s"])
            extra["t"] = record_times(reply.data, judge_s)
        else:
            extra["t"] = {"par": _r(judge_s)}

    def written(self, extra: dict[str, Any]) -> None:
        t = extra.get("t")
        if isinstance(t, dict):
            self.judge_s += t.get("par", 0.0)
            t["par"] = _r(t.get("par", 0.0) + self.carry)
            t["at"] = _r(time.perf_counter() - self.t_start)

    def batch(self, seconds: float, wrote: int) -> None:
        self.main_s += seconds
        self.batches += 1
        if wrote:
            self.carry = seconds / wrote

    def live(
        self,
        starts: Sequence[float],
        *,
        waits: Sequence[Sequence[float]] = (),
        from_spare: int = 0,
        spares: Mapping[str, int] | None = None,
    ) -> dict[str, Any]:
        """What only the live run knows, for :attr:`Profile.live`: ``starts`` each worker start's seconds (spawn
        to ready and loaded, a spare's included); ``waits`` per slot, the seconds it waited for each of its
        workers (its first, then its restarts); ``from_spare`` restarts that took a spare; ``spares`` their counts
        (:meth:`conformance.running.spares.Spares.stats`)."""
        out: dict[str, Any] = {
            "parent_main_s": _r(self.main_s),
            "parent_judge_s": _r(self.judge_s),
            "batches": self.batches,
            "worker_starts_s": [_r(s) for s in starts],
        }
        if waits:
            out["restarts"] = sum(max(0, len(w) - 1) for w in waits)
            out["restarts_from_spare"] = from_spare
            out["worker_wait_s"] = _r(sum(sum(w) for w in waits))
            out["restart_wait_s"] = _r(sum(sum(w[1:]) for w in waits))
        if spares is not None:
            out["spares"] = dict(spares)
        return out


@dataclass
class Profile:
    """The time of one run (or of several records, merged), by backend; see the module docstring."""

    #: backend -> column -> seconds, and ``pairs``
    backends: dict[str, dict[str, float]] = field(default_factory=dict)
    #: records without ``extra["t"]`` (written before attnconf recorded the split)
    unsplit: int = 0
    #: the run's wall time (a file: the last record's ``at``), its workers
    wall_s: float | None = None
    workers: int | None = None
    #: seconds since the start when the checks began (after start-up, describe, the compile phase)
    checks_at_s: float | None = None
    #: seconds since the start when 50, 90, 99 and 100% of this run's records had been written
    done_at_s: dict[str, float] = field(default_factory=dict)
    #: the slowest cases: (case id, worker seconds, {backend: seconds})
    slowest: list[tuple[str, float, dict[str, float]]] = field(default_factory=list)
    #: what only a live run knows: worker starts, the parent's threads, the compile phase
    live: dict[str, Any] = field(default_factory=dict)
    #: the compile phase (:mod:`conformance.running.compile_phase`), when it ran
    compile: dict[str, Any] | None = None
    label: str = ""

    @property
    def total(self) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        for row in self.backends.values():
            for k, v in row.items():
                out[k] += v
        return dict(out)

    @property
    def pairs(self) -> int:
        return int(self.total.get("pairs", 0))

    def capacity(self) -> tuple[float, float] | None:
        """(worker-seconds of capacity, idle worker-seconds): ``wall x workers`` and that minus ``busy + lost``."""
        if not self.wall_s or not self.workers:
            return None
        cap = self.wall_s * self.workers
        total = self.total
        return cap, cap - total.get("busy", 0.0) - total.get("lost", 0.0)

    def to_json(self) -> dict[str, Any]:
        cap = self.capacity()
        return {
            "schema": PROFILE_SCHEMA,
            "columns": list(COLUMNS),
            "backends": {b: {k: _r(v) for k, v in row.items()} for b, row in sorted(self.backends.items())},
            "total": {k: _r(v) for k, v in self.total.items()},
            "records_without_split": self.unsplit,
            "wall_s": None if self.wall_s is None else _r(self.wall_s),
            "workers": self.workers,
            "capacity_s": None if cap is None else _r(cap[0]),
            "idle_capacity_s": None if cap is None else _r(cap[1]),
            "checks_at_s": None if self.checks_at_s is None else _r(self.checks_at_s),
            "done_at_s": {k: _r(v) for k, v in self.done_at_s.items()},
            "slowest": [
                {"case_id": c, "seconds": _r(s), "backends": {b: _r(x) for b, x in per.items()}}
                for c, s, per in self.slowest
            ],
            "compile": self.compile,
            **self.live,
        }

    def text(self) -> str:
        """The table and the run's lines, plain text (the end of ``attnconf run --profile``, the report)."""
        return render_profiles([self])


def _row() -> dict[str, float]:
    return dict.fromkeys(("pairs", *COLUMNS), 0.0)


def profile_records(
    records: Iterable[CheckResult],
    *,
    wall_s: float | None = None,
    workers: int | None = None,
    checks_at_s: float | None = None,
) -> Profile:
    """The profile of ``records`` (one run's, for the tail and the wall time from their ``at``)."""
    prof = Profile(workers=workers, checks_at_s=checks_at_s)
    per_case: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    ats: list[float] = []
    for r in records:
        row = prof.backends.setdefault(r.backend, _row())
        row["pairs"] += 1
        extra = r.extra if isinstance(r.extra, dict) else {}
        t = extra.get("t")
        rt = float(extra.get("roundtrip_s", 0.0) or 0.0)
        if r.status in (Status.CRASH, Status.TIMEOUT):
            lost = rt or r.elapsed_s
            row["lost"] += lost
            per_case[r.case_id][r.backend] += lost
        if not isinstance(t, dict):
            prof.unsplit += 1
            continue
        worker = float(extra.get("worker_s", 0.0) or 0.0)
        phases = 0.0
        for short, col in _SHORT.items():
            v = float(t.get(short, 0.0))
            row[col] += v
            phases += v
        if worker:
            row["other"] += max(0.0, worker - phases)
            row["busy"] += worker
            row["ipc"] += max(0.0, rt - worker)
            per_case[r.case_id][r.backend] += worker
        row["idle"] += float(t.get("idle", 0.0))
        row["parent"] += float(t.get("par", 0.0))
        if "at" in t:
            ats.append(float(t["at"]))
    if ats:
        ats.sort()
        for label, q in (("50%", 0.5), ("90%", 0.9), ("99%", 0.99), ("100%", 1.0)):
            prof.done_at_s[label] = ats[max(0, math.ceil(q * len(ats)) - 1)]
    prof.wall_s = wall_s if wall_s is not None else (ats[-1] if ats else None)
    ranked = sorted(per_case.items(), key=lambda kv: -sum(kv[1].values()))[:SLOWEST]
    prof.slowest = [(c, sum(per.values()), dict(per)) for c, per in ranked]
    return prof


def _open_text(path: Path):
    with open(path, "rb") as fh:
        gz = fh.read(2) == b"\x1f\x8b"
    return (gzip.open if gz else open)(path, "rt", encoding="utf-8", errors="replace")


def file_profiles(path: Path | str) -> list[Profile]:
    """One profile per run of a results file: each header starts a run (``--resume`` appends one), the
    records after it are its own.  Lines that are not records are skipped (the report counts them)."""
    runs: list[tuple[Header | None, list[CheckResult]]] = []
    with _open_text(Path(path)) as fh:
        for raw in fh:
            try:
                line = json.loads(raw)
            except ValueError:
                continue
            if not isinstance(line, dict):
                continue
            try:
                if line.get("type") == "header":
                    runs.append((Header.from_json(line), []))
                elif line.get("type") == "result":
                    if not runs:
                        runs.append((None, []))
                    runs[-1][1].append(CheckResult.from_json(line))
            except (KeyError, TypeError, ValueError):
                continue
    out = []
    for header, records in runs:
        if not records:
            continue
        run = header.run_options if header is not None else {}
        jobs = run.get("jobs")
        prof = profile_records(
            records,
            workers=jobs if isinstance(jobs, int) else None,
            checks_at_s=run.get("checks_at_s") if isinstance(run.get("checks_at_s"), (int, float)) else None,
        )
        prof.compile = run.get("compile") if isinstance(run.get("compile"), dict) else None
        prof.label = f"{Path(path).name}" + (f", run started {header.started}" if header and header.started else "")
        out.append(prof)
    return out


def _merge(profiles: Sequence[Profile]) -> dict[str, dict[str, float]]:
    rows: dict[str, dict[str, float]] = {}
    for p in profiles:
        for b, row in p.backends.items():
            into = rows.setdefault(b, _row())
            for k, v in row.items():
                into[k] += v
    return rows


def _fmt(x: float) -> str:
    if x == 0:
        return "0"
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.1f}" if abs(x) >= 1 else f"{x:.2f}"


def render_profiles(profiles: Sequence[Profile]) -> str:
    """The table of ``profiles`` (their rows summed per backend) and, per run, its wall, capacity, tail and
    slowest cases; plain text, fixed-width columns."""
    rows = _merge(profiles)
    if not rows:
        return "no records: nothing to profile"
    total = _row()
    for row in rows.values():
        for k, v in row.items():
            total[k] += v
    shown = [c for c in COLUMNS if total[c] > 0 or c in ("kernel", "busy")]
    names = sorted(rows, key=lambda b: -rows[b]["busy"] - rows[b]["lost"])
    head = ["backend", "pairs", *shown]
    body = [[b, str(int(rows[b]["pairs"])), *(_fmt(rows[b][c]) for c in shown)] for b in names]
    body.append(["all", str(int(total["pairs"])), *(_fmt(total[c]) for c in shown)])
    share = total["busy"] or 1.0
    body.append(["% of busy", "", *(f"{100 * total[c] / share:.0f}%" for c in shown)])
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    lines = ["Where the time went (seconds, summed over workers; inputs..other add up to busy, the worker's own time):"]
    for r in [head, *body]:
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
    for p in profiles:
        lines.extend(_run_lines(p, len(profiles) > 1))
    unsplit = sum(p.unsplit for p in profiles)
    if unsplit:
        lines.append(f"{unsplit} record(s) carry no time split (written before attnconf recorded one): pairs only")
    return "\n".join(lines)


def _run_lines(p: Profile, named: bool) -> list[str]:
    lines: list[str] = []
    prefix = f"[{p.label}] " if named and p.label else ""
    total = p.total
    cap = p.capacity()
    if p.wall_s is not None:
        # a live run knows its wall time; a file, when its last record was written
        wall = "wall" if "parent_main_s" in p.live else "last record at"
        text = f"{prefix}run: {wall} {p.wall_s:.1f} s"
        if cap is not None:
            busy = total.get("busy", 0.0) + total.get("lost", 0.0)
            text += (
                f" x {p.workers} worker(s) = {cap[0]:.0f} worker-s; busy {busy:.0f} ({100 * busy / cap[0]:.0f}%), "
                f"idle capacity {cap[1]:.0f} worker-s"
            )
        lines.append(text)
    live = p.live
    if live.get("worker_starts_s"):
        starts = live["worker_starts_s"]
        lines.append(
            f"  worker start-up: {len(starts)} start(s), {sum(starts) / len(starts):.1f} s mean, "
            f"{max(starts):.1f} s max (spawn to ready, adapters imported)"
        )
    if "restarts" in live:
        text = (
            f"  restarts: {live['restarts']}, {live.get('restarts_from_spare', 0)} took a spare worker; slots waited "
            f"{live.get('worker_wait_s', 0.0):.1f} s for workers, {live.get('restart_wait_s', 0.0):.1f} s of it on "
            "restarts"
        )
        sp = live.get("spares")
        if isinstance(sp, dict) and sp.get("started"):
            text += (
                f" (spares: {sp.get('per_placement')} per placement, {sp['started']} started, "
                f"{sp.get('taken', 0)} taken, {sp.get('discarded', 0)} discarded, {sp.get('unused', 0)} unused)"
            )
        lines.append(text)
    if p.checks_at_s is not None:
        lines.append(f"  checks began at {p.checks_at_s:.1f} s (start-up, describe, compile phase before it)")
    if p.compile:
        c = p.compile
        lines.append(
            f"  compile phase: {c.get('keys', 0)} kernel(s), {c.get('compiled', 0)} compiled, {c.get('failed', 0)} "
            f"failed, {c.get('wall_s', 0):.1f} s wall, {c.get('worker_s', 0):.1f} worker-s"
        )
    if p.done_at_s:
        d = p.done_at_s
        end = d.get("100%", 0.0)
        start = p.checks_at_s or 0.0
        span = max(end - start, 1e-9)
        tail = end - d.get("90%", end)
        lines.append(
            "  records written: "
            + ", ".join(f"{k} by {v:.1f} s" for k, v in d.items())
            + f"; the last 10% took {tail:.1f} s ({100 * tail / span:.0f}% of the checks' {span:.1f} s)"
        )
    if "parent_main_s" in live:
        n = max(1, int(total.get("pairs", 0)))
        lines.append(
            f"  parent: {live['parent_main_s']:.2f} s writing, fsync'ing and counting (main thread, "
            f"{live.get('batches', 0)} batch(es)), {live.get('parent_judge_s', 0.0):.2f} s turning replies into "
            f"records; {1e3 * (live['parent_main_s'] + live.get('parent_judge_s', 0.0)) / n:.2f} ms per record"
        )
    if p.slowest:
        lines.append("  slowest cases (worker seconds over their backends):")
        for case_id, seconds, per in p.slowest:
            parts = ", ".join(f"{b} {s:.1f}" for b, s in sorted(per.items(), key=lambda kv: -kv[1]))
            lines.append(f"    {seconds:8.2f}  {case_id}  ({parts})")
    return lines
