"""What a fuzz campaign keeps: its records in the JSONL file, what an earlier invocation left there, and the
example database of minimal cases.  The loop that produces them is :mod:`conformance.fuzz.campaign`.

The file has the same header and result records as ``attnconf run`` (:func:`write_header`; results fsync'ed as
they are known). Records carry ``extra["fuzz"]``:

* ``{"role": "original", "index": i, "seed": s, "skipped": {"rejected": r, "refused": f}}`` for every drawn
  case that ran (``skipped``: draws since the previous one that the case model rejected, or that every
  backend's declared refusals ruled out: those never reach the worker and cost no budget);
* ``{"role": "minimal", "original_id": ..., "original_index": i, "path": [moves], "shrink_steps": n,
  "tried": evaluations, "complete": bool, "group": {axis: level}, "label": "..."}`` for the minimal case of
  every failure (fail, error, crash, timeout; :mod:`conformance.fuzz.shrink`), recorded after the original;
* ``{"role": "replay"}`` for the minimal cases of earlier campaigns replayed from ``--db`` first.

Resume (:func:`read_prior`): draw ``i`` depends only on ``(seed, i, limits)``, so a resumed campaign takes the
cases of the indices already in the file from their records, checks only the (index, backend) pairs missing
there, finishes the shrinks that are missing or incomplete, and then continues the stream after the last
recorded index.  The file must come from ``attnconf fuzz`` with the same device, seed and draw limits.

``--db DIR`` (:func:`open_db`, :func:`db_key`, :func:`db_value`) is a Hypothesis example database
(:class:`hypothesis.database.DirectoryBasedExampleDatabase`, one key per backend): every complete minimal case is
saved there, the next campaign with the same ``--db`` replays them before drawing (still failing: recorded and
grouped; passing now: deleted, as Hypothesis does with examples that no longer fail). It is the one part of
Hypothesis's machinery that fits this loop as it is; why its strategies and shrinker do not is in
:mod:`conformance.fuzz.draw` and :mod:`conformance.fuzz.shrink`.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conformance.cases.case import AttentionCase
from conformance.fuzz.config import FuzzConfig
from conformance.fuzz.group import fuzz_role
from conformance.exits import UsageError
from conformance.records import CheckResult, Header
from conformance.results_writer import append_record
from conformance.running.outfile import read_for_resume, repair_tail

__all__ = ["Prior", "db_key", "db_value", "open_db", "read_prior", "with_fuzz", "write_header"]


def with_fuzz(record: CheckResult, info: dict[str, Any]) -> CheckResult:
    """``record`` with its ``extra["fuzz"]`` (see the module docstring)."""
    return dataclasses.replace(record, extra={**record.extra, "fuzz": info})


def db_key(backend: str) -> bytes:
    """The example database's key of one backend's minimal cases."""
    return f"attnconf-fuzz:{backend}".encode()


def db_value(case: AttentionCase) -> bytes:
    """A minimal case as the database stores it (its JSON, canonical)."""
    return json.dumps(case.to_json(), sort_keys=True, separators=(",", ":")).encode()


def open_db(path: Path):
    """The ``--db`` directory as a Hypothesis example database; :class:`UsageError` without hypothesis."""
    try:
        from hypothesis.database import DirectoryBasedExampleDatabase
    except ModuleNotFoundError:
        raise UsageError("--db needs hypothesis: pip install hypothesis (or 'attnconf[test]')") from None
    return DirectoryBasedExampleDatabase(str(path))


@dataclass
class Prior:
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


def read_prior(config: FuzzConfig) -> Prior:
    """What the file holds when ``--resume`` continues it; :class:`UsageError` when it is another campaign's."""
    prior = Prior()
    if not config.resume:
        return prior
    previous = read_for_resume(config.out, allow_skipped=config.allow_skipped)
    if previous is None:
        return prior
    headers, results = previous.headers, previous.results
    if results and not headers:
        raise UsageError(f"--resume: {config.out} has no header line: not a campaign file of attnconf fuzz")
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
    repair_tail(config.out, previous)
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


def write_header(config: FuzzConfig, env: dict[str, Any], infos: dict[str, dict[str, str]], recorded: int) -> None:
    """Append this invocation's header: the run options, the host, the backends and ``env["fuzz"]``."""
    run_info = {
        "device": config.device,
        "seed": config.seed,
        "timeout_s": config.timeout,
        "time": False,
        "tol": list(config.tol),
        "tol_file": config.tol_file,
        "resume": config.resume,
        "already_recorded": recorded,
    }
    append_record(
        config.out,
        Header(
            suite="fuzz",
            backends={infos[b]["name"]: infos[b] for b in config.backends},
            env={**env, "run": run_info, "fuzz": config.fuzz_info()},
            argv=list(config.argv),
            started=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        ),
    )
