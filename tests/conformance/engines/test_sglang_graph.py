"""Seed 003's CUDA-graph path replayed at engine level: ``conformance.engines.sglang.graph`` (and ``graph_state``,
``graph_cases``).

* every graph scenario is an ``engines``-suite case and passes the layer verdict on ``sdpa-cpu`` (eager "replays"
  on the bucket's buffers), every replay bitwise equal to the same calls run afresh and to the batch's own calls;
* the capture and replay metadata as the seed writes them: views of the bucket's buffers, padded rows at the fill
  value 1, strided page-table columns refreshed up to ``max_seq_pages`` and stale past it, the top-k > 1 expand
  table equal to the eager builder's;
* planted bugs fail: ``max_seq_len_k`` not refreshed at replay (stale page-table columns read), the top-k > 1
  draft expand table kept from the first batch, the merge pairing one call's output with the other's LSE, a
  kernel keeping capture-time state (only the bitwise check sees it), a graph call differing from the batch's
  own call under pinned ``num_splits``;
* an adapter without ``graph`` is ``unsupported`` with its reason; bad input raises ``ValueError`` naming the
  field and the bucket; the finding of the local-attention capture (a view one page wide).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from attnfast.base import KernelOutput
from attnfast.registry import get_backend
from attnfast.sdpa import SdpaCpuBackend
from conformance.cases.case import AttentionCase
from conformance.suites.registry import get_suite
from conformance.engines.sglang import (
    FILL_VALUE,
    GRAPH_FINDINGS,
    GRAPH_SCENARIOS,
    CudaGraphState,
    SCENARIOS,
    RunnerBuffers,
    SGLangFlashAttention,
)
from conformance.engines.sglang.graph_cases import graph_case
from conformance.records import Status
from conformance.verdict.check import check_backend, prepare_context
from tests.conformance.engines.recorder import engine_verdict

ENGINE = SGLangFlashAttention()
CASES = {c.scenario: c for c in ENGINE.cases() if c.graph}
_CONTEXTS: dict[str, object] = {}


def _ctx(case: AttentionCase):
    if case.id not in _CONTEXTS:
        _CONTEXTS[case.id] = prepare_context(case, 0, "cpu")
    ctx = _CONTEXTS[case.id]
    ctx.ref_charged = False
    return ctx


def _verdict(scenario: str, engine, monkeypatch, backend="sdpa-cpu"):
    return engine_verdict(_ctx(CASES[scenario]), engine, monkeypatch, backend)


# ------------------------------------------------------------------ scenarios
def test_graph_scenarios_are_engine_cases():
    assert set(CASES) == set(GRAPH_SCENARIOS) and not set(CASES) & set(GRAPH_FINDINGS)
    suite = {c.id for c in get_suite("engines") if c.engine == "sglang_fa" and c.graph}
    assert suite == {c.id for c in CASES.values()}
    for case in CASES.values():
        assert case.graph_fill == FILL_VALUE == 1 and max(case.graph[1:]) <= case.graph[0]
        assert sorted(set(case.graph)) == list(range(1, case.graph[0] + 1))  # every batch size up to the bucket
        assert AttentionCase.from_json(case.to_json()) == case


@pytest.mark.parametrize("scenario", list(GRAPH_SCENARIOS))
def test_graph_scenarios_pass_on_cpu(scenario):
    res = check_backend(_ctx(CASES[scenario]), get_backend("sdpa-cpu"))
    assert res.status is Status.PASS, res.reason
    graph = res.extra["graph"]
    assert graph["engine_level"] and not graph["captured"] and graph["bucket"]["fill"] == 1
    assert [r["requests"] for r in graph["replays"]] == list(CASES[scenario].graph)
    assert all(r["vs_eager"]["equal"] and r["vs_plain"]["equal"] for r in graph["replays"])
    assert any("not captured" in n for n in res.extra["notes"])


def test_graph_scenario_passes_on_flex():
    res = check_backend(_ctx(CASES["graph_verify_topk"]), get_backend("flex-cpu"))
    assert res.status is Status.PASS, res.reason


# ------------------------------------------------------------------ the metadata as the seed writes it
def _state(name: str, bs: int) -> tuple[CudaGraphState, RunnerBuffers]:
    sc = GRAPH_SCENARIOS[name]
    state = CudaGraphState(sc)
    state.init_cuda_graph_state(bs)
    return state, RunnerBuffers.allocate(bs, bs * sc.topk * sc.num_steps, "cpu")


def test_decode_capture_views_and_replay_updates():
    state, runner = _state("graph_decode", 4)
    md, mde = state.capture(4, runner.seq_lens)
    assert mde is None and md.cache_seqlens_int32 is runner.seq_lens  # .to(int32) of the runner's int32 buffer
    assert md.page_table.data_ptr() == state.decode_cuda_graph_metadata["page_table"].data_ptr()
    r2t = torch.arange(6 * 512, dtype=torch.int32).view(6, 512)
    runner.prepare([3, 1, 4, 2], [300, 41, 129, 7], None)
    state.replay(4, r2t, runner)
    assert md.cu_seqlens_k.tolist() == [0, 300, 341, 470, 477] and md.max_seq_len_k == 300
    assert md.page_table[0, :19].tolist() == (r2t[3, ::16][:19] // 16).tolist()
    before = md.page_table.clone()
    runner.prepare([5, 0], [33, 17], None)  # a shorter batch: padded rows at the fill value, stale pool indices
    state.replay(4, r2t, runner)
    assert runner.seq_lens.tolist() == [33, 17, 1, 1] and runner.req_pool_indices.tolist() == [5, 0, 4, 2]
    assert md.cu_seqlens_k.tolist() == [0, 33, 50, 51, 52]
    assert torch.equal(md.page_table[:, 3:], before[:, 3:])  # columns past max_seq_pages keep earlier values


def test_topk_verify_expand_table_is_the_eager_builders():
    from conformance.engines.sglang.graph import _custom_mask
    from conformance.engines.sglang.metadata import Step

    state, runner = _state("graph_verify_topk", 3)
    state.capture(3, runner.seq_lens)
    r2t = torch.randperm(3 * 256, generator=torch.Generator().manual_seed(1)).to(torch.int32).view(3, 256)
    sc = GRAPH_SCENARIOS["graph_verify_topk"]
    runner.prepare([2, 0], [30, 57], None)
    md, mde = state.replay(3, r2t, runner, _custom_mask(sc, [30, 57]))
    eager_sc = SCENARIOS["spec_verify_topk"]  # the same tree over (30, 57) committed tokens
    step = Step(eager_sc, 1, 256, r2t[[2, 0]], [30, 57], _custom_mask(sc, [30, 57]))
    want = ENGINE._expand_metadata(step, 4)
    assert mde.page_table[:8].tolist() == want.page_table.tolist()
    assert mde.cache_seqlens_int32[:8].tolist() == want.cache_seqlens_int32 == [1, 2, 2, 3] * 2
    assert mde.cache_seqlens_int32[8:].tolist() == [4] * 4  # the padded request: mask index 0 (all visible)


# ------------------------------------------------------------------ planted bugs
class StaleMaxPages(CudaGraphState):
    """``max_seq_len_k`` not refreshed: the page-table columns copied are the previous batch's ``max_seq_pages``."""

    previous = 1

    def _check_pages(self, name, bs, max_len, table, per_page):
        pages = super()._check_pages(name, bs, max_len, table, per_page)
        stale, self.previous = self.previous, pages
        return stale


