"""Fingerprints of tensors' bits: a kernel output's digest (records' ``extra["digest"]``, which ``compare`` uses to
tell identical numerics bit for bit) and a case context's fingerprint (the guard of
:func:`conformance.verdict.check.check_backend` against kernels that write into memory they were not given).

Integer arithmetic only, so the same bits give the same fingerprint on every device and in every reduction order;
each fingerprint is one host read per device (each read waits for the device, behind every other process sharing
it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from attnfast.base import KernelOutput

__all__ = ["context_fingerprint", "context_tensors", "digest_of", "fingerprints", "output_digest"]

#: ``output_digest``'s weights cycle with this period (a prime: a permutation of the bits changes the digest)
_DIGEST_PERIOD = 1_000_003
#: words per chunk of ``output_digest``
_DIGEST_CHUNK = 1 << 24


def output_digest(result: KernelOutput) -> str:
    """A fingerprint of the kernel's output and LSE bits, for telling identical outputs from equal error
    statistics (two kernels that both round right give the same max error with other bits).  Computed on the
    output's device with integer arithmetic only (the same on every device and reduction order): the bits as int16
    words ``v``, and ``sum(v)`` and ``sum(v * w)`` with weights ``w = i mod 1000003 + 1``, summed in chunks of
    2^24 words (each term is below 2^35, so a chunk cannot overflow int64; the chunks add up as Python integers,
    and a chunk's int64 temporaries stay at 128 MiB whatever the output's size).  Hex, ``out:lse`` (``-`` for no
    LSE)."""

    return digest_of(fingerprints({"out": result.out, "lse": result.lse}))


def digest_of(prints: dict[str, str]) -> str:
    """:func:`output_digest` from :func:`fingerprints` of ``{"out": ..., "lse": ...}`` (and maybe more names)."""
    return f"{prints['out']}:{prints['lse']}"


def _digest_parts(t: torch.Tensor) -> tuple[list[torch.Tensor], int]:
    """:func:`output_digest`'s chunk sums of ``t``, ``sum(v)`` and ``sum(v * w)`` for each chunk, as 0-d int64
    tensors not read yet, and the word count."""
    flat = t.detach().contiguous().view(-1)
    words = flat.view(torch.int16) if flat.element_size() % 2 == 0 else flat
    parts = []
    for start in range(0, words.numel(), _DIGEST_CHUNK):
        v = words[start : start + _DIGEST_CHUNK].to(torch.int64)
        w = torch.arange(start, start + v.numel(), device=v.device, dtype=torch.int64) % _DIGEST_PERIOD + 1
        parts += [v.sum(), (v * w).sum()]
    return parts, words.numel()


def _digest_text(parts: list[int], numel: int) -> str:
    total, weighted = sum(parts[0::2]), sum(parts[1::2])
    return f"{total & (2**64 - 1):x}.{weighted & (2**64 - 1):x}.{numel}"


def context_tensors(ctx: Any) -> dict[str, torch.Tensor]:
    """Every tensor of the context (a :class:`~conformance.verdict.check.CaseContext`) a backend must not change,
    by a dotted name: the inputs (the backends get clones), the reference and the baseline (nested dataclasses,
    named tuples, tuples, lists and dicts, two levels deep)."""
    found: dict[str, torch.Tensor] = {}

    def walk(name: str, x: Any, depth: int) -> None:
        if isinstance(x, torch.Tensor):
            found[name] = x
        elif depth >= 3:
            return
        elif dataclasses.is_dataclass(x) and not isinstance(x, type):
            for f in dataclasses.fields(x):
                if f.name != "case":
                    walk(f"{name}.{f.name}", getattr(x, f.name), depth + 1)
        elif isinstance(x, tuple) and hasattr(x, "_fields"):  # a named tuple (attnref's AttnResult)
            for field_name, item in zip(x._fields, x):
                walk(f"{name}.{field_name}", item, depth + 1)
        elif isinstance(x, (tuple, list)):
            for i, item in enumerate(x):
                walk(f"{name}[{i}]", item, depth + 1)
        elif isinstance(x, dict):
            for k, item in x.items():
                walk(f"{name}[{k!r}]", item, depth + 1)

    walk("inputs", ctx.inputs, 0)
    walk("ref", ctx.ref, 0)
    walk("base", ctx.base, 0)
    return found


def context_fingerprint(ctx: Any) -> dict[str, str]:
    """The :func:`output_digest` of every tensor of the context (:func:`context_tensors`), by name, in one host
    read per device."""
    return fingerprints(context_tensors(ctx))


def fingerprints(tensors: Mapping[str, torch.Tensor | None]) -> dict[str, str]:
    """Each tensor's digest text by name (``-`` for None), in one host read per device: the chunks' int64 sums of
    every tensor stacked, then added up per tensor in Python."""
    by_device: dict[torch.device, list[tuple[str, list[torch.Tensor], int]]] = {}
    out: dict[str, str] = {}
    for name, t in tensors.items():
        if t is None:
            out[name] = "-"
            continue
        parts, numel = _digest_parts(t)
        by_device.setdefault(t.device, []).append((name, parts, numel))
    for rows in by_device.values():
        values = _read_ints([p for _, parts, _ in rows for p in parts])
        at = 0
        for name, parts, numel in rows:
            out[name] = _digest_text(values[at : at + len(parts)], numel)
            at += len(parts)
    return out


def _read_ints(parts: list[torch.Tensor]) -> list[int]:
    return torch.stack(parts).tolist() if parts else []
