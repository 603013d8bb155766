"""Lengths known on the host (:func:`conformance.cases.inputs.host_ints`): a check slices by the lengths the inputs
were drawn with, without reading them back from the device, and reads them again once they are written."""

from __future__ import annotations

import itertools

import pytest
import torch

from conformance.cases.case import AttentionCase
from conformance.cases.inputs import _to, clone_known, host_ints, make_inputs


def _case() -> AttentionCase:
    return AttentionCase(num_heads=4, num_kv_heads=2, head_dim=32, requests=((3, 7), (1, 9), (5, 5)), dtype="bf16")


def test_moved_lengths_are_known_without_a_read() -> None:
    inputs = make_inputs(_case())
    moved = _to(inputs, torch.device("meta"))  # a device whose tensors hold no data: any read raises
    assert moved.cu_seqlens_k.device.type == "meta"
    cu_k = [0, *itertools.accumulate((7, 9, 5))]
    assert host_ints(moved.cu_seqlens_k) == cu_k
    assert host_ints(moved.cu_seqlens_q) == [0, 3, 4, 9]
    assert host_ints(moved.seqlens_k) == [7, 9, 5]
    assert moved.k_of(1).shape[0] == 9 and moved.v_of(2).shape[0] == 5
    copy = clone_known(moved.cu_seqlens_k)  # a check's fresh copy of the inputs: the same lengths, known
    assert copy is not moved.cu_seqlens_k and host_ints(copy) == cu_k
    moved.cu_seqlens_k.add_(0)  # written in place (a graph buffer's next lengths): the host values are stale
    with pytest.raises(NotImplementedError, match="meta"):
        host_ints(moved.cu_seqlens_k)
    with pytest.raises(NotImplementedError, match="meta"):
        host_ints(moved.cu_seqlens_q[1:])  # another tensor (a view) is not known: read


def test_a_host_tensor_is_read_directly() -> None:
    t = torch.tensor([0, 2, 6], dtype=torch.int32)
    assert host_ints(t) == [0, 2, 6]
    t[2] = 8
    assert host_ints(t) == [0, 2, 8]
