"""The results file of ``attnconf run``: what a sweep is (its header's ``sweep``), resume, backups.

**The sweep identity** (``Header.sweep``, written by every ``run`` since this field exists): what the records
of one file must share to be one sweep, and what ``attnconf compare`` checks before it compares::

    {"schema": 1,
     "suite": "smoke",                 # null when only --case-json cases ran
     "selection": {"case": [globs], "exclude": [globs], "feature": [["paged", "window"]],
                   "exclude_feature": [[...]], "case_json": "sha256 of the --case-json ids" | null,
                   "shard": [i, n] | null, "limit": n | null,
                   "model": [names]},  # only with --model (conformance.models)
     "cases": 136,                     # cases selected
     "case_ids_sha256": "...",         # sha256 of the selected case ids, one per line, in run order
     "seed": 0, "device": "cpu",
     "tol": [{...}, ...],              # the resolved tolerance overrides, lowest layer first: the --tol-file
                                       # tables, then each --tol (conformance.verdict.tolerance mappings); [] = defaults
     "tol_args": {"tol": ["factor=3"], "tol_file": "path" | null}}   # as typed (not compared)

``--resume`` refuses (:class:`UsageError`, exit 2) a file any of whose headers differs from the new run in one
of :data:`RESUME_KEYS`, naming the file and the first differing field.  A header written before ``sweep``
existed is checked on what it recorded (suite, ``env.run``'s seed, device, shard, tol and tol_file).  Before
that, :func:`read_for_resume` reads the whole file strictly and refuses what a resumed run must not extend
(unreadable, a pair twice, a newer writer's, garbled lines unless allowed); :func:`repair_tail` then drops a
killed writer's cut tail, so the appended records (plain lines, or gzip members for a gzipped file:
:class:`conformance.results_writer.Appender`) start clean.  All of it under the file's lock (:mod:`conformance.lock`).

**No run deletes earlier results**: without ``--resume`` an existing file moves to the first free numbered
backup ``NAME.1.jsonl``, ``NAME.2.jsonl``, ... (``NAME.1.jsonl.gz`` for a gzipped one; :func:`backup_path`, the
one backup scheme of every output, :mod:`conformance.outputs`: the highest number is the newest, no backup is ever
overwritten).  The path is checked before any worker starts (:func:`check_writable`): a directory, a device node,
a FIFO or socket, or one of the run's own inputs is refused (exit 2), an unwritable directory or read-only file
is exit 3.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from conformance.exits import UsageError
from conformance.outputs import backup_path, check_output, move_aside
from conformance.records import Header, SCHEMA
from conformance.results_file import refuse_duplicates, ResultsFile, ResultsFileError, scan_results

__all__ = [
    "RESUME_KEYS",
    "SWEEP_SCHEMA",
    "backup_path",
    "check_resume",
    "check_writable",
    "move_aside",
    "read_for_resume",
    "repair_tail",
    "sweep",
]

SWEEP_SCHEMA = 1
#: The fields of ``Header.sweep`` a resumed file must share with the new run.
RESUME_KEYS = ("suite", "selection", "cases", "case_ids_sha256", "seed", "device", "tol")


def _sha(ids: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(ids).encode()).hexdigest()


def sweep(
    *,
    suite: str | None,
    cases: Sequence[Any],
    json_ids: Sequence[str] | None,
    patterns: Sequence[str] = (),
    exclude: Sequence[str] = (),
    features: Sequence[Sequence[str]] = (),
    exclude_features: Sequence[Sequence[str]] = (),
    models: Sequence[str] = (),
    shard: tuple[int, int] | None = None,
    limit: int | None = None,
    seed: int = 0,
    device: str = "cpu",
    tol: Sequence[dict[str, Any]] = (),
    tol_args: Sequence[str] = (),
    tol_file: str | None = None,
) -> dict[str, Any]:
    """The header's ``sweep``: see the module docstring.  ``features`` are parsed groups (sorted names)."""
    return {
        "schema": SWEEP_SCHEMA,
        "suite": suite,
        "selection": {
            "case": list(patterns),
            "exclude": list(exclude),
            "feature": [list(g) for g in features],
            "exclude_feature": [list(g) for g in exclude_features],
            **({"model": list(models)} if models else {}),
            "case_json": None if json_ids is None else _sha(sorted(json_ids)),
            "shard": list(shard) if shard else None,
            "limit": limit,
        },
        "cases": len(cases),
        "case_ids_sha256": _sha([c.id for c in cases]),
        "seed": seed,
        "device": device,
        "tol": [dict(layer) for layer in tol],
        "tol_args": {"tol": list(tol_args), "tol_file": tol_file},
    }


def _legacy(h: Header) -> dict[str, Any]:
    """What a header from before ``sweep`` says about its sweep, in ``sweep``'s terms (as far as it can)."""
    run = h.run_options
    out: dict[str, Any] = {"suite": None if h.suite == "custom" else h.suite}
    for key in ("seed", "device"):
        if key in run:
            out[key] = run[key]
    if "shard" in run:
        out["selection.shard"] = run["shard"]
    if "tol" in run or "tol_file" in run:
        out["tol_args"] = {"tol": list(run.get("tol") or []), "tol_file": run.get("tol_file")}
    return out


