"""Reading a verdict's numbers to the host in as few device waits as possible.

Every host read of a device tensor waits for the device, and on a GPU shared by many worker processes behind all of
them; the verdict therefore gathers what it needs (statistics, fingerprints) as tensors not read yet
(:class:`Pending`) and reads them together (:func:`read_host`: one read per device).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import torch

__all__ = ["Pending", "read_host"]

T = TypeVar("T")


@dataclass(frozen=True)
class Pending(Generic[T]):
    """Tensors not read yet (``values``) and what makes the answer of their values once read (``finish``): with
    ``ints`` False, 0-d tensors given to ``finish`` as Python floats, else integer tensors given as their elements'
    Python ints, in order, as :func:`read_host` reads them."""

    values: list[torch.Tensor]
    finish: Callable[[list[Any]], T]
    ints: bool = False

    def read(self) -> T:
        """The answer, after a read of its own."""
        floats, ints = read_host([], self.values) if self.ints else read_host(self.values, [])
        return self.finish(ints if self.ints else floats)


def read_host(floats: Sequence[torch.Tensor], ints: Sequence[torch.Tensor]) -> tuple[list[float], list[int]]:
    """``floats`` (0-d tensors of any real dtype) as Python floats, through float64: exact for every floating dtype up
    to float64, booleans and integers below 2^53; and the elements of ``ints`` (integer tensors, flattened and
    concatenated in order) as Python ints, exact.  One host read per device among them: each dtype's floats are
    stacked and widened together, their float64 bits ride with the integers as int64 words."""
    by_device: dict[torch.device, tuple[list[int], list[torch.Tensor]]] = {}
    for i, f in enumerate(floats):
        by_device.setdefault(f.device, ([], []))[0].append(i)
    for t in ints:
        by_device.setdefault(t.device, ([], []))[1].append(t)
    float_out: dict[int, float] = {}
    int_out: list[int] = []
    int_at: dict[torch.device, list[int]] = {}
    for device, (float_idx, int_ts) in by_device.items():
        by_dtype: dict[torch.dtype, list[int]] = {}
        for i in float_idx:
            by_dtype.setdefault(floats[i].dtype, []).append(i)
        order = [i for idx in by_dtype.values() for i in idx]
        words: list[torch.Tensor] = []
        for idx in by_dtype.values():
            stacked = torch.stack([floats[i] for i in idx])
            words.append(stacked.to(torch.float64).view(torch.int64))  # to() of float64 is the tensor itself
        words += [t.reshape(-1).to(torch.int64) for t in int_ts]
        values = torch.cat(words).tolist()  # a device is here for a float or an int tensor: words is not empty
        n = len(order)
        if n:
            for i, x in zip(order, struct.unpack(f"={n}d", struct.pack(f"={n}q", *values[:n]))):
                float_out[i] = x
        int_at[device] = values[n:]
    for t in ints:  # in the order given, whatever the devices
        rest = int_at[t.device]
        int_out += rest[: t.numel()]
        int_at[t.device] = rest[t.numel() :]
    return [float_out[i] for i in range(len(floats))], int_out
