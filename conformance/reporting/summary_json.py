"""Writing the ``--json`` summaries of ``attnconf compare`` and ``attnconf report``: strict JSON (a
non-finite number becomes the string ``"inf"``, ``"-inf"`` or ``"nan"``, so any JSON parser reads it), to a
file or, for ``-``, to stdout.  Each carries the key ``"attnconf_output": KIND`` (``compare-summary``,
``report-summary``), the marker by which :mod:`conformance.outputs` replaces an earlier summary of that kind and
keeps any other file at the path as a numbered backup; a file is written as that module writes (atomic, exit 3 on
a write error)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from conformance.outputs import Output, write_bytes

__all__ = ["dumps", "summary_output", "write_summary"]


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def dumps(summary: dict[str, Any], kind: str | None = None) -> str:
    """``summary`` as strict JSON text, with ``"attnconf_output": kind`` when ``kind`` is given."""
    if kind is not None:
        summary = {"attnconf_output": kind, **summary}
    return json.dumps(_finite(summary), indent=1, sort_keys=True, allow_nan=False) + "\n"


def summary_output(summary: dict[str, Any], dest: Path | str, kind: str, flag: str = "--json") -> Output:
    """The summary as one :class:`conformance.outputs.Output` (for ``write_many`` with a command's other outputs)."""
    return Output(Path(dest), dumps(summary, kind).encode("utf-8"), kind, flag)


def write_summary(summary: dict[str, Any], dest: Path | str, kind: str, flag: str = "--json") -> None:
    """``dest`` ``-``: stdout; else the file (its directory made; :func:`conformance.outputs.write_bytes`)."""
    if str(dest) == "-":
        sys.stdout.write(dumps(summary, kind))
        return
    out = summary_output(summary, dest, kind, flag)
    write_bytes(out.path, out.data, kind=kind, flag=flag)