def _flat(d: dict[str, Any], keys: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in keys:
        if key not in d:
            continue
        if key == "selection" and isinstance(d[key], dict):
            out.update({f"selection.{k}": v for k, v in d[key].items()})
        else:
            out[key] = d[key]
    return out


def _same(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)  # lists vs tuples, inf alike


def check_resume(path: Path, headers: Sequence[Header], new: dict[str, Any], has_records: bool) -> None:
    """Refuse (:class:`UsageError`) to resume ``path`` when a header's sweep differs from ``new``, or when it is
    not empty (``has_records``) yet has no header."""
    if not headers:
        if has_records:
            raise UsageError(f"--resume: {path} has no header line: not a results file of attnconf run")
        return
    now = {**_flat(new, RESUME_KEYS), "tol_args": new.get("tol_args")}
    for i, h in enumerate(headers, 1):
        recorded = h.sweep
        then = _flat(recorded, RESUME_KEYS) if recorded else _legacy(h)
        for key, value in then.items():
            if key in now and not _same(value, now[key]):
                raise UsageError(
                    f"--resume: {path} (header {i} of {len(headers)}) was run with {key}={_show(value)}, "
                    f"this run has {key}={_show(now[key])}; run without --resume (the file is kept as a numbered "
                    "backup) or with the same options"
                )


def _show(value: Any) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 120 else text[:117] + "..."


def check_writable(path: Path, flag: str = "--out", inputs: Iterable[Path | str] = ()) -> None:
    """Refuse ``path`` as the results file before any worker starts: :func:`conformance.outputs.check_output`
    (a directory, device node, FIFO, socket or one of ``inputs``: exit 2; an unwritable directory or read-only
    file: exit 3)."""
    check_output(path, flag, inputs)


def read_for_resume(path: Path, *, allow_skipped: bool = False, flag: str = "--resume") -> ResultsFile | None:
    """The file a resumed run continues, read whole and checked before anything is touched; None when it is
    absent or empty.  :class:`UsageError` (exit 2, one line naming the file) when it cannot be read (a line longer
    than :data:`conformance.results_file.MAX_LINE`, text that is not UTF-8, corrupt gzip data, plain text after gzip
    data), was written by a newer attnconf (appending to a format this version does not know could break it),
    records a (case, backend) pair twice, or holds lines that are not records other than a killed writer's cut
    tail (unless ``allow_skipped``: they are kept, and the pairs they might have held run again).  The cut tail
    (a last line without its newline that is not JSON, or a cut last gzip member) is reported by the reader and
    removed by :func:`repair_tail`.  The caller holds the file's lock (:mod:`conformance.lock`)."""
    try:
        if not path.exists() or path.stat().st_size == 0:
            return None
        f = scan_results(path)
    except OSError as exc:
        raise UsageError(f"{flag}: {path}: cannot be read: {exc.strerror or exc}") from None
    except ResultsFileError as exc:
        raise UsageError(f"{flag}: {exc}") from None
    if f.newer:
        raise UsageError(
            f"{flag}: {path}: written by a newer attnconf (schema {f.schema} > {SCHEMA}); resume it with that "
            "version, or run without --resume (the file is kept as a numbered backup)"
        )
    garbled = f.skipped[:-1] if f.cut_tail else f.skipped
    if garbled and not allow_skipped:
        n = len(garbled)
        listed = "; ".join(str(s) for s in garbled[:3]) + (f"; +{n - 3} more" if n > 3 else "")
        lines = "1 line is" if n == 1 else f"{n} lines are"
        raise UsageError(
            f"{flag}: {path}: {lines} not a record ({listed}); pass --allow-skipped to keep "
            f"{'it' if n == 1 else 'them'} and run the pairs the file lacks"
        )
    try:
        return refuse_duplicates(f)
    except ResultsFileError as exc:
        raise UsageError(
            f"{flag}: {exc.path}: {exc.reason.split('; pass --drop-duplicates')[0]}; resuming would not repair it: "
            "readers take it with --drop-duplicates (the last record of each pair), and a run without --resume starts "
            "a clean file (this one is kept as a numbered backup)"
        ) from None


def repair_tail(path: Path, scanned: ResultsFile | None = None) -> None:
    """Make the file ready for appending: cut off a killed writer's cut tail (a last line without its newline that
    is not JSON, a cut last gzip member, zero padding after the last member), and give a last line that lacks only
    its newline one (a plain newline, or a gzip member holding one).  ``scanned``: the file as
    :func:`conformance.results_file.scan_results` read it (read again when None)."""
    if not path.exists() or path.stat().st_size == 0:
        return
    f = scanned if scanned is not None else scan_results(path)
    with open(path, "r+b") as fh:
        if f.keep < fh.seek(0, os.SEEK_END):
            fh.truncate(f.keep)
        if f.needs_newline:  # only with a kept last line (scan_results): an emptied file stays empty
            fh.seek(0, os.SEEK_END)
            fh.write(gzip.compress(b"\n", mtime=0) if f.gzip else b"\n")
        fh.flush()
        os.fsync(fh.fileno())
