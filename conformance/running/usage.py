"""Usage errors and the checked numeric option types of ``attnconf run`` (and ``cases``).

A usage error is the user's to fix (a bad flag value, an unknown suite or backend, an empty selection, an
``--out`` that cannot be written): the command prints it as one line and exits 2, before any result is
touched.  The ``argparse`` types here name the constraint (``must be > 0, got 0``); argparse prefixes the flag.
"""

from __future__ import annotations

import argparse
import math
import re
import sys

from conformance.exits import UsageError

__all__ = [
    "DEVICE_SPELLINGS",
    "SEED_LIMIT",
    "UsageError",
    "check_device",
    "device_and_backends",
    "device_spec",
    "positive_int",
    "positive_seconds",
    "seed_int",
]


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


#: ``--device``: what a device may be spelled as (``cuda:N``: a non-negative index).
DEVICE_SPELLINGS = "auto, cpu, cuda or cuda:N (N >= 0)"
_DEVICE = re.compile(r"auto|cpu|cuda(:[0-9]+)?")


def device_spec(text: str) -> str:
    """``--device``: ``auto``, ``cpu``, ``cuda`` or ``cuda:N`` (checked against this machine by
    :func:`check_device`, after parsing: a recorded command line is re-read on other machines)."""
    if not _DEVICE.fullmatch(text):
        raise argparse.ArgumentTypeError(f"must be {DEVICE_SPELLINGS}, got {text!r}")
    return text


def _cuda_devices() -> int:
    """CUDA devices visible to this process, 0 without a usable CUDA runtime.  ``torch.cuda.is_available()`` and
    ``device_count()`` create no CUDA context, so the workers the run starts later are unaffected."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def check_device(device: str, flag: str = "--device") -> None:
    """A :class:`UsageError` when ``device`` (spelled as :func:`device_spec` allows) is not on this machine:
    ``cuda`` without a visible CUDA device, ``cuda:N`` with N at or past the number visible."""
    if not device.startswith("cuda"):
        return
    count = _cuda_devices()
    if count == 0:
        raise UsageError(f"{flag} {device}: no CUDA device is visible here (torch.cuda.is_available() is False)")
    index = int(device.partition(":")[2] or 0)
    if index >= count:
        raise UsageError(f"{flag} {device}: {count} CUDA device(s) visible here, cuda:0 to cuda:{count - 1}")


def device_and_backends(command: str, device: str, backends: list[str] | None) -> tuple[str, list[str]]:
    """``--device`` checked against this machine (:func:`check_device`) with ``auto`` resolved (CUDA when present,
    else the CPU), and ``--backend`` defaulting to every installed backend that runs there, said on stderr
    (``attnconf COMMAND: device D, backends ...``); a :class:`UsageError` when none does.  A named backend that
    does not run on the device is refused once a worker has described it
    (:func:`conformance.running.pairs._describe`)."""
    if not _DEVICE.fullmatch(device):
        raise UsageError(f"--device must be {DEVICE_SPELLINGS}, got {device!r}")
    if device == "auto":
        device = "cuda" if _cuda_devices() else "cpu"
    check_device(device)
    if backends:
        return device, list(backends)
    from attnfast.registry import runnable_names

    found = list(runnable_names(device))
    if not found:
        raise UsageError(f"no installed backend runs on {device}; name one with --backend")
    print(f"attnconf {command}: device {device}, backends {', '.join(found)}", file=sys.stderr)
    return device, found
