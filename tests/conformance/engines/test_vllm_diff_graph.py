"""Seed 000's CUDA-graph decode (``conformance.engines.vllm_diff.graph``) on the CPU backends.

* every graph scenario passes the verdict on sdpa-cpu, replaying each batch of its bucket on the buffers, and each
  replay equals the same four calls and combination run eagerly, and the batch's own eager forward;
* ``_get_graph_runner_block_tables`` into both runner tables as the seed writes them: real rows' first entries
  written, entries past them and the padded rows stale; padded ``seq_lens`` 1 and ``PAD_SLOT_ID`` slots; the
  KV-sharing layer reads ``block_tables`` in a decode, ``cross_layer_shared_block_tables`` otherwise;
* bad input (a batch past the bucket, a sequence past the tables' columns) raises ``ValueError`` naming the field;
* planted bugs fail: stale ``graph_block_tables`` rows at a shorter replay (the numbers), and
  ``cross_layer_shared_graph_block_tables`` not refreshed at replay (the table check).
"""

from __future__ import annotations

import json

import pytest
import torch

from attnfast.registry import get_backend
from conformance.cases.case import AttentionCase
from conformance.suites.registry import get_suite
from conformance.engines.base import Request
from conformance.engines.vllm_diff import VllmDifferentialAttention, layer_params
from conformance.engines.vllm_diff.attention import PAIRS
from conformance.engines.vllm_diff.graph import PAD_SLOT_ID, DiffGraphRun
from conformance.engines.vllm_diff.scenarios import GRAPH_SCENARIOS
from conformance.records import Status
from tests.conformance.engines.graph_cases import GraphCases
from tests.conformance.engines.recorder import engine_verdict

ENGINE = VllmDifferentialAttention()
GRAPHS = GraphCases(ENGINE, GRAPH_SCENARIOS)
CASES, _ctx = GRAPHS.cases, GRAPHS.ctx


@pytest.mark.parametrize("name", sorted(GRAPH_SCENARIOS))
def test_graph_scenarios_pass_on_cpu(name):
    graph = GRAPHS.check_on_cpu(name).extra["graph"]
    assert graph["bucket"]["fill"] == 1 and all(r["vs_plain"]["equal"] for r in graph["replays"])
    assert not graph["captured"] and not graph["promised"]
    assert graph["layer"] == ("kv_sharing" if GRAPH_SCENARIOS[name].shared_kv else "kv_generating")


def _run(name: str = "graph_decode", cls: type[DiffGraphRun] = DiffGraphRun) -> DiffGraphRun:
    ctx = _ctx(name)
    params = layer_params(ctx.case)
    run = cls(
        ctx.case, ctx.inputs, get_backend("sdpa-cpu"), "cpu", engine=ENGINE, params=params, pairs=PAIRS,
        sc=GRAPH_SCENARIOS[name],
    )  # fmt: skip
    run._allocate()
    return run


def test_both_graph_tables_as_the_seed_writes_them():
    run = _run()
    first = run.build([Request(1, 40), Request(1, 7), Request(1, 95), Request(1, 14)])
    before = run.graph_block_tables.clone()
    assert torch.equal(run.cross_layer_shared_graph_block_tables, before)  # decodes without a window: the same lists
    step = run.build([Request(1, 20)])
    assert step.seq_lens == [21, 1, 1, 1] and step.slot_mapping[1:] == [PAD_SLOT_ID] * 3  # padded seq_lens 1
    for tables, runner in (
        (step.block_tables, run.graph_block_tables),
        (step.cross_layer_shared_block_tables, run.cross_layer_shared_graph_block_tables),
    ):
        assert tables.shape == (4, run.width) and tables.data_ptr() == runner.data_ptr()  # rows of the runner's
        assert torch.equal(tables[1:], before[1:])  # padded rows keep the longer batch's rows
        assert torch.equal(tables[0, 2:], before[0, 2:]) and tables[0, :2].tolist() == step.blocks[0]  # 2 pages
    assert len(first.blocks) == 4 and len(step.blocks) == 1


def test_the_kv_sharing_layer_reads_block_tables_in_a_decode():
    run = _run("graph_decode_shared_kv")
    assert run.kv_only_table(decode=True) is run.block_tables
    assert all(
        ins.block_table is run.block_tables and ins.seqlens_k is run.seq_lens for ins in run.pair_inputs.values()
    )
    run.build([Request(1, 40), Request(1, 7)])
    assert torch.equal(run.kv_only_table(decode=False), run.cross_layer_shared_graph_block_tables)
    # the four calls read the pairs' groups of the one stacked cache
    for pair, (gq, gk, gv) in PAIRS.items():
        ins = run.pair_inputs[pair]
        assert ins.q is run.q_split[gq] and ins.k_cache.data_ptr() == run.kv_cache[gk, 0].data_ptr()
        assert ins.v_cache.data_ptr() == run.kv_cache[gv, 1].data_ptr()


