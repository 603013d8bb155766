"""The fuzz campaign: draw, check, shrink, record, group, within a budget.

``attnconf fuzz`` walks the seeded stream of :mod:`conformance.fuzz.draw` and checks each case against every
backend through the same crash-isolated :class:`~conformance.running.worker.WorkerClient` as ``attnconf run``
(a crash or hang becomes a ``crash`` / ``timeout`` record and a fresh worker goes on), writing the same header
and result records (fsync'ed as they are known).  Records carry ``extra["fuzz"]``:

* ``{"role": "original", "index": i, "seed": s, "skipped": {"rejected": r, "refused": f}}`` for every drawn
  case that ran (``skipped``: draws since the previous one that the case model rejected, or that every
  backend's declared refusals ruled out: those never reach the worker and cost no budget);
* ``{"role": "minimal", "original_id": ..., "original_index": i, "path": [moves], "shrink_steps": n,
  "tried": evaluations, "complete": bool, "group": {axis: level}, "label": "..."}`` for the minimal case of
  every failure (fail, error, crash, timeout; :mod:`conformance.fuzz.shrink`), recorded after the original;
* ``{"role": "replay"}`` for the minimal cases of earlier campaigns replayed from ``--db`` first.

Budget: a number of cases (draws that at least one backend was asked to run; with ``--resume``, those already
in the file count) or a duration (this invocation's wall time; shrinking stops at the deadline too and records
the smallest failing case found so far with ``complete: false``).

Resume: draw ``i`` depends only on ``(seed, i, limits)``, so a resumed campaign takes the cases of the indices
already in the file from their records, checks only the (index, backend) pairs missing there, finishes the
shrinks that are missing or incomplete, and then continues the stream after the last recorded index.

``--db DIR`` is a Hypothesis example database (:class:`hypothesis.database.DirectoryBasedExampleDatabase`, one
key per backend): every complete minimal case is saved there, the next campaign with the same ``--db``
replays them before drawing (still failing: recorded and grouped; passing now: deleted, as Hypothesis does with
examples that no longer fail).  It is the one part of Hypothesis's machinery that fits this loop as it is; why
its strategies and shrinker do not is in :mod:`conformance.fuzz.draw` and :mod:`conformance.fuzz.shrink`.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import re
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conformance.cases import space
from conformance.cases.case import AttentionCase
from conformance.fuzz.draw import DrawLimits, draw
from conformance.fuzz.group import FuzzGroup, fuzz_role, group_failures, label, signature
from conformance.fuzz.shrink import ShrinkResult, failure_kind, shrink
from conformance.records import CheckResult, Header, Status, append_record, read_records
from conformance.running.env import refused_features
from conformance.running.outfile import move_aside
from conformance.running.runner import RunConfig, UsageError, _check_names, _describe, _record, repair_tail
from conformance.running.worker import WorkerClient

__all__ = ["Budget", "FuzzConfig", "FuzzSummary", "declared_refusal", "parse_budget", "run_fuzz"]


@dataclass(frozen=True)
class Budget:
    """How long a campaign draws: ``cases`` (cases run) or ``seconds`` (wall time of this invocation)."""

    cases: int | None = None
    seconds: float | None = None

    def __post_init__(self) -> None:
        if (self.cases is None) == (self.seconds is None):
            raise ValueError("budget must set exactly one of cases and seconds")
        if self.cases is not None and self.cases < 1:
            raise ValueError(f"budget cases must be >= 1, got {self.cases}")
        if self.seconds is not None and self.seconds <= 0:
            raise ValueError(f"budget seconds must be > 0, got {self.seconds}")

    def text(self) -> str:
        return f"{self.cases} cases" if self.cases is not None else f"{self.seconds:g} s"


_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h)$")


def parse_budget(text: str) -> Budget:
    """``--budget``: a number of cases (``200``) or a duration (``90s``, ``10m``, ``1.5h``)."""
    t = text.strip().lower()
    if t.isdigit() and int(t) > 0:
        return Budget(cases=int(t))
    m = _DURATION.match(t)
    if m and float(m.group(1)) > 0:
        return Budget(seconds=float(m.group(1)) * {"s": 1, "m": 60, "h": 3600}[m.group(2)])
    raise UsageError(f"--budget must be a number of cases (200) or a duration (90s, 10m, 1h), got {text!r}")


@dataclass(frozen=True)
class FuzzConfig:
    """Everything ``attnconf fuzz`` was asked to do."""

    backends: tuple[str, ...]
    device: str = "cpu"
    budget: Budget = Budget(cases=100)
    seed: int = 0
    out: Path = Path("fuzz.jsonl")
    resume: bool = False
    timeout: float = 300.0
    max_shrink_steps: int = 200
    limits: DrawLimits = DrawLimits()
    tol: tuple[str, ...] = ()
    tol_file: str | None = None
    db: Path | None = None
    progress: bool = True
    argv: tuple[str, ...] = ()

    def run_config(self) -> RunConfig:
        """The ``run`` configuration the shared record helpers read (repro commands, tolerance overrides)."""
        return RunConfig(
            backends=self.backends,
            device=self.device,
            out=self.out,
            resume=self.resume,
            timeout=self.timeout,
            seed=self.seed,
            tol=self.tol,
            tol_file=self.tol_file,
            progress=self.progress,
            argv=self.argv,
        )

    def fuzz_info(self) -> dict[str, Any]:
        """The header's ``env["fuzz"]``: what a resumed campaign must match to continue the same stream."""
        return {
            "seed": self.seed,
            "max_tokens": self.limits.max_tokens,
            "max_heads": self.limits.max_heads,
            "budget": self.budget.text(),
            "max_shrink_steps": self.max_shrink_steps,
            "db": str(self.db) if self.db else None,
        }


