"""Graph mode and invariance verdicts on CPU: the buffer logic, the verdicts, and every planted bug caught."""

from __future__ import annotations

import json

import pytest
import torch

from attnfast.registry import get_backend
from attnref import gather_kv
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import make_inputs
from conformance.graphs.buffers import DECOY_SCALE, Bucket, GraphBuffers
from conformance.graphs.invariance import variants
from conformance.graphs.suite import graphs_suite
from conformance.records import Status
from conformance.verdict.check import check_backend, composition_of, prepare_context
from tests.conformance.fakes import ExactBackend
from tests.conformance.graphs.graph_fakes import (
    CapacityLengthsGraph,
    FrozenLengthsGraph,
    GraphExact,
    NonDeterministic,
    PaddedRowLeakGraph,
    SchedulerGraph,
    SplitsChangedGraph,
    StaleSchedulerGraph,
    StaleTableGraph,
)

GQA = dict(num_heads=4, num_kv_heads=2, head_dim=16, dtype="fp32", causal=True, kv_layout="NHD", block_size=8)
#: capture batch (3), a smaller batch with a longer request (2: one padded row), a full batch, one alone
REQS = ((1, 20), (1, 5), (1, 33), (1, 60), (1, 2), (1, 9), (1, 40), (1, 17), (1, 1))
SIZES = (3, 2, 3, 1)


def graph_case(**changes) -> AttentionCase:
    return AttentionCase(REQS, **(GQA | dict(graph=SIZES) | changes))


def verdict(case: AttentionCase, backend):
    return check_backend(prepare_context(case, 0, "cpu"), backend)


# ------------------------------------------------------------------------------------------------ case fields
def test_graph_fields_round_trip_and_name_the_case():
    case = graph_case(graph_fill=1)
    assert AttentionCase.from_json(json.loads(json.dumps(case.to_json()))) == case
    assert "_graph3.2.3.1fill1-" in case.id and "graph" in case.features()
    plain = AttentionCase(REQS, **GQA)
    assert "graph" not in plain.to_json() and "invariance" not in plain.to_json()  # existing ids unchanged


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (dict(graph=(3, 2)), r"must add up to the number of requests \(9\)"),
        (dict(graph=(0, 9)), "replay batch sizes >= 1"),
        (dict(kv_layout="contiguous", block_size=None), "graph needs a paged case"),
        (dict(graph_fill=2), "graph_fill must be 0"),
        (dict(quant="fp8_e4m3", dtype="bf16"), "graph cannot be combined with quant"),
        (dict(graph=(), graph_fill=1), "graph_fill applies only to a graph case"),
        (dict(invariance="often"), "invariance must be one of"),
        (dict(invariance=None), "invariance must be a string, '' or one of"),  # None is no kind, not ''
        (dict(invariance=1), "invariance must be a string"),
    ],
)
def test_bad_graph_fields_are_refused_naming_the_field(changes, message):
    with pytest.raises(ValueError, match=message):
        graph_case(**changes)


def test_graph_needs_one_q_len():
    with pytest.raises(ValueError, match="one q_len >= 1"):
        AttentionCase(((1, 5), (2, 6)), graph=(2,), **GQA)


# ------------------------------------------------------------------------------------------------ buffers
def test_bucket_geometry_and_fit_errors_name_field_and_bucket():
    case = graph_case()
    bucket = Bucket.of(case)
    assert (bucket.batch, bucket.q_len, bucket.width, bucket.block_size) == (3, 1, 9, 8)  # ceil(60 / 8) + 1 pages
    assert bucket.capacity == 72 and bucket.num_blocks == 3 * 9 + 9
    assert bucket.groups(case) == [[0, 1, 2], [3, 4], [5, 6, 7], [8]]
    assert bucket.call_case(case).requests == ((1, 72),) * 3
    with pytest.raises(ValueError, match="replay batch of 4 requests exceeds the captured bucket of 3"):
        bucket.check_fits(case, [0, 1, 2, 3])
    too_long = case.replace(requests=REQS[:-1] + ((1, 70),))
    with pytest.raises(ValueError, match=r"requests\[8\] kv_len 70 exceeds the bucket's 8 pages of 8 keys"):
        bucket.check_fits(too_long, [8])