def test_bad_input_raises_naming_the_field_and_bucket():
    run = _run()
    with pytest.raises(ValueError, match="graph_block_tables: batch of 5 sequences exceeds the captured bucket of 4"):
        run.get_graph_runner_block_tables(5, [], run.graph_block_tables)
    with pytest.raises(ValueError, match=r"seq_lens\[0\] = 500 exceeds graph_block_tables' 9 blocks of 16"):
        run.build([Request(1, 499)])
    case = CASES["graph_decode"]
    with pytest.raises(ValueError, match="graph must be scenario"):
        ENGINE.check(case.replace(graph=(1, 4, 3, 2, 4)))
    with pytest.raises(ValueError, match=r"num_kv_heads \(3\) must be even"):
        ENGINE.check(case.replace(num_heads=6, num_kv_heads=3))
    refused = ENGINE.supports(case, get_backend("sdpa-cuda"), "cuda")
    assert not refused and refused.reason.startswith("graph: ")
    plan = ENGINE.plan(case)
    assert [label.split()[0] for label, _ in plan] == list(PAIRS) and {c.batch for _, c in plan} == {4}
    assert {(c.num_heads, c.num_kv_heads) for _, c in plan} == {(4, 1)}


class _StaleRows(DiffGraphRun):
    """Planted: graph_block_tables rows written only past the previous batch's rows, so at a shorter (or equal)
    replay every real request keeps an earlier batch's row and reads its pages."""

    def get_graph_runner_block_tables(self, num_seqs, lists, graph):
        if graph is not self.graph_block_tables:
            return super().get_graph_runner_block_tables(num_seqs, lists, graph)
        prev = getattr(self, "_prev", 0)
        self._prev = len(lists)
        rows = graph[:num_seqs]
        for i, block_table in enumerate(lists):
            if i >= prev and block_table:
                rows[i, : len(block_table)] = torch.tensor(block_table, dtype=torch.int32)
        return rows


class _CrossLayerNotRefreshed(DiffGraphRun):
    """Planted: cross_layer_shared_graph_block_tables written at capture only (the replays keep the capture's)."""

    def get_graph_runner_block_tables(self, num_seqs, lists, graph):
        if graph is self.cross_layer_shared_graph_block_tables:
            if getattr(self, "_built", False):
                return graph[:num_seqs]
            self._built = True
        return super().get_graph_runner_block_tables(num_seqs, lists, graph)


def _planted(run: type[DiffGraphRun]) -> VllmDifferentialAttention:
    return type("Planted", (VllmDifferentialAttention,), {"graph_run": run})()


def test_planted_stale_rows_fail_the_numbers(monkeypatch):
    res = engine_verdict(_ctx("graph_decode"), _planted(_StaleRows), monkeypatch)
    assert res.status is Status.FAIL and "graph:" not in res.reason, res.reason  # the numbers, not the bitwise check


def test_planted_cross_layer_table_not_refreshed_fails(monkeypatch):
    res = engine_verdict(_ctx("graph_decode_shared_kv"), _planted(_CrossLayerNotRefreshed), monkeypatch)
    assert res.status is Status.FAIL and "cross_layer_shared_block_tables: replay 1 row " in res.reason, res.reason


def test_graph_cases_round_trip_and_are_engines_suite_cases():
    assert len(CASES) == len(GRAPH_SCENARIOS) >= 2
    suite = {c.id for c in get_suite("engines") if c.engine == "vllm_diff" and c.graph}
    assert suite == {c.id for c in CASES.values()}
    for case in CASES.values():
        again = AttentionCase.from_json(json.loads(json.dumps(case.to_json())))
        assert again == case and again.id.startswith(f"vllm_diff-{case.scenario}_") and case.graph_fill == 1
        assert max(case.graph[1:]) <= case.graph[0] and len(case.graph) >= 4  # several replays within the bucket
        ENGINE.check(case)
    assert sorted(set(CASES["graph_decode"].graph)) == [1, 2, 3, 4]  # every batch size up to the bucket
    with pytest.raises(ValueError, match="runs through prepare"):
        ENGINE.forward(CASES["graph_decode"], None, None)
