"""The ``neighbour`` invariance: request 0 beside a neighbour that grows by one token and by one tile.

A kernel that picks its tiles, GQA packing or split scheduler from the batch's longest request changes request
0's bits when an unrelated neighbour grows (vLLM issue #51902: 9 -> 10 prefill tokens); ``batch``'s variants
(alone, first, last, beside shorter requests) never grow the neighbour, so they cannot see it."""

from __future__ import annotations

import pytest
import torch

from attnfast.base import KernelOutput
from attnfast.registry import get_backend
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import make_inputs
from conformance.graphs.assemble import assemble
from conformance.graphs.invariance import NEIGHBOUR_QUERIES, variants
from conformance.graphs.suite import TEMPLATE_HEAD_DIMS, graphs_suite, neighbour_cases, small_cases
from conformance.records import Status
from conformance.verdict.check import check_backend, prepare_context
from tests.conformance.graphs.graph_fakes import GraphExact

GQA = dict(num_heads=4, num_kv_heads=2, head_dim=16, dtype="fp32", causal=True, kv_layout="NHD", block_size=8)


def verdict(case: AttentionCase, backend):
    return check_backend(prepare_context(case, 0, "cpu"), backend)


class TileByLongestQuery(GraphExact):
    """Planted: the kernel picks its tile from the batch's longest request; from ``threshold`` query tokens on,
    every row is accumulated in another order (the last bit of the output moves), as in vLLM #51902."""

    name = "fake-tile-by-longest-query"
    threshold = 10

    def prepare(self, case, inputs):
        run = super().prepare(case, inputs)
        if max(case.q_lens) < self.threshold:
            return run

        def other_tile() -> KernelOutput:
            res = run()
            return KernelOutput(torch.nextafter(res.out, torch.full_like(res.out, float("inf"))), res.lse)

        return other_tile


def test_variants_cut_the_neighbour_to_each_query_count_below_its_own():
    case = AttentionCase(((1, 30), (70, 90)), invariance="neighbour", num_splits=1, **GQA)
    got = [(v.label, v.case.requests, v.target_row) for v in variants(case)]
    assert got == [
        ("beside a neighbour of 70 queries", ((1, 30), (70, 90)), 0),
        ("alone", ((1, 30),), 0),
        ("beside a neighbour of 1 query", ((1, 30), (1, 21)), 0),
        ("beside a neighbour of 9 queries", ((1, 30), (9, 29)), 0),
        ("beside a neighbour of 10 queries", ((1, 30), (10, 30)), 0),
        ("beside a neighbour of 64 queries", ((1, 30), (64, 84)), 0),
        ("beside a neighbour of 65 queries", ((1, 30), (65, 85)), 0),
    ]
    # every cut keeps the neighbour's prompt shape: as many keys before its first query as the full request
    assert all(kv - q == 20 for v in variants(case)[2:] for q, kv in v.case.requests[1:])
    assert NEIGHBOUR_QUERIES == (1, 9, 10, 64, 65, 128, 129)


def test_assemble_keeps_the_first_queries_and_keys_of_a_cut_request():
    case = AttentionCase(((1, 30), (12, 20)), **GQA)
    inputs = make_inputs(case)
    call, built = assemble(case, inputs, [(0, 30), (1, 15, 7)])
    assert call.requests == ((1, 30), (7, 15))
    assert torch.equal(built.q[1:], inputs.q[1:8]) and torch.equal(built.k[30:], inputs.k[30:45])
    with pytest.raises(ValueError, match=r"q_len 13 of requests\[1\] must be in \[0, 12\]"):
        assemble(case, inputs, [(1, 20, 13)])


@pytest.mark.parametrize(
    ("requests", "changes", "message"),
    [
        (((1, 30), (9, 40), (1, 5)), {}, "needs exactly 2 requests"),
        (((1, 30),), {}, "needs exactly 2 requests"),
        (((1, 30), (1, 40)), {}, "at least 2 query tokens"),
    ],
)
def test_neighbour_cases_are_validated(requests, changes, message):
    with pytest.raises(ValueError, match=message):
        AttentionCase(requests, invariance="neighbour", **(GQA | changes))


