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
existed is checked on what it recorded (suite, ``env.run``'s seed, device, shard, tol and tol_file).

**No run deletes earlier results**: without ``--resume`` an existing file moves to the first free numbered
backup ``NAME.1.jsonl``, ``NAME.2.jsonl``, ... (``NAME.1.jsonl.gz`` for a gzipped one; :func:`backup_path`, the
one backup scheme of every output, :mod:`conformance.outputs`: the highest number is the newest, no backup is ever
overwritten).  The path is checked before any worker starts (:func:`check_writable`): a directory, a device node,
a FIFO or socket, or one of the run's own inputs is refused (exit 2), an unwritable directory or read-only file
is exit 3.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from conformance.exits import UsageError
from conformance.outputs import backup_path, check_output, move_aside
from conformance.records import Header

__all__ = [
    "RESUME_KEYS",
    "SWEEP_SCHEMA",
    "backup_path",
    "check_resume",
    "check_writable",
    "move_aside",
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
        recorded = getattr(h, "sweep", None)
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
