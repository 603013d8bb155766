"""Fingerprints of tensors' bits: a kernel output's digest (records' ``extra["digest"]``, which ``compare`` uses to
tell identical numerics bit for bit) and a case context's fingerprint (the guard of
:func:`conformance.verdict.check.check_backend` against kernels that write into memory they were not given).

Integer arithmetic only, so the same bits give the same fingerprint on every device and in every reduction order;
each fingerprint is one host read per device (each read waits for the device, behind every other process sharing
it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch

from attnfast.base import KernelOutput

from conformance.verdict.hostread import Pending

__all__ = [
    "context_fingerprint",
    "context_tensors",
    "digest_of",
    "fingerprints",
    "fingerprints_pending",
    "output_digest",
]

#: ``output_digest``'s weights cycle with this period (a prime: a permutation of the bits changes the digest)
_DIGEST_PERIOD = 1_000_003
#: words per chunk of ``output_digest``
_DIGEST_CHUNK = 1 << 24


def output_digest(result: KernelOutput) -> str:
    """A fingerprint of the kernel's output and LSE bits, for telling identical outputs from equal error
    statistics (two kernels that both round right give the same max error with other bits).  Computed on the
    output's device with integer arithmetic only (the same on every device and reduction order): the bits as int16
    words ``v``, and ``sum(v)`` and ``sum(v * w)`` with weights ``w = i mod 1000003 + 1``, summed in pieces of
    at most 2^24 words (whole periods, or a stretch within one: each term is below 2^36, so a piece cannot overflow
    int64; the pieces add up as Python integers, and a piece's int64 temporaries stay at 256 MiB whatever the
    output's size; :func:`_digest_parts`).  Hex, ``out:lse`` (``-`` for no
    LSE)."""

    return digest_of(fingerprints({"out": result.out, "lse": result.lse}))


def digest_of(prints: dict[str, str]) -> str:
    """:func:`output_digest` from :func:`fingerprints` of ``{"out": ..., "lse": ...}`` (and maybe more names)."""
    return f"{prints['out']}:{prints['lse']}"


def _weights(device: torch.device) -> torch.Tensor:
    """``(2, _DIGEST_PERIOD)`` int64 on ``device``: ones, and the weights ``i + 1`` of one period (16 MB, made once
    per device and period): every chunk's weights are a slice of it, so a digest builds none."""
    key = (device, _DIGEST_PERIOD)
    w = _WEIGHTS.get(key)
    if w is None:
        w = torch.stack(
            [torch.ones(_DIGEST_PERIOD, dtype=torch.int64), torch.arange(1, _DIGEST_PERIOD + 1)]  # int64 both
        ).to(device)
        _WEIGHTS[key] = w
    return w


_WEIGHTS: dict[tuple[torch.device, int], torch.Tensor] = {}


