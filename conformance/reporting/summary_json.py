"""Writing the ``--json`` summaries of ``attnconf compare`` and ``attnconf report``: strict JSON (a
non-finite number becomes the string ``"inf"``, ``"-inf"`` or ``"nan"``, so any JSON parser reads it), to a
file or, for ``-``, to stdout."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

__all__ = ["dumps", "write_summary"]


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def dumps(summary: dict[str, Any]) -> str:
    return json.dumps(_finite(summary), indent=1, sort_keys=True, allow_nan=False) + "\n"


def write_summary(summary: dict[str, Any], dest: Path | str) -> None:
    """``dest`` ``-``: stdout; else the file (its directory made)."""
    text = dumps(summary)
    if str(dest) == "-":
        sys.stdout.write(text)
        return
    path = Path(dest)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
