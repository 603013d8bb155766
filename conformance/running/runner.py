"""The sweep: every selected case against every backend, one JSON line per (case, backend).

Order is cases outer, backends inner, so the worker computes a case's reference once and reuses
it for every backend.  Kernels run in a :class:`~conformance.running.worker.WorkerClient` subprocess; a
dead worker becomes a ``crash`` record, a silent one a ``timeout`` record, and the sweep goes on
with a fresh worker.  Records are appended (and fsync'ed) as soon as they are known, so a killed
run loses at most the pair in flight; ``resume`` skips the pairs already in the file.  Without
``resume`` an existing file is moved aside to ``<name>.prev.jsonl`` (one backup) before the new
run starts.

Exit status of a run (see :attr:`RunSummary.exit_code`): 0 when no selected (case, backend) pair has
a problem status (fail, error, crash, timeout), 1 otherwise; pairs recorded by an earlier run of
a resumed file count too, so the status describes the whole sweep.
"""

from __future__ import annotations

import datetime as _dt
import fnmatch
import json
import shlex
import statistics
import sys
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from conformance.cases.case import AttentionCase
from conformance.records import CheckResult, Header, Status, append_record, read_records
from conformance.running.worker import Reply, WorkerClient

__all__ = ["RunConfig", "RunSummary", "UsageError", "parse_shard", "repair_tail", "run", "select_cases"]


class UsageError(ValueError):
    """A bad command line (unknown suite or backend, empty selection): exit status 2."""


@dataclass(frozen=True)
class RunConfig:
    """Everything ``attnconf run`` was asked to do."""

    backends: tuple[str, ...]
    suite: str | None = None
    device: str = "cpu"
    out: Path = Path("results.jsonl")
    resume: bool = False
    shard: tuple[int, int] | None = None
    timeout: float = 300.0
    seed: int = 0
    case_patterns: tuple[str, ...] = ()
    case_json: str | None = None
    time: bool = False
    tol: tuple[str, ...] = ()
    tol_file: str | None = None
    limit: int | None = None
    progress: bool = True
    argv: tuple[str, ...] = ()


@dataclass
class RunSummary:
    """Counts of one sweep; ``exit_code`` is the run command's exit status."""

    out: Path
    counts: Counter = field(default_factory=Counter)
    written: int = 0
    skipped: int = 0
    problems: int = 0
    worker_starts: int = 0
    harness_s: list[float] = field(default_factory=list)
    kernel_s: list[float] = field(default_factory=list)
    roundtrip_s: list[float] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return 1 if self.problems else 0

    def text(self) -> str:
        def med(xs: list[float]) -> str:
            return f"{statistics.median(xs) * 1e3:.2f} ms" if xs else "n/a"

        counts = ", ".join(f"{s.value} {self.counts.get(s.value, 0)}" for s in Status)
        return (
            f"{self.written} records written to {self.out} ({self.skipped} already there): {counts}\n"
            f"median per record: harness {med(self.harness_s)}, kernel {med(self.kernel_s)}, "
            f"parent round trip {med(self.roundtrip_s)}; worker starts: {self.worker_starts}"
        )


def parse_shard(text: str) -> tuple[int, int]:
    """``"i/n"`` with 0 <= i < n (0-based, as pytest-shard and CI matrices count)."""
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise UsageError(f"--shard must look like i/n, got {text!r}") from None
    if n < 1 or not 0 <= i < n:
        raise UsageError(f"--shard i/n needs 0 <= i < n, got {text!r}")
    return i, n


def _json_cases(text: str) -> list[AttentionCase]:
    raw = Path(text[1:]).read_text() if text.startswith("@") else text
    try:
        data = json.loads(raw)
        items = data if isinstance(data, list) else [data]
        return [AttentionCase.from_json(d) for d in items]
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise UsageError(f"--case-json is not an AttentionCase (or a list of them): {exc}") from None