@dataclass
class FuzzSummary:
    """What a campaign did.  ``records`` are all result records of the file (earlier invocations too)."""

    out: Path
    draws: int = 0
    rejected: Counter = field(default_factory=Counter)
    refused_draws: int = 0
    refused: Counter = field(default_factory=Counter)
    cases_run: int = 0
    written: int = 0
    failures: int = 0
    shrinks: int = 0
    shrink_evaluations: int = 0
    replays: int = 0
    elapsed_s: float = 0.0
    worker_starts: int = 0
    records: list[CheckResult] = field(default_factory=list)
    groups: list[FuzzGroup] = field(default_factory=list)

    @property
    def problems(self) -> list[CheckResult]:
        """Original and replayed records with a problem status (minimal records restate them)."""
        return [r for r in self.records if r.status.is_problem and fuzz_role(r).get("role") in ("original", "replay")]

    @property
    def exit_code(self) -> int:
        return 1 if self.problems else 0

    def text(self) -> str:
        counts = Counter(r.status.value for r in self.records if fuzz_role(r).get("role") == "original")
        skipped = sum(sum(info.get("skipped", {}).values()) for info in _per_index(self.records).values())
        lines = [
            f"fuzz: {self.cases_run} cases run from {self.draws} draws in {self.elapsed_s:.1f} s "
            f"({sum(self.rejected.values())} rejected by the case model, {self.refused_draws} refused by every "
            f"backend's declarations; {skipped} such draws in the whole file); {self.written} records "
            f"written to {self.out}; worker starts: {self.worker_starts}",
            "originals: " + ", ".join(f"{s.value} {counts.get(s.value, 0)}" for s in Status),
            f"shrinks: {self.shrinks} ({self.shrink_evaluations} evaluations); replays from --db: {self.replays}",
        ]
        if self.refused:
            top = ", ".join(f"{reason} {n}" for reason, n in self.refused.most_common(6))
            lines.append(f"refusals of those draws, by feature (one per backend): {top}")
        if self.groups:
            lines.append(f"{len(self.problems)} failures in {len(self.groups)} groups:")
            for g in self.groups:
                lines.append("  " + g.text())
                lines.append("    repro: " + g.representative.repro)
        else:
            lines.append("no failures")
        return "\n".join(lines)


def _per_index(records: list[CheckResult]) -> dict[int, dict[str, Any]]:
    """The ``extra["fuzz"]`` of one original record per drawn index (every backend's record repeats it)."""
    return {int(info["index"]): info for info in map(fuzz_role, records) if info.get("role") == "original"}


