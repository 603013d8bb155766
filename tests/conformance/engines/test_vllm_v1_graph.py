"""Seed 001's full-CUDA-graph path (``conformance.engines.vllm_v1.graph``) on the CPU backends.

* every graph scenario passes the verdict on sdpa-cpu, replaying each batch of its bucket on the buffers;
* the builder's graph fields are the seed's: a ``1 + round_up(max_batch_size, 4) * 4`` buffer, the graph split bound,
  1 in batch-invariant mode for the scheduler, the fork's re-assignment of the call's split count;
* bad input (a batch past the bucket, metadata past the buffer) raises ``ValueError`` naming the field and bucket;
* planted bugs fail: the capture batch's scheduler metadata reused, ``num_splits`` changed after capture.
"""

from __future__ import annotations

import re

import json

import pytest
import torch

from attnfast.registry import get_backend
from conformance.cases.case import AttentionCase
from conformance.engines.vllm_v1 import VllmV1FlashAttention
from conformance.engines.vllm_v1.graph import GRAPH_SCENARIOS, GraphScenario, V1GraphRun, check_graph_case
from conformance.engines.vllm_v1.graph_builder import (
    MAX_NUM_SPLITS_FOR_CUDA_GRAPH,
    V1GraphBuilder,
    host_scheduler_metadata,
    scheduler_metadata_size,
)
from conformance.records import Status
from tests.conformance.engines.graph_cases import GraphCases
from tests.conformance.engines.recorder import engine_verdict

ENGINE = VllmV1FlashAttention()
GRAPHS = GraphCases(ENGINE, GRAPH_SCENARIOS)
CASES, _ctx = GRAPHS.cases, GRAPHS.ctx


@pytest.mark.parametrize("name", sorted(GRAPH_SCENARIOS))
def test_graph_scenarios_pass_on_cpu(name):
    res = GRAPHS.check_on_cpu(name)
    graph = res.extra["graph"]
    assert graph["captured"] is False
    assert any("not captured" in n for n in res.extra["notes"])
    if GRAPH_SCENARIOS[name].aot:
        bucket, q_len = CASES[name].graph[0], CASES[name].q_lens[0]  # max(max_num_seqs, max_cudagraph_size)
        assert graph["scheduler_metadata_entries"] == scheduler_metadata_size(bucket * q_len)
        assert graph["captured_num_splits"] == MAX_NUM_SPLITS_FOR_CUDA_GRAPH


def test_graph_cases_are_in_the_engine_suite_and_plan_the_captured_call():
    case = CASES["graph_decode_aot"]
    ((label, call),) = ENGINE.plan(case)
    assert "captured" in label and call.batch == case.graph[0] and not call.graph and not call.engine
    assert call.num_splits == MAX_NUM_SPLITS_FOR_CUDA_GRAPH and not call.scheduler_metadata
    assert ENGINE.plan(CASES["graph_decode"])[0][1].num_splits is None  # the fork's decode call passes none
    fa3 = ENGINE._graph_call(case, get_backend("fa3-vllm"))
    assert fa3.scheduler_metadata  # a backend that takes AOT metadata gets it
    refused = ENGINE.supports(case, get_backend("sdpa-cuda"), "cuda")
    assert not refused and refused.reason.startswith("graph: ")


def _builder(**kw) -> V1GraphBuilder:
    args = dict(max_num_seqs=5, max_cudagraph_size=5, aot_schedule=True, scheduler=host_scheduler_metadata)
    return V1GraphBuilder(device="cpu", **(args | kw))