class StaleDraftExpand(CudaGraphState):
    """The top-k > 1 draft decode's expand table (``out_cache_loc``) kept from the first replay."""

    first = None

    def replay(self, bs, req_to_token, runner, custom_mask=None):
        md, mde = super().replay(bs, req_to_token, runner, custom_mask)
        if self.first is None:
            self.first = mde.page_table.clone()
        else:
            mde.page_table.copy_(self.first)
        return md, mde


def _with_state(cls):
    eng = SGLangFlashAttention()
    eng.graph_state = cls
    return eng


class SwappedMerge(SGLangFlashAttention):
    """The top-k > 1 merge pairing each call's output with the other call's LSE."""

    def merge_state(self, o_a, s_a, o_b, s_b):
        return super().merge_state(o_a, s_b, o_b, s_a)


@pytest.mark.parametrize(
    "engine, scenario",
    [
        (_with_state(StaleMaxPages), "graph_decode"),
        (_with_state(StaleMaxPages), "graph_draft_decode"),
        (_with_state(StaleMaxPages), "graph_verify_chain"),
        (_with_state(StaleDraftExpand), "graph_draft_decode_topk"),
        (SwappedMerge(), "graph_verify_topk"),
    ],
    ids=["stale-pages-decode", "stale-pages-draft", "stale-pages-verify", "stale-expand", "swapped-merge"],
)
def test_planted_graph_bugs_fail(engine, scenario, monkeypatch):
    res = _verdict(scenario, engine, monkeypatch)
    assert res.status is Status.FAIL, res.reason


