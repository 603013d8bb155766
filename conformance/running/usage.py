"""Usage errors and the checked numeric option types of ``attnconf run`` (and ``cases``).

A usage error is the user's to fix (a bad flag value, an unknown suite or backend, an empty selection, an
``--out`` that cannot be written): the command prints it as one line and exits 2, before any result is
touched.  The ``argparse`` types here name the constraint (``must be > 0, got 0``); argparse prefixes the flag.
"""

from __future__ import annotations

import argparse
import math
import sys

from conformance.exits import UsageError

__all__ = ["SEED_LIMIT", "UsageError", "device_and_backends", "positive_int", "positive_seconds", "seed_int"]


def positive_seconds(text: str) -> float:
    """A finite number of seconds > 0 (``--timeout``: 0 would time out every record)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0, got {text!r}")
    return value


def _int(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer {what}, got {text!r}") from None


def positive_int(text: str) -> int:
    """An integer >= 1 (``--limit``: 0 selects nothing)."""
    value = _int(text, ">= 1")
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


#: Seeds are below 2**32: ``make_inputs`` seeds a ``torch.Generator`` with ``seed * 1_000_003 + digest``,
#: which must fit its 64 bits.
SEED_LIMIT = 2**32


def seed_int(text: str) -> int:
    """An integer in [0, 2**32) (``--seed``)."""
    value = _int(text, f"in [0, {SEED_LIMIT})")
    if not 0 <= value < SEED_LIMIT:
        raise argparse.ArgumentTypeError(f"must be an integer in [0, {SEED_LIMIT}), got {text!r}")
    return value


def device_and_backends(command: str, device: str, backends: list[str] | None) -> tuple[str, list[str]]:
    """``--device`` with ``auto`` resolved (CUDA when present, else the CPU) and ``--backend`` defaulting to every
    installed backend that runs there, said on stderr (``attnconf COMMAND: device D, backends ...``); a
    :class:`UsageError` when none does."""
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    if backends:
        return device, list(backends)
    from attnfast.registry import runnable_names

    found = list(runnable_names(device))
    if not found:
        raise UsageError(f"no installed backend runs on {device}; name one with --backend")
    print(f"attnconf {command}: device {device}, backends {', '.join(found)}", file=sys.stderr)
    return device, found