def select_cases(
    suite: str | None,
    patterns: tuple[str, ...] = (),
    case_json: str | None = None,
    shard: tuple[int, int] | None = None,
    limit: int | None = None,
) -> list[AttentionCase]:
    """The cases of a run: suite cases matching any pattern (id or fnmatch glob), plus the JSON
    cases, deduplicated by id; then shard ``i/n`` keeps every n-th from the i-th; then ``limit``."""
    cases: list[AttentionCase] = []
    if suite is not None:
        from conformance.cases.suites import get_suite, suite_names

        if suite not in suite_names():
            raise UsageError(f"--suite must be one of {suite_names()}, got {suite!r}")
        cases = get_suite(suite)
        if patterns:
            cases = [c for c in cases if any(fnmatch.fnmatchcase(c.id, p) for p in patterns)]
    elif patterns:
        raise UsageError("--case filters a suite: give --suite too (or --case-json for a case of your own)")
    if case_json:
        cases = cases + _json_cases(case_json)
    if suite is None and not case_json:
        raise UsageError("give --suite and/or --case-json")
    cases = list({c.id: c for c in cases}.values())
    if shard is not None:
        cases = cases[shard[0] :: shard[1]]
    if limit is not None:
        cases = cases[: max(0, limit)]
    if not cases:
        raise UsageError("no case selected (check --case patterns, --shard and --limit)")
    return cases


def repair_tail(path: Path) -> None:
    """Make the next append start on a fresh line: drop a last line cut short by a kill.

    A complete JSON object that merely lacks its newline is kept (and given one).
    """
    if not path.exists() or path.stat().st_size == 0:
        return
    data = path.read_bytes()
    if data.endswith(b"\n"):
        return
    cut = data.rfind(b"\n") + 1
    try:
        json.loads(data[cut:])
        complete = True
    except ValueError:
        complete = False
    with open(path, "r+b") as fh:
        if complete:
            fh.seek(0, 2)
            fh.write(b"\n")
        else:
            fh.truncate(cut)


def _check_names(specs: tuple[str, ...]) -> None:
    """Unknown registry names fail here, before a worker starts (``module:Class`` is checked there)."""
    from attnfast.registry import available_names

    known = available_names()
    unknown = [s for s in specs if ":" not in s and s not in known]
    if unknown:
        raise UsageError(
            f"unknown backend {', '.join(map(repr, unknown))}; --backend must be one of {known} or module:Class"
        )


def _describe(client: WorkerClient, config: RunConfig) -> tuple[dict[str, Any], dict[str, dict[str, str]]]:
    reply = client.request(
        {"op": "describe", "backends": list(config.backends), "device": config.device},
        timeout=max(120.0, config.timeout),
    )
    if reply.kind != "ok" or not reply.data.get("ok"):
        raise UsageError(f"the worker could not describe the backends: {reply.reason or reply.data.get('error')}")
    errors = reply.data.get("errors", {})
    if errors:
        raise UsageError("; ".join(f"{spec}: {msg}" for spec, msg in errors.items()))
    infos = reply.data["backends"]
    names = [infos[s]["name"] for s in config.backends]
    if len(set(names)) != len(names):
        raise UsageError(f"two --backend values name the same backend: {names}")
    return reply.data["env"], infos


def _previous(config: RunConfig) -> dict[tuple[str, str], CheckResult]:
    if not config.resume or not config.out.exists():
        return {}
    repair_tail(config.out)
    headers, results = read_records(config.out)
    for h in headers:
        prior = h.env.get("run", {})
        for key in ("device", "seed"):
            if key in prior and prior[key] != getattr(config, key):
                raise UsageError(
                    f"--resume: {config.out} was run with {key}={prior[key]!r}, not {getattr(config, key)!r}"
                )
    return {(r.case_id, r.backend): r for r in results}


def _record(reply: Reply, case: AttentionCase, spec: str, info: dict[str, str], config: RunConfig) -> CheckResult:
    """The record of one request: the worker's verdict, or one the parent writes for it."""
    from conformance.verdict.check import repro_command

    # Rebuilt here rather than taken from the worker's record: a `module:Class` backend is only
    # reachable by its import path, and tolerance overrides change the verdict, so both belong in it.
    repro = repro_command(case, spec, config.device, config.seed)
    repro += "".join(f" --tol {shlex.quote(t)}" for t in config.tol)
    repro += f" --tol-file {shlex.quote(config.tol_file)}" if config.tol_file else ""
    if reply.kind == "ok" and reply.data.get("ok"):
        result = CheckResult.from_json(reply.data["result"])
        return replace(result, extra={**result.extra, "roundtrip_s": reply.wall_s}, repro=repro)
    if reply.kind == "ok":
        status, reason = (
            Status.ERROR,
            "harness error (inputs or reference), not the kernel: " + str(reply.data.get("error")),
        )
        if reply.data.get("traceback"):
            reason += "\n" + reply.data["traceback"]
    else:
        status, reason = (Status.CRASH if reply.kind == "crash" else Status.TIMEOUT), reply.reason
    return CheckResult(
        case_id=case.id,
        backend=info["name"],
        family=info.get("family", ""),
        status=status,
        case=case.to_json(),
        reason=reason,
        version=info.get("version", ""),
        device=config.device,
        seed=config.seed,
        repro=repro,
        elapsed_s=reply.wall_s,
    )