def declared_refusal(case: AttentionCase, info: dict[str, str], device: str) -> str:
    """Why a backend refuses ``case`` by its declarations alone (devices, refused and opt-in features, as
    :meth:`attnfast.base.Backend.supports` checks them before any shape limit); ``""`` when it may run it."""
    devices = [d for d in info.get("devices", "").split(",") if d]
    if devices and device.split(":")[0] not in devices:
        return f"runs on {'/'.join(devices)}, not {device}"
    refused = refused_features(info)
    if case.v_padded:
        if "v_pad" in refused:
            return f"v_pad: {refused['v_pad']}"
        case = case.padded_v_call()
    for name in sorted(case.features()):
        if name in refused:
            return f"{name}: {refused[name]}"
    return ""


def _jsonable(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _with_fuzz(record: CheckResult, info: dict[str, Any]) -> CheckResult:
    return dataclasses.replace(record, extra={**record.extra, "fuzz": info})


class _Campaign:
    """One invocation's state: the worker, the file, the counters."""

    def __init__(self, config: FuzzConfig) -> None:
        self.config = config
        self.rc = config.run_config()
        self.client = WorkerClient()
        self.summary = FuzzSummary(out=config.out)
        self.infos: dict[str, dict[str, str]] = {}
        self.t0 = time.monotonic()
        self.deadline = None if config.budget.seconds is None else self.t0 + config.budget.seconds
        self.db = None
        self.bar: Any = None
        self.task: Any = None

    # -------------------------------------------------------------- checks
    def check(self, case: AttentionCase, spec: str) -> CheckResult:
        c = self.config
        request = {
            "op": "check",
            "case": case.to_json(),
            "backend": spec,
            "seed": c.seed,
            "device": c.device,
            "tol": list(c.tol),
            "tol_file": c.tol_file,
            "time": False,
        }
        reply = self.client.request(request, timeout=c.timeout)
        record = _record(reply, case, spec, self.infos[spec], self.rc)
        if record.status is Status.ERROR and c.device.startswith("cuda"):
            self.client.kill()  # the CUDA context may be poisoned: the next request starts a fresh worker
        return record

    def write(self, record: CheckResult) -> None:
        append_record(self.config.out, record)
        self.summary.written += 1

    def out_of_time(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def progress(self, description: str | None = None) -> None:
        if self.bar is None:
            return
        s = self.summary
        done = s.cases_run if self.config.budget.cases is not None else time.monotonic() - self.t0
        fields = {"cases": f"{s.cases_run} cases, {s.failures} failures, {s.shrinks} shrunk"}
        if description is not None:
            fields["description"] = description
        self.bar.update(self.task, completed=done, **fields)

    # -------------------------------------------------------------- shrinking
    def admissible(self, spec: str) -> Callable[[AttentionCase], bool]:
        info = self.infos[spec]
        return lambda c: not declared_refusal(c, info, self.config.device) and not space.violations(space.classify(c))

    def shrink_and_record(
        self, spec: str, original: CheckResult, index: int, start: CheckResult | None = None
    ) -> CheckResult:
        """Shrink one failure (from ``start``, an incomplete minimal record of an earlier invocation, if given)
        and write its minimal record."""
        c = self.config
        begin = start or original
        prior = fuzz_role(start) if start is not None else {}
        case = AttentionCase.from_json(begin.case)
        self.progress(f"shrink {original.backend} {original.case_id}")

        def on_step(state: ShrinkResult) -> None:
            self.progress(f"shrink {original.backend} {state.case.id}")

        result = shrink(
            case,
            begin,
            lambda cand: self.check(cand, spec),
            reference=original,
            max_steps=max(0, c.max_shrink_steps - int(prior.get("tried", 0))),
            deadline=self.deadline,
            admissible=self.admissible(spec),
            on_step=on_step,
        )
        self.summary.shrinks += 1
        self.summary.shrink_evaluations += result.tried
        sig = signature(result.case)
        minimal = _with_fuzz(
            result.result,
            {
                "role": "minimal",
                "original_id": original.case_id,
                "original_index": index,
                "seed": c.seed,
                "path": list(prior.get("path", [])) + result.steps,
                "shrink_steps": int(prior.get("shrink_steps", 0)) + len(result.steps),
                "tried": int(prior.get("tried", 0)) + result.tried,
                "complete": result.complete,
                "kind": failure_kind(original),
                "group": {a: _jsonable(v) for a, v in sig.items()},
                "label": label(sig),
            },
        )
        self.write(minimal)
        if self.db is not None and result.complete:
            self.db.save(_db_key(original.backend), _db_value(result.case))
        return minimal

    # -------------------------------------------------------------- replays
    def replay(self, done: set[tuple[str, str]]) -> None:
        if self.db is None:
            return
        for spec in self.config.backends:
            name = self.infos[spec]["name"]
            key = _db_key(name)
            for value in sorted(self.db.fetch(key)):
                try:
                    case = AttentionCase.from_json(json.loads(value))
                except (ValueError, KeyError, TypeError):
                    continue  # written by a case model this version cannot read: left for that version
                if (case.id, name) in done:
                    continue
                record = _with_fuzz(self.check(case, spec), {"role": "replay", "seed": self.config.seed})
                self.write(record)
                self.summary.replays += 1
                self.summary.failures += record.status.is_problem
                if not record.status.is_problem and record.status is not Status.UNSUPPORTED:
                    self.db.delete(key, value)  # fixed: no longer a failure to replay
                self.progress()


def _db_key(backend: str) -> bytes:
    return f"attnconf-fuzz:{backend}".encode()


def _db_value(case: AttentionCase) -> bytes:
    return json.dumps(case.to_json(), sort_keys=True, separators=(",", ":")).encode()


def _open_db(path: Path):
    try:
        from hypothesis.database import DirectoryBasedExampleDatabase
    except ModuleNotFoundError:
        raise UsageError("--db needs hypothesis: pip install hypothesis (or 'attnconf[test]')") from None
    return DirectoryBasedExampleDatabase(str(path))


@dataclass
class _Prior:
    """What an earlier invocation left in the file (``--resume``)."""

    originals: dict[tuple[int, str], CheckResult] = field(default_factory=dict)
    minimal: dict[tuple[str, str], CheckResult] = field(default_factory=dict)
    replays: set[tuple[str, str]] = field(default_factory=set)

    @property
    def last_index(self) -> int:
        return max((i for i, _ in self.originals), default=-1)

    def cases(self) -> dict[int, AttentionCase]:
        """The case of every recorded index."""
        return {i: AttentionCase.from_json(r.case) for (i, _), r in self.originals.items()}


def _prior(config: FuzzConfig) -> _Prior:
    prior = _Prior()
    if not config.resume or not config.out.exists():
        return prior
    repair_tail(config.out)
    headers, results = read_records(config.out)
    want = config.fuzz_info()
    for h in headers:
        run, fuzz = h.env.get("run", {}), h.env.get("fuzz")
        if fuzz is None:
            raise UsageError(f"--resume: {config.out} was not written by attnconf fuzz")
        if run.get("device", config.device) != config.device:
            raise UsageError(f"--resume: {config.out} was fuzzed with device={run['device']!r}, not {config.device!r}")
        for key in ("seed", "max_tokens", "max_heads"):
            if fuzz.get(key) != want[key]:
                raise UsageError(f"--resume: {config.out} was fuzzed with {key}={fuzz.get(key)!r}, not {want[key]!r}")
    for r in results:
        info = fuzz_role(r)
        role = info.get("role")
        if role == "original":
            prior.originals[int(info["index"]), r.backend] = r
        elif role == "minimal":
            prior.minimal[str(info.get("original_id")), r.backend] = r
        elif role == "replay":
            prior.replays.add((r.case_id, r.backend))
    return prior


def _progress_bar(config: FuzzConfig):
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    unit = "cases" if config.budget.cases is not None else "s"
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:.0f}/{task.total:.0f} " + unit),
        TimeElapsedColumn(),
        TextColumn("{task.fields[cases]}"),
        console=Console(stderr=True),
        disable=not config.progress,
    )