def _digest_parts(t: torch.Tensor) -> tuple[list[torch.Tensor], int]:
    """:func:`output_digest`'s sums of ``t`` as int64 pairs ``[sum(v), sum(v * w)]`` of its pieces, not read yet,
    and the word count.  A piece is whole periods of the weights (a ``(rows, period)`` view, each row weighted by
    the same period) or a stretch within one period, at most ``_DIGEST_CHUNK`` words when that is a period or more:
    two launches a piece (the product with the cached weights, then its sum), one piece for a tensor below a
    period (1,000,003 words); the words of a 2-byte or wider dtype are promoted to int64 inside the product."""
    flat = t.detach().contiguous().view(-1)
    words = flat.view(torch.int16) if flat.element_size() % 2 == 0 else flat
    n = words.numel()
    weights = _weights(words.device)
    period = _DIGEST_PERIOD
    parts = []
    start = 0
    while start < n:
        off = start % period
        if off == 0 and n - start >= period:
            rows = min((n - start) // period, max(1, _DIGEST_CHUNK // period))
            piece = _int64(words[start : start + rows * period]).view(rows, period)
            parts.append((piece[None] * weights[:, None, :]).sum(dim=(1, 2)))
            start += rows * period
        else:
            # a stretch is the tail (below a period, from a period's start) or the rest of that tail: it never
            # crosses a period's end, so its weights are one slice of the period
            length = min(n - start, max(1, _DIGEST_CHUNK))
            piece = _int64(words[start : start + length])
            parts.append((piece[None] * weights[:, off : off + length]).sum(dim=1))
            start += length
    return parts, n


def _int64(words: torch.Tensor) -> torch.Tensor:
    """``words`` as they enter the product: int16 words as they are (the product promotes them), a 1-byte dtype's
    values converted (as the digest has always read them)."""
    return words if words.dtype == torch.int16 else words.to(torch.int64)


def _digest_text(parts: list[int], numel: int) -> str:
    total, weighted = sum(parts[0::2]), sum(parts[1::2])
    return f"{total & (2**64 - 1):x}.{weighted & (2**64 - 1):x}.{numel}"


def context_tensors(ctx: Any) -> dict[str, torch.Tensor]:
    """Every tensor of the context (a :class:`~conformance.verdict.check.CaseContext`) a backend must not change,
    by a dotted name: the inputs (the backends get clones), the reference and the baseline (nested dataclasses,
    named tuples, tuples, lists and dicts; a container three steps down is not opened)."""
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
    """Each tensor's digest text by name (``-`` for None), in one host read per device: the pieces' int64 sums of
    every tensor together, then added up per tensor in Python."""
    return fingerprints_pending(tensors).read()


def fingerprints_pending(tensors: Mapping[str, torch.Tensor | None]) -> Pending[dict[str, str]]:
    """:func:`fingerprints` as int64 tensors not read yet (``ints``: read them with others in one host read).

    The small tensors of 2-byte words or wider (up to :data:`_SMALL` words each) of one device are digested
    together, in four launches whatever their number (:func:`_small_group`); every other tensor in two a piece
    (:func:`_digest_parts`)."""
    out: dict[str, str] = {}
    values: list[torch.Tensor] = []
    readers: list[Callable[[list[int], int], int]] = []
    groups: dict[torch.device, list[tuple[str, torch.Tensor]]] = {}
    for name, t in tensors.items():
        if t is None:
            out[name] = "-"
        elif t.numel() == 0:
            out[name] = _digest_text([], 0)
        elif t.element_size() % 2 == 0 and _words(t) <= min(_SMALL, _DIGEST_PERIOD):
            groups.setdefault(t.device, []).append((name, t))
        else:
            parts, numel = _digest_parts(t)
            values += parts

            def whole(read: list[int], name: str = name, numel: int = numel) -> None:
                out[name] = _digest_text(read, numel)

            readers.append(_reader(whole, 2 * len(parts)))
    for members in groups.values():
        while members:  # groups of at most one period of words: one period of weights weighs them all
            batch, words = [], 0
            while members and words + _words(members[0][1]) <= _DIGEST_PERIOD:
                words += _words(members[0][1])
                batch.append(members.pop(0))
            ends, sizes = _small_group([t for _, t in batch])
            values.append(ends)

            def grouped(read: list[int], names: list[str] = [n for n, _ in batch], sizes: list[int] = sizes) -> None:
                start = prev0 = prev1 = 0
                for i, (name, n) in enumerate(zip(names, sizes)):
                    c0, c1 = read[2 * i], read[2 * i + 1]
                    total, weighted = c0 - prev0, (c1 - prev1) - start * (c0 - prev0)
                    out[name] = _digest_text([total, weighted], n)
                    start, prev0, prev1 = start + n, c0, c1

            readers.append(_reader(grouped, 2 * len(batch)))

    def finish(read: list[int]) -> dict[str, str]:
        at = 0
        for reader in readers:
            at = reader(read, at)
        return {name: out[name] for name in tensors}

    return Pending(values, finish, ints=True)


#: the most words of a tensor digested in a group of small tensors (:func:`fingerprints_pending`)
_SMALL = 1 << 16


def _words(t: torch.Tensor) -> int:
    return t.numel() * t.element_size() // 2


def _reader(take: Callable[[list[int]], None], count: int) -> Callable[[list[int], int], int]:
    """A step of :func:`fingerprints_pending`'s finish: ``take`` the next ``count`` values read; the offset after."""

    def step(read: list[int], at: int) -> int:
        take(read[at : at + count])
        return at + count

    return step


def _small_group(tensors: list[torch.Tensor]) -> tuple[torch.Tensor, list[int]]:
    """The digests of small tensors of one device (2-byte words or wider, at most one period of words together) as one
    ``(len(tensors), 2)`` int64 tensor not read yet, and their word counts.  Their words laid end to end as ``v``
    and weighted by their position ``g`` in that row (``1..N``: no wrap, ``N`` is at most a period), row ``i`` holds
    the running sums ``sum(v)`` and ``sum(v * g)`` at tensor ``i``'s end: tensor ``i``, starting at word ``s``, has
    ``sum(v)`` the difference of two running sums and ``sum(v * (g - s))`` (its own weights, :func:`output_digest`'s)
    the difference of the weighted ones less ``s`` times that.  Four launches: the words' concatenation, the product
    with the cached weights, the running sums (below 2^56: no overflow), the ends stacked."""
    words = [t.detach().contiguous().view(-1).view(torch.int16) for t in tensors]
    row = torch.cat(words) if len(words) > 1 else words[0]
    sums = (row[None] * _weights(row.device)[:, : row.numel()]).cumsum(dim=1)
    ends, at = [], 0
    for w in words:
        at += w.numel()
        ends.append(sums[:, at - 1])
    return torch.stack(ends), [w.numel() for w in words]