def test_builder_buffer_and_splits_as_the_seed_writes_them():
    b = _builder()
    assert b.scheduler_metadata is not None and b.scheduler_metadata.numel() == 1 + 8 * 4
    lens = torch.tensor([40, 0, 300, 7, 0], dtype=torch.int32)
    meta = b.build(5, 5, 1, lens, batch_invariant=False)
    assert (meta.scheduled_splits, meta.max_num_splits) == (32, 32)
    n = meta.scheduler_metadata.numel()
    assert meta.scheduler_metadata.data_ptr() == b.scheduler_metadata.data_ptr() and not b.scheduler_metadata[n:].any()
    inv = b.build(5, 5, 1, lens, batch_invariant=True)
    assert (inv.scheduled_splits, inv.max_num_splits) == (1, 32)  # the fork re-assigns after scheduling
    upstream = type("Upstream", (V1GraphBuilder,), {"splits_as_fork": False})
    up = upstream(
        max_num_seqs=5, max_cudagraph_size=5, aot_schedule=True, scheduler=host_scheduler_metadata, device="cpu"
    ).build(5, 5, 1, lens, batch_invariant=True)
    assert (up.scheduled_splits, up.max_num_splits) == (1, 1)
    assert b.build(5, 6, 1, lens, False).max_num_splits == 0  # past max_cudagraph_size: the heuristic
    assert _builder(aot_schedule=False).build(5, 5, 1, lens, False).scheduler_metadata is None


def test_metadata_past_the_buffer_raises_naming_the_field():
    b = _builder(max_num_seqs=3, max_cudagraph_size=3)
    with pytest.raises(ValueError, match=r"scheduler_metadata: 33 entries .* buffer of 17 .*max_batch_size 3"):
        b.build(8, 3, 1, torch.ones(8, dtype=torch.int32), False)


def test_batch_past_the_bucket_raises_naming_the_field():
    case = CASES["graph_decode"]
    bad = case.replace(graph=(1, 4, 3, 2, 4))  # sizes add up; the capture batch is not the largest
    bad_sc = GRAPH_SCENARIOS["graph_decode"]
    with pytest.raises(ValueError, match="graph must be scenario"):
        ENGINE.check(bad)
    sc = GraphScenario(
        tuple(bad_sc.requests[i : i + n] for i, n in ((0, 1), (1, 4), (5, 3), (8, 2), (10, 4))), bad_sc.layer
    )
    with pytest.raises(ValueError, match="graph: replay batch of 4 requests exceeds the captured bucket of 1"):
        check_graph_case(bad, sc)


class _CaptureMetadataReused(V1GraphRun):
    """Planted: the builder runs at capture only; every replay keeps the capture batch's scheduler metadata."""

    def build(self, builder, live):
        if not hasattr(self, "_capture_meta"):
            self._capture_meta = super().build(builder, live)
        return self._capture_meta


class _SplitsFromBatch(V1GraphRun):
    """Planted: max_num_splits re-derived from the live batch at every build (it changes after capture)."""

    def build(self, builder, live):
        meta = super().build(builder, live)
        meta.max_num_splits = min(meta.max_num_splits, 2 * live)
        return meta


@pytest.mark.parametrize(
    "run, scenario, match",
    [
        (_CaptureMetadataReused, "graph_decode_aot", "scheduler_metadata: replay 1"),
        (
            _SplitsFromBatch,
            "graph_spec_decode_aot",
            r"num_splits: replay 1 \(1 requests, bucket of 3\) built max_num_splits=2, .* captured num_splits=6",
        ),
    ],
)
def test_planted_graph_bugs_fail(run, scenario, match, monkeypatch):
    engine = type("Planted", (VllmV1FlashAttention,), {"graph_run": run})()
    res = engine_verdict(_ctx(scenario), engine, monkeypatch)
    assert res.status is Status.FAIL
    assert re.search(match, res.reason), res.reason


def test_graph_cases_round_trip_and_pass_check():
    assert len(CASES) == len(GRAPH_SCENARIOS) >= 4
    for case in CASES.values():
        again = AttentionCase.from_json(json.loads(json.dumps(case.to_json())))
        assert again == case and again.id.startswith(f"vllm_v1_fa-{case.scenario}_") and case.graph_fill == 0
        ENGINE.check(case)
    with pytest.raises(ValueError, match="runs through prepare"):
        ENGINE.forward(CASES["graph_decode"], None, None)