def run_fuzz(config: FuzzConfig) -> FuzzSummary:
    """Run the campaign described by ``config``; raises :class:`UsageError` for a bad command line."""
    if not config.backends:
        raise UsageError("give at least one --backend")
    if config.max_shrink_steps < 0:
        raise UsageError(f"--max-shrink-steps must be >= 0, got {config.max_shrink_steps}")
    _check_names(config.backends)
    from conformance.running.worker import load_overrides

    try:
        load_overrides(list(config.tol), config.tol_file)
    except (OSError, ValueError, RuntimeError) as exc:
        raise UsageError(f"tolerance overrides: {exc}") from None
    prior = _prior(config)
    camp = _Campaign(config)
    s = camp.summary
    try:
        env, camp.infos, _ = _describe(camp.client, camp.rc)
        camp.client.preload = list(config.backends)
        if config.db is not None:
            camp.db = _open_db(config.db)
        config.out.parent.mkdir(parents=True, exist_ok=True)
        if not config.resume and config.out.exists():
            backup = move_aside(config.out)  # numbered, never overwritten: no run deletes earlier results
            print(f"attnconf fuzz: moved the existing {config.out} to {backup}", file=sys.stderr)
        run_info = {
            "device": config.device,
            "seed": config.seed,
            "timeout_s": config.timeout,
            "time": False,
            "tol": list(config.tol),
            "tol_file": config.tol_file,
            "resume": config.resume,
            "already_recorded": len(prior.originals),
        }
        append_record(
            config.out,
            Header(
                suite="fuzz",
                backends={camp.infos[b]["name"]: camp.infos[b] for b in config.backends},
                env={**env, "run": run_info, "fuzz": config.fuzz_info()},
                argv=list(config.argv),
                started=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            ),
        )
        budget = config.budget
        with _progress_bar(config) as bar:
            camp.bar = bar
            camp.task = bar.add_task(
                "fuzz " + ", ".join(config.backends), total=budget.cases or budget.seconds, cases=""
            )
            camp.replay(prior.replays)
            _stream_loop(camp, prior)
            camp.progress()
    finally:
        s.worker_starts = camp.client.starts
        camp.client.close()
        s.elapsed_s = time.monotonic() - camp.t0
    _, s.records = read_records(config.out)
    s.groups = group_failures(r for r in s.records if fuzz_role(r).get("role") in ("minimal", "replay"))
    return s