def test_write_lays_each_batch_out_in_place_with_padding_and_decoys():
    case = graph_case(graph_fill=1)
    src = make_inputs(case, 0)
    buf = GraphBuffers.allocate(case, src, 0)
    ptrs = {name: t.data_ptr() for name, t in vars(buf.inputs).items() if isinstance(t, torch.Tensor)}
    for group in buf.bucket.groups(case):
        buf.write(case, src, group)
        inp = buf.inputs
        lens = [case.kv_lens[r] for r in group]
        assert inp.seqlens_k.tolist() == lens + [1] * (3 - len(group))  # padded requests at the fill value
        assert inp.cu_seqlens_k.tolist() == [0] + torch.tensor(inp.seqlens_k.tolist()).cumsum(0).tolist()
        keys, _ = gather_kv(inp.k_cache, inp.block_table[: len(group)], lens, "NHD")
        want = torch.cat([src.k_of(r) for r in group])
        assert torch.equal(keys, want)  # each request's keys through its own table row
        assert torch.equal(inp.q[: len(group)], torch.cat([src.q[r : r + 1] for r in group]))
        table = inp.block_table
        assert int(table.min()) >= 0 and int(table.max()) < buf.bucket.num_blocks  # garbage ids stay in bounds
        # every request's row has entries past its last page; they are not its own pages
        for slot, kv in enumerate(lens):
            own = set(table[slot, : -(-kv // 8)].tolist())
            assert len(own) == -(-kv // 8)
        # nothing was reallocated: a captured graph keeps reading the same memory
        assert {n: t.data_ptr() for n, t in vars(inp).items() if isinstance(t, torch.Tensor)} == ptrs
    decoys = inp.k_cache[buf.bucket.batch * buf.bucket.width :]
    assert float(decoys.abs().max()) > 3 * DECOY_SCALE


def test_exact_inputs_are_views_of_the_batch():
    case = graph_case()
    src = make_inputs(case, 0)
    buf = GraphBuffers.allocate(case, src, 0)
    group = buf.bucket.groups(case)[1]
    buf.write(case, src, group)
    exact = buf.exact(case, group)
    assert exact.case.requests == ((1, 60), (1, 2)) and not exact.case.graph
    assert exact.block_table.data_ptr() == buf.inputs.block_table.data_ptr()
    assert exact.seqlens_k.tolist() == [60, 2]


# ------------------------------------------------------------------------------------------------ verdicts
def test_composition_of_each_kind():
    assert composition_of(AttentionCase(REQS, **GQA)) is None
    assert composition_of(graph_case()).name == "graph"
    assert composition_of(AttentionCase(REQS, invariance="run", **GQA)).name == "invariance"


@pytest.mark.parametrize("backend", ["sdpa-cpu", "flex-cpu"])
@pytest.mark.parametrize("fill", [0, 1])
def test_cpu_backends_pass_graph_cases_with_each_replay_recorded(backend, fill):
    r = verdict(graph_case(graph_fill=fill, dtype="bf16"), get_backend(backend))
    assert r.status == Status.PASS, r.reason
    graph = r.extra["graph"]
    assert graph["captured"] is False and [p["requests"] for p in graph["replays"]] == list(SIZES)
    assert all(p["vs_eager"]["equal"] and p["vs_plain"]["equal"] for p in graph["replays"])
    assert any("not captured" in n for n in r.extra["notes"])


def test_a_backend_without_graph_is_unsupported_with_the_reason():
    r = verdict(graph_case(), ExactBackend())  # declares nothing opt-in
    assert r.status == Status.UNSUPPORTED and r.reason.startswith("graph: not declared")


def test_exact_graph_fakes_pass():
    for fake in (GraphExact(), SchedulerGraph()):
        r = verdict(graph_case(), fake)
        assert r.status == Status.PASS, (fake.name, r.reason)


@pytest.mark.parametrize(
    ("fake", "expect"),
    [
        (StaleTableGraph, "max_error: |out-ref|"),
        (FrozenLengthsGraph, "max_error: |out-ref|"),
        (CapacityLengthsGraph, "max_error: |out-ref|"),
        (StaleSchedulerGraph, "max_error: |out-ref|"),
        (PaddedRowLeakGraph, "max_error: |out-ref|"),
    ],
)
def test_planted_graph_bugs_fail(fake, expect):
    r = verdict(graph_case(), fake())
    assert r.status == Status.FAIL, (fake.name, r.reason)
    assert expect in r.reason


def test_split_count_changed_between_capture_and_eager_fails_when_pinned():
    loose = verdict(graph_case(), SplitsChangedGraph())
    assert loose.status == Status.PASS  # within tolerance, and the kernel promised nothing
    assert loose.extra["graph"]["graph_vs_eager_kept"] is False and loose.extra["graph"]["promised"] is False
    pinned = verdict(graph_case(num_splits=1), SplitsChangedGraph())
    assert pinned.status == Status.FAIL
    assert "graph vs eager: replay 0 (3 requests) with num_splits pinned to 1 differs" in pinned.reason


# ------------------------------------------------------------------------------------------------ invariances
def test_invariance_variants():
    case = AttentionCase(((1, 30), (1, 9), (1, 50)), invariance="batch", **GQA)
    labels = [(v.label, v.picks, v.target_row) for v in variants(case)]
    assert labels == [
        ("in batch (first)", ((0, 30), (1, 9), (2, 50)), 0),
        ("alone", ((0, 30),), 0),
        ("in batch (last)", ((1, 9), (2, 50), (0, 30)), 2),
        ("beside shorter requests", ((0, 30), (1, 4), (2, 25)), 0),
    ]
    splits = variants(case.replace(invariance="splits"))
    assert [v.case.num_splits for v in splits] == [None, 1, 2, 3]


@pytest.mark.parametrize("kind", ["run", "batch", "splits"])
def test_cpu_backends_keep_every_invariance(kind):
    case = AttentionCase(((1, 30), (1, 9), (1, 50)), invariance=kind, **GQA)
    r = verdict(case, get_backend("sdpa-cpu"))
    assert r.status == Status.PASS, r.reason
    assert r.extra["invariance"]["kept"] is True and r.extra["invariance"]["kind"] == kind


def test_nondeterministic_merge_fails_run_invariance():
    r = verdict(AttentionCase(((1, 30), (1, 9)), invariance="run", **GQA), NonDeterministic())
    assert r.status == Status.FAIL
    assert "invariance run: request 0 'second run' differs from 'first run'" in r.reason


def test_batch_invariance_is_a_failure_only_when_promised():
    class BatchDependent(GraphExact):
        name = "fake-batch-dependent"

        def prepare(self, case, inputs):
            run = super().prepare(case, inputs)
            bump = case.batch > 1  # e.g. a split heuristic that reads the batch size
            return lambda: SplitsChangedGraph.prepare_graph.__globals__["_last_bit"](run()) if bump else run()

    case = AttentionCase(((1, 30), (1, 9), (1, 50)), invariance="batch", **GQA)
    loose = verdict(case, BatchDependent())
    assert loose.status == Status.PASS and loose.extra["invariance"]["kept"] is False
    pinned = verdict(case.replace(num_splits=1), BatchDependent())
    assert pinned.status == Status.FAIL and "request 0 'alone' differs" in pinned.reason


# ------------------------------------------------------------------------------------------------ suite
def test_graphs_suite_holds_graph_and_invariance_cases():
    cases = graphs_suite()
    kinds = {f for c in cases for f in c.features() if f == "graph" or f.startswith("inv_")}
    assert kinds == {"graph", "inv_run", "inv_batch", "inv_splits", "inv_neighbour"}
    assert len({c.id for c in cases}) == len(cases)
    assert any(c.scheduler_metadata and c.graph for c in cases) and any(c.qv and c.graph for c in cases)