@pytest.mark.parametrize("kind", ["run", "batch", "neighbour", "splits"])
@pytest.mark.parametrize(
    "changes",
    [dict(append=True), dict(cp_world=2, cp_rank=1), dict(quant="fp8_e4m3", dtype="bf16")],
    ids=["append", "cp", "quant"],
)
def test_invariance_refuses_what_its_assembled_batches_cannot_carry(kind, changes):
    """Before: append raised AssertionError inside the check and cp a ValueError in the case context (error
    records, found by the fuzzer's invariance draws); quant lost its quantized cache in the assembled batches.  The
    composition refuses them up front (one reason for every backend), and the fuzzer does not draw them."""
    from conformance.verdict.check import refusal

    case = AttentionCase(((3, 20), (4, 12)), invariance=kind, **(GQA | changes))
    r = refusal(case, get_backend("sdpa-cpu"), "cpu")  # what the worker asks before it builds the case's context
    assert r is not None and r.status == Status.UNSUPPORTED
    assert "its batches are assembled from q, k, v only" in r.reason


def test_cpu_backend_keeps_the_neighbour_invariance():
    case = AttentionCase(((1, 30), (17, 40)), invariance="neighbour", num_splits=1, **GQA)
    r = verdict(case, get_backend("sdpa-cpu"))
    assert r.status == Status.PASS, r.reason
    inv = r.extra["invariance"]
    assert inv["kind"] == "neighbour" and inv["kept"] is True and len(inv["pairs"]) == 4


def test_a_tile_picked_from_the_longest_request_fails_neighbour_but_not_batch():
    """The planted bug of vLLM #51902's class: ``batch`` keeps it, ``neighbour`` catches it."""
    batch = AttentionCase(((1, 30), (9, 40)), invariance="batch", num_splits=1, **GQA)
    kept = verdict(batch, TileByLongestQuery())
    assert kept.status == Status.PASS and kept.extra["invariance"]["kept"] is True
    grown = AttentionCase(((1, 30), (17, 40)), invariance="neighbour", num_splits=1, **GQA)
    r = verdict(grown, TileByLongestQuery())
    assert r.status == Status.FAIL
    assert "request 0 'alone' differs from 'beside a neighbour of 17 queries'" in r.reason
    equal = {p["b"]: p["equal"] for p in r.extra["invariance"]["pairs"]}
    assert equal == {
        "alone": False,
        "beside a neighbour of 1 query": False,
        "beside a neighbour of 9 queries": False,
        "beside a neighbour of 10 queries": True,  # the same tile as the full neighbour: 9 -> 10 is the edge
    }
    # not promised without a pinned split count: reported, not failed
    loose = verdict(grown.replace(num_splits=None), TileByLongestQuery())
    assert loose.status == Status.PASS and loose.extra["invariance"]["kept"] is False


def test_suites_hold_neighbour_cases_at_every_template_head_dim():
    cases = neighbour_cases()
    assert {c.head_dim for c in cases} == set(TEMPLATE_HEAD_DIMS)
    assert all(c.num_splits == 1 and c.invariance == "neighbour" for c in cases)
    assert {c.requests[0][0] for c in cases} == {1, 64}  # a decode and a prefill target
    assert any(c.head_dim == 64 and not c.paged for c in cases)  # contiguous keys too
    suite = graphs_suite()
    assert set(c.id for c in cases) <= {c.id for c in suite} and len({c.id for c in suite}) == len(suite)
    assert any(c.invariance == "neighbour" for c in small_cases())  # smoke and default run one too


def test_batch_invariance_of_causal_requests_with_fewer_keys_than_queries():
    """Found by the fuzzer's invariance draws on the H100 (fuzz seed 26): 'beside shorter requests' cut a causal
    request of (127, 0) to 127 keys, more than it has, and the reference raised (an error record on every
    backend).  A cut never grows a request."""
    case = AttentionCase(((1, 0), (127, 0), (4, 9)), invariance="batch", **GQA)
    shorter = variants(case)[-1]
    assert shorter.label == "beside shorter requests" and shorter.case.requests == ((1, 0), (127, 0), (4, 4))
    r = verdict(case, get_backend("sdpa-cpu"))
    assert r.status == Status.PASS, r.reason


def test_a_neighbour_with_fewer_keys_than_its_dropped_queries_is_cut_to_no_key():
    """A non-causal neighbour of 70 queries over 20 keys, cut to q queries, keeps ``20 - (70 - q)`` keys: none
    below 50 queries (never a negative count, never a key it did not have in that position); a case the model
    accepts (keyless rows)."""
    case = AttentionCase(((1, 30), (70, 20)), invariance="neighbour", num_splits=1, **{**GQA, "causal": False})
    got = {v.label: v.case.requests for v in variants(case)}
    assert got["beside a neighbour of 1 query"] == ((1, 30), (1, 0))
    assert got["beside a neighbour of 9 queries"] == ((1, 30), (9, 0))
    assert got["beside a neighbour of 64 queries"] == ((1, 30), (64, 14))
    assert got["beside a neighbour of 65 queries"] == ((1, 30), (65, 15))