class CaptureTimeState(SdpaCpuBackend):
    """A graph call that keeps state from its first run: later runs nudge the LSE by 1e-6 (within tolerance, so
    only the bitwise comparison with a freshly prepared eager call sees it)."""

    def prepare_graph(self, case, inputs):
        inner, runs = super().prepare_graph(case, inputs), []

        def run() -> KernelOutput:
            res = inner()
            runs.append(1)
            return res if len(runs) == 1 else KernelOutput(res.out, res.lse + 1e-6)

        return run


class GraphPathDiffers(SdpaCpuBackend):
    """The graph call always differs from the plain call by 1e-6 in the LSE (equal to itself run eagerly); a kernel
    whose call takes the split count (SDPA's does not), so a pinned one promises graph = own call."""

    batch_invariance_via = "num_splits"

    def prepare_graph(self, case, inputs):
        inner = super().prepare_graph(case, inputs)
        return lambda: (lambda r: KernelOutput(r.out, r.lse + 1e-6))(inner())


def test_bitwise_check_catches_capture_time_state():
    res = check_backend(_ctx(CASES["graph_decode"]), CaptureTimeState())
    assert res.status is Status.FAIL and "differs from the same calls run eagerly" in res.reason, res.reason
    assert res.stats is not None and not res.stats.failed_checks  # the numbers alone pass


def test_graph_vs_own_call_fails_only_with_pinned_splits():
    pinned = check_backend(_ctx(CASES["graph_decode_deterministic"]), GraphPathDiffers())
    assert pinned.status is Status.FAIL and "num_splits pinned to 1" in pinned.reason, pinned.reason
    free = check_backend(_ctx(CASES["graph_decode"]), GraphPathDiffers())
    assert free.status is Status.PASS and free.extra["graph"]["graph_vs_eager_kept"] is False


class NoGraph(SdpaCpuBackend):
    accepts = SdpaCpuBackend.accepts - {"graph"}
    refused = {**SdpaCpuBackend.refused, "graph": "this adapter reads lengths on the host"}


def test_adapter_without_graph_is_unsupported_with_its_reason():
    res = check_backend(_ctx(CASES["graph_decode"]), NoGraph())
    assert res.status is Status.UNSUPPORTED and res.reason == "graph: this adapter reads lengths on the host"


# ------------------------------------------------------------------ bad input and findings
def test_bad_input_raises_naming_the_field_and_the_bucket():
    case = CASES["graph_decode"]
    too_big = case.replace(graph=(2, 3, 4, 1))
    with pytest.raises(ValueError, match=r"graph: replay batch 1 has 3 requests, more than the captured bucket bs=2"):
        ENGINE.check(too_big)
    state, runner = _state("graph_decode", 2)
    with pytest.raises(ValueError, match=r"graph: a replay batch of 3 requests exceeds the captured bucket bs=2"):
        runner.prepare([0, 1, 2], [5, 5, 5], None)
    state.capture(2, runner.seq_lens)
    runner.prepare([0], [600], None)  # 38 pages; the bucket's table holds 32 (max_context_len 512)
    with pytest.raises(ValueError, match=r"seq_lens: .* needs 38 columns .* bucket bs=2 holds 32"):
        state.replay(2, torch.zeros(1, 1024, dtype=torch.int32), runner)
    eager = ENGINE._case("decode", SCENARIOS["decode"]).replace(graph=(2, 1), graph_fill=1)
    with pytest.raises(ValueError, match=r"graph: scenario 'decode' is an eager step"):
        ENGINE.check(eager)  # never run eagerly as if it were a graph replay
    verify = CASES["graph_verify_chain"]
    with pytest.raises(ValueError, match=r"requests\[0\]: q_len must be 4"):
        ENGINE.check(verify.replace(requests=tuple((1, kv) for _, kv in verify.requests)))


def test_finding_local_capture_view_is_one_page_wide(monkeypatch):
    """Capture sizes the ``local_block_table`` view by the capture batch (``seq_lens`` at 1: the chunk adjusted to
    one page); with chunk 32 over pages of 16 the replays need two columns: refused, naming the field."""
    case = graph_case("sglang_fa", "graph_local_decode_wide_chunk", GRAPH_FINDINGS["graph_local_decode_wide_chunk"])
    res = engine_verdict(prepare_context(case, 0, "cpu"), ENGINE, monkeypatch)
    assert res.status is Status.ERROR
    assert "local_block_table: local_seqused_k up to 32 needs 2 columns of 16" in res.reason
    assert "captured for the bucket bs=4 has 1" in res.reason
    state, runner = _state("graph_local_decode", 4)
    md, _ = state.capture(4, runner.seq_lens)
    assert md.local_attn_metadata.local_block_table.shape == (4, 1)  # chunk 16 = one page: fits every replay
    assert dataclasses.is_dataclass(md)
