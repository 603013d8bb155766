"""The fuzz campaign: draw, check, shrink, record, group, within a budget.

``attnconf fuzz`` walks the seeded stream of :mod:`conformance.fuzz.draw` and checks each case against every
backend through the same crash-isolated :class:`~conformance.running.worker.WorkerClient` as ``attnconf run``
(a crash or hang becomes a ``crash`` / ``timeout`` record and a fresh worker goes on), writing the same header
and result records (fsync'ed as they are known).  What the records carry, how a campaign resumes and the
example database of minimal cases are :mod:`conformance.fuzz.persist`; the budget, the configuration and the
summary are :mod:`conformance.fuzz.config`; this module is the loop.

Budget: a number of cases (draws that at least one backend was asked to run; with ``--resume``, those already
in the file count) or a duration (this invocation's wall time; shrinking stops at the deadline too and records
the smallest failing case found so far with ``complete: false``).

Resume: draw ``i`` depends only on ``(seed, i, limits)``, so a resumed campaign takes the cases of the indices
already in the file from their records, checks only the (index, backend) pairs missing there, finishes the
shrinks that are missing or incomplete, and then continues the stream after the last recorded index.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from attnfast.base import declared_support_of_info, info_devices, runs_on
from conformance.cases import space
from conformance.cases.case import AttentionCase
from conformance.fuzz.config import Budget, FuzzConfig, FuzzSummary, parse_budget
from conformance.lock import hold
from conformance.fuzz.draw import draw
from conformance.fuzz.group import fuzz_role, group_failures, label, signature
from conformance.fuzz.persist import Prior, db_key, db_value, open_db, read_prior, with_fuzz, write_header
from conformance.fuzz.shrink import ShrinkResult, failure_kind, shrink
from conformance.records import CheckResult, judged_results, Status
from conformance.results_file import read_records
from conformance.results_writer import append_record
from conformance.exits import OutputError, UsageError
from conformance.outputs import check_output, move_aside
from conformance.running.runner import check_backend_names, describe_backends, reply_record
from conformance.running.worker import WorkerClient

__all__ = ["Budget", "FuzzConfig", "FuzzSummary", "parse_budget", "run_fuzz"]


#: Consecutive draws that ran no case (rejected by the case model or refused by every backend's declarations)
#: after which a campaign stops drawing: a backend that may run some case is drawn one within a few hundred
#: draws (1 in 20 for the narrowest, MLA-only one), so ten thousand in a row means it runs none, and a
#: ``--budget`` of cases would otherwise never be spent.
MAX_IDLE_DRAWS = 10_000


def _device_refusals(camp: "_Campaign") -> dict[str, str]:
    """The backends whose declared devices exclude the campaign's device (they can run no case): spec -> why
    (:func:`attnfast.base.runs_on`)."""
    where = {spec: runs_on(info_devices(camp.infos[spec]), camp.config.device) for spec in camp.config.backends}
    return {spec: support.reason for spec, support in where.items() if not support}


def _jsonable(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


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
        record = reply_record(reply, case, spec, self.infos[spec], self.rc)
        if record.status is Status.ERROR and c.device.startswith("cuda"):
            self.client.kill()  # the CUDA context may be poisoned: the next request starts a fresh worker
        return record

    def write(self, record: CheckResult) -> None:
        with _writing(self.config.out):
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
        device = self.config.device
        return lambda c: bool(declared_support_of_info(c, info, device)) and not space.violations(space.classify(c))

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
        minimal = with_fuzz(
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
            self.db.save(db_key(original.backend), db_value(result.case))
        return minimal

    # -------------------------------------------------------------- replays
    def replay(self, done: set[tuple[str, str]]) -> None:
        if self.db is None:
            return
        for spec in self.config.backends:
            name = self.infos[spec]["name"]
            key = db_key(name)
            for value in sorted(self.db.fetch(key)):
                try:
                    case = AttentionCase.from_json(json.loads(value))
                except (ValueError, KeyError, TypeError):
                    continue  # written by a case model this version cannot read: left for that version
                if (case.id, name) in done:
                    continue
                record = with_fuzz(self.check(case, spec), {"role": "replay", "seed": self.config.seed})
                self.write(record)
                self.summary.replays += 1
                self.summary.failures += record.status.is_problem
                if not record.status.is_problem and record.status is not Status.UNSUPPORTED:
                    self.db.delete(key, value)  # fixed: no longer a failure to replay
                self.progress()


def _progress_bar(config: FuzzConfig):
    from rich.progress import BarColumn, TextColumn, TimeElapsedColumn

    from conformance.console import progress

    unit = "cases" if config.budget.cases is not None else "s"
    return progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:.0f}/{task.total:.0f} " + unit),
        TimeElapsedColumn(),
        TextColumn("{task.fields[cases]}"),
        disable=not config.progress,
        unit=unit,
    )


def check_campaign_paths(config: FuzzConfig) -> None:
    """The campaign file and ``--db`` checked before any worker starts (:func:`conformance.outputs.check_output`:
    a directory, device node, FIFO, socket, the ``--tol-file`` or the ``--db`` directory as ``--out``: exit 2;
    an unwritable directory or read-only file: exit 3); a ``--db`` that exists and is not a directory: exit 2."""
    inputs = [p for p in (config.tol_file, config.db) if p]
    check_output(config.out, "--out", inputs)
    try:
        not_dir = config.db is not None and config.db.exists() and not config.db.is_dir()
    except OSError as exc:  # Python < 3.12: a name too long raises in exists()
        raise OutputError(f"--db {config.db}: cannot be examined: {exc.strerror or exc}") from None
    if not_dir:
        raise UsageError(f"--db {config.db}: is not a directory (the example database is a directory)")


@contextlib.contextmanager
def _writing(out: Path) -> Iterator[None]:
    """An OSError appending to the campaign file as :class:`OutputError` (exit 3), one line."""
    try:
        yield
    except OSError as exc:
        raise OutputError(
            f"--out {out}: cannot write: {exc.strerror or exc}; the records written before are kept (free the "
            "space, then run the same command with --resume)"
        ) from None


def run_fuzz(config: FuzzConfig) -> FuzzSummary:
    """Run the campaign described by ``config``; raises :class:`UsageError` for a bad command line, or when
    another command holds the campaign file (:mod:`conformance.lock`: held for the whole campaign)."""
    check_campaign_paths(config)  # a directory, device or FIFO refused before the lock's sidecar is made
    with hold(config.out, "--out"):
        return _run_fuzz(config)


def _run_fuzz(config: FuzzConfig) -> FuzzSummary:
    if not config.backends:
        raise UsageError("give at least one --backend")
    if config.max_shrink_steps < 0:
        raise UsageError(f"--max-shrink-steps must be >= 0, got {config.max_shrink_steps}")
    check_backend_names(config.backends)
    from conformance.running.worker import load_overrides

    try:
        load_overrides(list(config.tol), config.tol_file)
    except (OSError, ValueError, RuntimeError) as exc:
        raise UsageError(f"tolerance overrides: {exc}") from None
    prior = read_prior(config)
    camp = _Campaign(config)
    s = camp.summary
    try:
        env, camp.infos, _ = describe_backends(camp.client, camp.rc)
        s.allow_unjudged = config.allow_unjudged
        s.backends = {
            camp.infos[spec]["name"]: (camp.infos[spec].get("unavailable_reason") or "?")
            if camp.infos[spec].get("available") == "no"
            else _device_refusals(camp).get(spec, "")
            for spec in config.backends
        }
        camp.client.preload = list(config.backends)
        if config.db is not None:
            camp.db = open_db(config.db)
        if not config.resume and config.out.exists():
            backup = move_aside(config.out)  # numbered, never overwritten: no run deletes earlier results
            print(f"attnconf fuzz: moved the existing {config.out} to {backup}", file=sys.stderr)
        with _writing(config.out):
            write_header(config, env, camp.infos, len(prior.originals))
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
    s.records, s.nonfinite_passes = judged_results(read_records(config.out)[1])
    s.groups = group_failures(r for r in s.records if fuzz_role(r).get("role") in ("minimal", "replay"))
    return s


def _stream_loop(camp: _Campaign, prior: Prior) -> None:
    """Draw, check, shrink, until the budget is spent (recorded indices come from their records)."""
    config, s = camp.config, camp.summary
    names = {spec: camp.infos[spec]["name"] for spec in config.backends}
    pending: Counter = Counter()  # rejected / refused draws since the last case that ran
    recorded = prior.cases()
    if len(_device_refusals(camp)) == len(config.backends):
        s.stopped = "every backend runs on another device: no draw can run"
        return
    index = -1
    while True:
        if config.budget.cases is not None and s.cases_run >= config.budget.cases:
            return
        if camp.out_of_time():
            return
        if index >= prior.last_index and pending["rejected"] + pending["refused"] >= MAX_IDLE_DRAWS:
            s.stopped = f"{MAX_IDLE_DRAWS} draws in a row ran no case (rejected or refused by every backend)"
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
            refusals = {
                spec: declared_support_of_info(case, camp.infos[spec], config.device).reason for spec in config.backends
            }
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
                original = with_fuzz(
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
