"""TOML reading on every supported Python: ``tomllib`` (3.11+) or the ``tomli`` backport, which the
project depends on for 3.10 (``pyproject.toml``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib as _toml
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as _toml

__all__ = ["load_toml_file", "TOMLDecodeError"]

TOMLDecodeError = _toml.TOMLDecodeError


def load_toml_file(path: str | Path) -> dict[str, Any]:
    with open(path, "rb") as fh:
        return _toml.load(fh)