def _progress(config: RunConfig, total: int):
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[counts]}"),
        console=console,
        disable=not config.progress or total == 0,
    )


_COLORS = {
    "pass": "green",
    "fail": "red",
    "unsupported": "yellow",
    "error": "magenta",
    "crash": "bold red",
    "timeout": "bold magenta",
}


#: Statuses whose record timed a kernel call (the harness/kernel medians are taken over these).
_RAN = (Status.PASS, Status.FAIL, Status.ERROR)


def _counts_text(counts: Counter) -> str:
    return " ".join(f"[{_COLORS[s.value]}]{s.value} {counts.get(s.value, 0)}[/]" for s in Status)


def run(config: RunConfig) -> RunSummary:
    """Run the sweep described by ``config``; raises :class:`UsageError` for a bad selection."""
    cases = select_cases(config.suite, config.case_patterns, config.case_json, config.shard, config.limit)
    if not config.backends:
        raise UsageError("give at least one --backend")
    _check_names(config.backends)
    from conformance.running.worker import load_overrides

    try:
        load_overrides(list(config.tol), config.tol_file)  # the worker parses them again; fail fast here
    except (OSError, ValueError, RuntimeError) as exc:
        raise UsageError(f"tolerance overrides: {exc}") from None
    done = _previous(config)
    client = WorkerClient()
    summary = RunSummary(out=config.out)
    try:
        env, infos = _describe(client, config)
        client.preload = list(config.backends)
        config.out.parent.mkdir(parents=True, exist_ok=True)
        if not config.resume and config.out.exists():
            # A fresh run starts a new file, but the last one is kept: a repro command pasted from a
            # report (default --out) must not destroy the sweep it came from.
            backup = config.out.with_name(config.out.stem + ".prev" + config.out.suffix)
            config.out.replace(backup)
            print(f"attnconf run: moved the existing {config.out} to {backup}", file=sys.stderr)
        run_info = {
            "device": config.device,
            "seed": config.seed,
            "shard": list(config.shard) if config.shard else None,
            "timeout_s": config.timeout,
            "time": config.time,
            "tol": list(config.tol),
            "tol_file": config.tol_file,
            "cases": len(cases),
            "resume": config.resume,
            "already_recorded": len(done),
        }
        started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        append_record(
            config.out,
            Header(
                suite=config.suite or "custom",
                backends={infos[s]["name"]: infos[s] for s in config.backends},
                env={**env, "run": run_info},
                argv=list(config.argv),
                started=started,
            ),
        )
        pairs = [(c, s) for c in cases for s in config.backends]
        todo = [(c, s) for c, s in pairs if (c.id, infos[s]["name"]) not in done]
        summary.skipped = len(pairs) - len(todo)
        summary.problems = sum(
            1 for c, s in pairs if (c.id, infos[s]["name"]) in done and done[c.id, infos[s]["name"]].status.is_problem
        )
        with _progress(config, len(todo)) as bar:
            task = bar.add_task(config.suite or "cases", total=len(todo), counts="")
            for case, spec in todo:
                request = {
                    "op": "check",
                    "case": case.to_json(),
                    "backend": spec,
                    "seed": config.seed,
                    "device": config.device,
                    "tol": list(config.tol),
                    "tol_file": config.tol_file,
                    "time": config.time,
                }
                reply = client.request(request, timeout=config.timeout)
                record = _record(reply, case, spec, infos[spec], config)
                append_record(config.out, record)
                summary.written += 1
                summary.counts[record.status.value] += 1
                summary.problems += record.status.is_problem
                if reply.kind == "ok" and reply.data.get("ok") and record.status in _RAN:
                    summary.harness_s.append(record.harness_s)
                    summary.kernel_s.append(record.kernel_s)
                    summary.roundtrip_s.append(reply.wall_s)
                if record.status is Status.ERROR and config.device.startswith("cuda"):
                    client.kill()  # the CUDA context may be poisoned: the next request starts a fresh worker
                bar.update(task, advance=1, counts=_counts_text(summary.counts))
    finally:
        summary.worker_starts = client.starts
        client.close()
    return summary


def main_run(config: RunConfig) -> int:
    """Run and print the summary to stderr; the exit status of ``attnconf run``."""
    summary = run(config)
    print(summary.text(), file=sys.stderr)
    return summary.exit_code
