"""Promises of conformance.verdict.fingerprint that mutmut found unchecked (docs "Mutation testing").

:func:`context_tensors` names every tensor of a context the guard watches: through dataclasses (never a ``case``
field), named tuples, tuples, lists and dicts, with a dotted or indexed name, and no deeper than three steps from
``inputs``, ``ref`` or ``base`` (a container three steps down is not opened), whichever kind of container each step
is.

The digests come out the same however a tensor is cut, so the cuts are checked on their own, with a period and a
chunk of a few words: a tensor is cut into whole periods (as many as a chunk holds, at least one) or stretches
within one period of at most a chunk; small tensors of 2-byte words or wider (up to ``_SMALL`` words) are packed in
order into groups of at most one period of words; the weights are made once per device and period, on that device.
"""

from __future__ import annotations

import dataclasses
import types
from collections import namedtuple
from typing import Any

import pytest
import torch

from conformance.verdict import fingerprint
from conformance.verdict.fingerprint import context_tensors, fingerprints_pending
from tests.conformance.verdict.test_hostread import _oracle

NT = namedtuple("NT", ["x", "y"])


@dataclasses.dataclass
class D:
    a: Any = None
    b: Any = None
    case: Any = None


def _t(i: int) -> torch.Tensor:
    return torch.full((2,), float(i))


def test_context_tensors_names_every_tensor_three_steps_deep_through_every_container() -> None:
    ctx = types.SimpleNamespace(
        # dataclasses, and dicts under one: three steps reach a tensor, a fourth is not taken
        inputs=D(
            a=D(a=D(a=_t(1), b=D(a=_t(90))), case=D(a=_t(91))),
            b={"k": {"k": _t(2), "j": {"k": _t(92)}}},
            case=_t(93),  # a case field is not a tensor of the context, whatever it holds
        ),
        ref=NT(x=NT(x=NT(x=_t(3), y=NT(x=_t(94), y=None)), y=None), y=_t(4)),  # named tuples
        base=[[[_t(5), [_t(95)]]], (_t(6), None)],  # lists and tuples
    )
    got = context_tensors(ctx)
    assert sorted(got) == sorted(
        [
            "inputs.a.a.a",
            "inputs.b['k']['k']",
            "ref.x.x.x",
            "ref.y",
            "base[0][0][0]",
            "base[1][0]",
        ]
    )
    assert got["inputs.a.a.a"] is ctx.inputs.a.a.a and got["base[1][0]"] is ctx.base[1][0]
    assert all(float(t[0]) < 90 for t in got.values())  # none of the planted ones past the limit or in a case


def test_the_weights_are_made_once_per_device_and_on_it() -> None:
    cpu = fingerprint._weights(torch.device("cpu"))
    assert fingerprint._weights(torch.device("cpu")) is cpu
    assert cpu.dtype == torch.int64 and cpu.shape == (2, fingerprint._DIGEST_PERIOD)
    assert cpu[1, :3].tolist() == [1, 2, 3] and cpu[0, :3].tolist() == [1, 1, 1]
    assert fingerprint._weights(torch.device("meta")).device.type == "meta"


def _words_of(n: int) -> torch.Tensor:
    return torch.arange(1, n + 1, dtype=torch.int16)  # n 2-byte words


@pytest.mark.parametrize(
    "period, chunk, n, lengths",
    [
        (7, 16, 40, [14, 14, 7, 5]),  # two periods a piece (16 // 7), then one, then the rest
        (7, 16, 7, [7]),
        (7, 3, 7, [7]),  # a chunk below a period: still one whole period a piece
        (7, 3, 10, [7, 3]),
        (7, 3, 5, [3, 2]),  # below a period: stretches of at most a chunk
        (7, 4, 20, [7, 7, 4, 2]),
        (7, 1, 3, [1, 1, 1]),  # a chunk of one word
        (7, 1, 8, [7, 1]),
    ],
)
def test_digest_parts_cut_as_documented(monkeypatch, period: int, chunk: int, n: int, lengths: list[int]) -> None:
    monkeypatch.setattr(fingerprint, "_DIGEST_PERIOD", period)
    monkeypatch.setattr(fingerprint, "_DIGEST_CHUNK", chunk)
    cut: list[int] = []
    real = fingerprint._int64

    def spy(words: torch.Tensor) -> torch.Tensor:
        cut.append(words.numel())
        return real(words)

    monkeypatch.setattr(fingerprint, "_int64", spy)
    t = _words_of(n)
    parts, numel = fingerprint._digest_parts(t)
    assert cut == lengths and len(parts) == len(lengths) and numel == n
    assert fingerprint._digest_text([int(x) for p in parts for x in p], n) == _oracle(t)


def test_small_tensors_are_packed_in_order_into_groups_of_one_period(monkeypatch) -> None:
    monkeypatch.setattr(fingerprint, "_DIGEST_PERIOD", 10)
    monkeypatch.setattr(fingerprint, "_SMALL", 4)
    groups: list[list[int]] = []
    real = fingerprint._small_group

    def spy(tensors: list[torch.Tensor]) -> Any:
        groups.append([fingerprint._words(t) for t in tensors])
        return real(tensors)

    monkeypatch.setattr(fingerprint, "_small_group", spy)
    tensors = {
        "a": _words_of(4),  # exactly _SMALL words: small
        "big": _words_of(5),  # past _SMALL: a piece of its own
        "b": torch.arange(2, dtype=torch.float32) + 0.5,  # 4-byte values: 4 words
        "c": _words_of(2),
        "bytes": torch.arange(3, dtype=torch.int8),  # 1-byte values: never small
        "d": _words_of(3),
        "none": None,
    }
    pending = fingerprints_pending(tensors)
    assert groups == [[4, 4, 2], [3]]  # 4 + 4 + 2 = one period; d starts the next group
    assert len(pending.values) == 2 + 2  # the two groups' ends, and one piece each for big and bytes
    got = pending.read()
    assert got == {name: ("-" if t is None else _oracle(t)) for name, t in tensors.items()}
