"""Promises of conformance.verdict.fingerprint that mutmut found unchecked (docs "Mutation testing").

:func:`context_tensors` names every tensor of a context the guard watches: through dataclasses (never a ``case``
field), named tuples, tuples, lists and dicts, with a dotted or indexed name, and no deeper than three steps from
``inputs``, ``ref`` or ``base`` (a container three steps down is not opened), whichever kind of container each step
is."""

from __future__ import annotations

import dataclasses
import types
from collections import namedtuple
from typing import Any

import torch

from conformance.verdict.fingerprint import context_tensors

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
