"""Usage errors and the checked numeric option types of every ``attnconf`` subcommand.

A usage error is the user's to fix (a bad flag value, an unknown suite or backend, an empty selection, an
``--out`` that cannot be written): the command prints it as one line and exits 2, before any result is
touched.  The ``argparse`` types here name the constraint (``must be a finite number > 0, got '0'``); argparse
prefixes the flag (``attnconf run: argument --timeout: ...``).  Every numeric option of every subcommand is one
of them, made by :func:`finite_float` or :func:`bounded_int`: a number is finite (``nan``, ``inf``, ``1e309``
are refused) and inside its range, or the command line is refused.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Callable

from conformance.exits import UsageError

__all__ = [
    "DEVICE_SPELLINGS",
    "MAX_SECONDS",
    "SEED_LIMIT",
    "UsageError",
    "bounded_int",
    "check_device",
    "device_and_backends",
    "device_spec",
    "finite_float",
    "positive_int",
    "positive_seconds",
    "seed_int",
]


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _range(low: float | None, high: float | None, low_open: bool, high_open: bool) -> str:
    """``in [0, 1)``, ``> 0``, ``<= 5``: the constraint as the error message says it."""
    if low is not None and high is not None:
        return f"in {'(' if low_open else '['}{_num(low)}, {_num(high)}{')' if high_open else ']'}"
    if low is not None:
        return f"{'>' if low_open else '>='} {_num(low)}"
    if high is not None:
        return f"{'<' if high_open else '<='} {_num(high)}"
    return ""


def finite_float(
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
    unit: str = "",
) -> Callable[[str], float]:
    """An ``argparse`` type: a finite number (``float`` syntax) in the range ``low``..``high`` (``low_open`` /
    ``high_open``: the bound itself excluded); the error names the constraint, e.g. ``must be a finite number of
    seconds > 0, got 'nan'``."""
    what = " ".join(
        x for x in ("a finite number", f"of {unit}" if unit else "", _range(low, high, low_open, high_open)) if x
    )

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text[:40]!r}") from None
        if (
            not math.isfinite(value)
            or (low is not None and (value <= low if low_open else value < low))
            or (high is not None and (value >= high if high_open else value > high))
        ):
            raise argparse.ArgumentTypeError(f"must be {what}, got {text[:40]!r}")
        return value

    return parse


def bounded_int(low: int | None = None, high: int | None = None, *, high_open: bool = False) -> Callable[[str], int]:
    """An ``argparse`` type: a whole number (``int`` syntax) in ``low``..``high`` (``high_open``: ``high``
    excluded); the error names the constraint, e.g. ``must be an integer in [0, 4294967296), got '-1'``."""
    what = " ".join(x for x in ("an integer", _range(low, high, False, high_open)) if x)

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:  # also a string of more than 4300 digits (sys.get_int_max_str_digits)
            raise argparse.ArgumentTypeError(f"must be {what}, got {text[:40]!r}") from None
        if (low is not None and value < low) or (high is not None and (value >= high if high_open else value > high)):
            raise argparse.ArgumentTypeError(f"must be {what}, got {text[:40]!r}")
        return value

    return parse


#: The longest ``--timeout`` (one week): longer is a hang, and a wait past ``threading.TIMEOUT_MAX`` (about 292
#: years) raises ``OverflowError`` in the middle of a run.
MAX_SECONDS = 7 * 24 * 3600.0

#: ``--timeout``: seconds per (case, backend), finite, > 0 (0 would time out every record), at most a week.
positive_seconds = finite_float(0, MAX_SECONDS, low_open=True, unit="seconds")

#: ``--limit``: an integer >= 1 (0 selects nothing).
positive_int = bounded_int(1)

#: Seeds are below 2**32: ``make_inputs`` seeds a ``torch.Generator`` with ``seed * 1_000_003 + digest``,
#: which must fit its 64 bits.
SEED_LIMIT = 2**32

#: ``--seed``: an integer in [0, 2**32).
seed_int = bounded_int(0, SEED_LIMIT, high_open=True)


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
    (:func:`conformance.running.pairs.describe_backends`)."""
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