def _stream_loop(camp: _Campaign, prior: _Prior) -> None:
    """Draw, check, shrink, until the budget is spent (recorded indices come from their records)."""
    config, s = camp.config, camp.summary
    names = {spec: camp.infos[spec]["name"] for spec in config.backends}
    pending: Counter = Counter()  # rejected / refused draws since the last case that ran
    recorded = prior.cases()
    index = -1
    while True:
        if config.budget.cases is not None and s.cases_run >= config.budget.cases:
            return
        if camp.out_of_time():
            return
        index += 1
        if index <= prior.last_index:
            case = recorded.get(index)
            if case is None:
                continue  # a rejected or refused draw: its count is in the next record's "skipped"
        else:
            s.draws += 1
            d = draw(config.seed, index, config.limits)
            if d.case is None:
                s.rejected[d.rejected.split(":", 1)[0]] += 1
                pending["rejected"] += 1
                continue
            case = d.case
            refusals = {spec: declared_refusal(case, camp.infos[spec], config.device) for spec in config.backends}
            if all(refusals.values()):
                s.refused_draws += 1
                for reason in refusals.values():
                    s.refused[reason.split(":", 1)[0]] += 1
                pending["refused"] += 1
                continue
        s.cases_run += 1
        for spec in config.backends:
            original = prior.originals.get((index, names[spec]))
            if original is None:
                original = _with_fuzz(
                    camp.check(case, spec),
                    {"role": "original", "index": index, "seed": config.seed, "skipped": dict(pending)},
                )
                camp.write(original)
            if original.status.is_problem:
                s.failures += 1
                start = prior.minimal.get((original.case_id, original.backend))
                if start is None or not fuzz_role(start).get("complete", True):
                    if camp.out_of_time() and start is not None:
                        continue
                    camp.shrink_and_record(spec, original, index, start)
            camp.progress()
        pending.clear()
