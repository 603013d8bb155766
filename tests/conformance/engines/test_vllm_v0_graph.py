"""Seed 002's CUDA-graph decode (``conformance.engines.vllm_v0.graph``) on the CPU backends.

* every graph scenario passes the verdict on sdpa-cpu, replaying each batch of its bucket on the buffers;
* ``_get_graph_runner_block_tables`` as the seed writes it: real rows' first entries written, entries past them and
  the padded rows stale; padded ``seq_lens`` 1 and ``PAD_SLOT_ID`` slots;
* bad input (a batch past the bucket, a sequence past the table's columns) raises ``ValueError`` naming the field;
* a planted bug (stale ``graph_block_tables`` rows at a shorter replay) fails.
"""

from __future__ import annotations

import json

import pytest
import torch

from attnfast.registry import get_backend
from conformance.cases.case import AttentionCase
from conformance.engines.base import Request
from conformance.engines.vllm_v0 import VllmV0FlashAttention
from conformance.engines.vllm_v0.graph import GRAPH_SCENARIOS, V0GraphRun, captured_call
from conformance.engines.vllm_v0.metadata import PAD_SLOT_ID
from conformance.records import Status
from tests.conformance.engines.graph_cases import GraphCases
from tests.conformance.engines.recorder import engine_verdict

ENGINE = VllmV0FlashAttention()
GRAPHS = GraphCases(ENGINE, GRAPH_SCENARIOS)
CASES, _ctx = GRAPHS.cases, GRAPHS.ctx


@pytest.mark.parametrize("name", sorted(GRAPH_SCENARIOS))
def test_graph_scenarios_pass_on_cpu(name):
    assert GRAPHS.check_on_cpu(name).extra["graph"]["bucket"]["fill"] == 1


def _run(name: str = "graph_decode") -> V0GraphRun:
    ctx = _ctx(name)
    run = V0GraphRun(ctx.case, ctx.inputs, get_backend("sdpa-cpu"), "cpu", captured_call(ctx.case))
    run._allocate()
    return run


def test_graph_block_tables_as_the_seed_writes_them():
    run = _run()
    seq_lens, slots, tables = run.build([Request(1, 40), Request(1, 7), Request(1, 95), Request(1, 14)])
    before = run.graph_block_tables.clone()
    seq_lens, slots, tables = run.build([Request(1, 20)])
    assert seq_lens == [21, 1, 1, 1] and slots[1:] == [PAD_SLOT_ID] * 3  # padded seq_lens 1, PAD_SLOT_ID slots
    assert torch.equal(tables[1:], before[1:])  # padded rows keep the longer batch's rows
    assert torch.equal(tables[0, 2:], before[0, 2:])  # entries past the request's 2 pages are stale
    assert tables.shape == (4, run.width) and tables.data_ptr() == run.graph_block_tables.data_ptr()


def test_bad_input_raises_naming_the_field_and_bucket():
    run = _run()
    with pytest.raises(ValueError, match="graph_block_tables: batch of 5 sequences exceeds the captured bucket of 4"):
        run.get_graph_runner_block_tables(5, [])
    with pytest.raises(ValueError, match=r"seq_lens\[0\] = 500 exceeds graph_block_tables' 9 blocks of 16"):
        run.build([Request(1, 499)])
    case = CASES["graph_decode"]
    with pytest.raises(ValueError, match="graph must be scenario"):
        ENGINE.check(case.replace(graph=(1, 4, 3, 2, 4)))
    refused = ENGINE.supports(case, get_backend("sdpa-cuda"), "cuda")
    assert not refused and refused.reason.startswith("graph: ")
    assert ENGINE.plan(case)[0][1].batch == 4


class _StaleRows(V0GraphRun):
    """Planted: graph_block_tables rows written only past the previous batch's rows, so at a shorter (or equal)
    replay every real request keeps an earlier batch's row and reads its pages."""

    def get_graph_runner_block_tables(self, num_seqs, block_tables):
        prev = getattr(self, "_prev", 0)
        self._prev = len(block_tables)
        rows = self.graph_block_tables[:num_seqs]
        for i, block_table in enumerate(block_tables):
            if i >= prev and block_table:
                rows[i, : len(block_table)] = torch.tensor(block_table, dtype=torch.int32)
        return rows


def test_planted_stale_rows_fail(monkeypatch):
    engine = type("Planted", (VllmV0FlashAttention,), {"graph_run": _StaleRows})()
    res = engine_verdict(_ctx("graph_decode"), engine, monkeypatch)
    assert res.status is Status.FAIL and "graph:" not in res.reason, res.reason  # the numbers, not the bitwise check


def test_graph_cases_round_trip_and_pass_check():
    assert len(CASES) == len(GRAPH_SCENARIOS) >= 2
    for case in CASES.values():
        again = AttentionCase.from_json(json.loads(json.dumps(case.to_json())))
        assert again == case and again.id.startswith(f"vllm_v0_fa-{case.scenario}_") and case.graph_fill == 1
        ENGINE.check(case)
    with pytest.raises(ValueError, match="runs through prepare"):
        ENGINE.forward(CASES["graph_decode"], None, None)
