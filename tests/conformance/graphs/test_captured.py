"""The capture / replay / compare loop every graph path shares (``conformance.graphs.captured``), on CPU.

* the own eager call cuts every per-row input to the live batch: MLA's ``qv`` too (a bucket-sized ``qv`` beside
  the live ``q`` was the bug), ``k_new``/``v_new``, the lengths, the block table;
* a replay records ``vs_eager`` / ``vs_plain`` and reports a broken comparison in ``problems`` (``vs_plain`` only
  under a pinned split count); ``summary`` is the record's ``extra["graph"]``.
"""

from __future__ import annotations

import pytest
import torch

from attnfast.base import KernelOutput
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import make_inputs
from conformance.graphs.buffers import GraphBuffers
from conformance.graphs.captured import NO_CAPTURE, CapturedCall, own_inputs
from tests.conformance.graphs.graph_fakes import GraphExact

MLA = dict(num_heads=4, num_kv_heads=1, head_dim=16, head_dim_v=32, qv=True, dtype="fp32", causal=True)
REQS = ((1, 20), (1, 5), (1, 33), (1, 9))  # a capture batch of 3, then one request alone


def _mla_bucket():
    case = AttentionCase(REQS, **MLA, kv_layout="NHD", block_size=8, graph=(3, 1))
    inputs = make_inputs(case, seed=0, device="cpu")
    buffers = GraphBuffers.allocate(case, inputs, 0)
    return case, inputs, buffers


def test_own_call_cuts_qv_to_the_live_batch():
    case, inputs, buffers = _mla_bucket()
    call = buffers.bucket.call_case(case)
    buffers.write(case, inputs, [3])  # one live request in a bucket of 3: two padded rows
    own = own_inputs(call, buffers.inputs, [case.requests[3]])
    assert own.qv is not None and own.qv.shape[0] == own.q.shape[0] == 1
    assert own.block_table is not None and own.block_table.shape[0] == own.seqlens_k.shape[0] == 1
    assert own.case.requests == (case.requests[3],) and own.cu_seqlens_k.tolist() == [0, 9]
    notes: list[str] = []
    captured = CapturedCall.kernel(GraphExact(), "cpu", call, buffers.inputs, notes)
    got, vs_eager, vs_plain = captured.replay([case.requests[3]])
    assert vs_eager.equal and vs_plain.equal and got.out.shape == (1, 4, 32)
    assert notes == [NO_CAPTURE] and captured.problems == []


def test_own_call_cuts_appended_keys_and_contiguous_keys():
    case = AttentionCase(((2, 5), (2, 7), (2, 4)), num_heads=2, num_kv_heads=2, head_dim=16, dtype="fp32")
    inputs = make_inputs(case, seed=0, device="cpu")
    k_new = torch.zeros(6, 2, 16)
    own = own_inputs(case, inputs.__class__(**{**vars(inputs), "k_new": k_new, "v_new": k_new}), [(2, 5), (2, 7)])
    assert own.q.shape[0] == own.k_new.shape[0] == own.v_new.shape[0] == 4 and own.k.shape[0] == 12
    with pytest.raises(ValueError, match="^quant: "):
        own_inputs(case, inputs.__class__(**{**vars(inputs), "quant": object()}), [(2, 5)])


class _Counter:
    """A forward whose every call returns a fresh value (the eager call differs from the replay)."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> KernelOutput:
        self.n += 1
        return KernelOutput(torch.full((2, 1, 1), float(self.n)), None)


def test_replays_are_recorded_and_broken_comparisons_reported():
    own = lambda requests: KernelOutput(torch.zeros(2, 1, 1), None)  # noqa: E731
    counter = _Counter()
    loose = CapturedCall(lambda: counter, own, "cpu")
    loose.replay([(1, 3), (1, 4)])
    assert loose.replays[0]["requests"] == 2 and not loose.replays[0]["vs_eager"]["equal"]
    assert loose.problems == [
        "graph: replay 0 (2 requests) differs from the same call run eagerly on the same buffers: 2 of 2 rows differ, "
        "max |diff| 1"
    ]
    pinned = CapturedCall(lambda: counter, own, "cpu", pinned=1, what="calls")
    pinned.replay([(1, 3), (1, 4)], "2 of bs=4 requests")
    want = "graph vs eager: replay 0 (2 of bs=4 requests) with num_splits pinned to 1 differs from the batch's own"
    assert any(p.startswith(want) and "eager calls: 2 of 2 rows differ" in p for p in pinned.problems)
    summary = pinned.summary({"batch": 4}, engine_level=True)
    assert summary["promised"] and not summary["graph_vs_eager_kept"] and summary["engine_level"]
    assert not summary["captured"] and summary["replays"] is pinned.replays
