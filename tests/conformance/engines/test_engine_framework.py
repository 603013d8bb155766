"""The engine-replay framework, the engine merge, and seed 004 (vLLM V1 MLA prefill).

* ``merge_attn_states`` (vLLM's semantics) agrees with the reference merge ``attnref.merge_states`` on every
  row with a key on either side, reads ``+inf`` as ``-inf`` (FA2's mark of an empty part), and gives NaN
  where both sides are empty (the hazard of vLLM's formula, which compositions must avoid);
* the seed 004 and merge replays pass on the CPU backends, every call ``forward`` makes is one ``plan``
  declares, and planted engine bugs (V padding kept, merge without LSE, a context chunk dropped) fail;
* engine cases round-trip through JSON with their ids, and a backend that refuses one call makes the whole
  replay unsupported with that call's label.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from attnfast.base import Backend, KernelOutput
from attnfast.registry import get_backend
from attnref import merge_states
from conformance.cases.case import AttentionCase
from conformance.suites.registry import get_suite
from conformance.engines import ENGINES, get_engine
from conformance.engines.merge import MergeStates, merge_attn_states, merge_many_attn_states
from conformance.engines.vllm_mla import SCENARIOS, VllmMLAPrefill
from conformance.records import Status
from conformance.verdict.check import check_backend, prepare_context
from tests.conformance.engines.recorder import Recorder, engine_verdict

OUR = [c for c in get_suite("engines") if c.engine in ("merge", "vllm_mla_prefill")]


# ------------------------------------------------------------------ the engine merge
def _parts(n: int = 9, h: int = 3, d: int = 16, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    o_a, o_b = torch.randn(n, h, d, generator=gen), torch.randn(n, h, d, generator=gen)
    l_a, l_b = torch.randn(h, n, generator=gen) * 3, torch.randn(h, n, generator=gen) * 3
    return o_a, l_a, o_b, l_b


def test_merge_matches_the_reference_merge():
    o_a, l_a, o_b, l_b = _parts()
    out, lse = merge_attn_states(o_a, l_a, o_b, l_b)
    ref = merge_states(o_a, l_a, o_b, l_b)
    torch.testing.assert_close(out, ref.out, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(lse, ref.lse, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("empty", [-math.inf, math.inf], ids=["fa3_minus_inf", "fa2_plus_inf"])
def test_merge_reads_an_empty_part_as_weight_zero(empty):
    o_a, l_a, o_b, l_b = _parts()
    l_a[:, ::2] = empty  # every other row: the first part saw no key (its output is 0 by convention)
    o_a[::2] = 0
    out, lse = merge_attn_states(o_a, l_a, o_b, l_b)
    torch.testing.assert_close(out[::2], o_b[::2])
    torch.testing.assert_close(lse[:, ::2], l_b[:, ::2])
    ref = merge_states(o_a, torch.where(torch.isinf(l_a), -math.inf, l_a), o_b, l_b)
    torch.testing.assert_close(out, ref.out, rtol=1e-6, atol=1e-6)


def test_merge_of_two_empty_parts_is_nan_where_the_reference_gives_zero():
    """vLLM's formula: max(-inf, -inf) = -inf, then -inf - -inf = NaN (csrc/attention/merge_attn_states.cu)."""
    o_a, l_a, o_b, l_b = _parts()
    l_a[:, 0] = l_b[:, 0] = -math.inf
    o_a[0] = o_b[0] = 0
    out, lse = merge_attn_states(o_a, l_a, o_b, l_b)
    assert torch.isnan(out[0]).all() and torch.isnan(lse[:, 0]).all()
    assert torch.isfinite(out[1:]).all()
    ref = merge_states(o_a, l_a, o_b, l_b)
    assert (ref.out[0] == 0).all() and torch.isneginf(ref.lse[:, 0]).all()


def test_seed_004_chunk_loop_with_a_context_free_request_would_merge_two_empty_parts():
    """The hazard behind the mixed_context scenario's single chunk: with two context chunks, a request with no
    context gets -inf from both chunk calls and vLLM's pairwise merge turns its rows into NaN."""
    o = torch.zeros(2, 1, 4)
    lse = torch.full((1, 2), -math.inf)
    out, _ = merge_many_attn_states([o, o], [lse, lse])
    assert torch.isnan(out).all()


# ------------------------------------------------------------------ engine cases and the registry
def test_engine_cases_round_trip_and_name_engine_and_scenario():
    assert {c.engine for c in OUR} == {"merge", "vllm_mla_prefill"}
    for case in OUR:
        again = AttentionCase.from_json(json.loads(json.dumps(case.to_json())))
        assert again == case and again.id == case.id
        assert case.id.startswith(f"{case.engine}-{case.scenario}_")
    with pytest.raises(ValueError, match="engine and scenario must be set together"):
        AttentionCase(requests=((1, 1),), num_heads=1, num_kv_heads=1, head_dim=8, engine="merge")
    with pytest.raises(ValueError, match="engine must be one of"):
        get_engine("no-such-engine")
    assert set(ENGINES) >= {"vllm_diff", "vllm_v1_fa", "vllm_v0_fa", "sglang_fa", "vllm_mla_prefill", "merge"}


@pytest.mark.parametrize("case", OUR, ids=[c.id for c in OUR])
@pytest.mark.parametrize("backend", ["sdpa-cpu", "flex-cpu"])
def test_replays_pass_on_the_cpu_backends(case, backend):
    res = check_backend(prepare_context(case, 0, "cpu"), get_backend(backend))
    assert res.status is Status.PASS, res.reason
    assert res.extra["engine"]["engine"] == case.engine and res.extra["notes"], "the record lists the calls"


@pytest.mark.parametrize("case", OUR, ids=[c.id for c in OUR])
def test_every_call_is_planned(case):
    engine = get_engine(case.engine)
    rec = Recorder()
    ctx = prepare_context(case, 0, "cpu")
    engine.forward(case, ctx.inputs, rec)
    planned = {(label, c) for label, c in engine.plan(case)}
    assert rec.calls and all((call.label, call.case) in planned for call in rec.calls)
    assert all(call.inputs.case is call.case for call in rec.calls)


# ------------------------------------------------------------------ seed 004 details and planted bugs
class _EqualDimsOnly(Backend):
    """sdpa-cpu that refuses head_dim_v != head_dim, like FA2: the replay must pad V as vLLM does."""

    name = "fake-equal-dims"
    family = "fake"
    devices = ("cpu",)

    def __init__(self) -> None:
        self.inner = get_backend("sdpa-cpu")
        self.seen_dv: list[int] = []

    def supports(self, case, device):
        if case.dv != case.head_dim:
            from attnfast.base import Support

            return Support(False, "dv: needs head_dim_v == head_dim")
        return self.inner.supports(case, device)

    def prepare(self, case, inputs):
        self.seen_dv.append(case.dv)
        return self.inner.prepare(case, inputs)


MLA_CASE = next(c for c in OUR if c.engine == "vllm_mla_prefill" and c.scenario == "context_chunks")


def test_seed_004_pads_v_for_a_kernel_without_192_128():
    backend = _EqualDimsOnly()
    res = check_backend(prepare_context(MLA_CASE, 0, "cpu"), backend)
    assert res.status is Status.PASS, res.reason
    assert set(backend.seen_dv) == {192}


def test_seed_004_chunks_follow_vllms_chunked_context():
    engine = VllmMLAPrefill()
    chunks = engine._chunks(MLA_CASE)
    size = SCENARIOS["context_chunks"][1]
    assert len(chunks) == -(-300 // size)  # request 0 holds 300 context tokens
    assert chunks[0] == [(0, 64), (0, 64), (0, 64)] and chunks[1] == [(64, 128), (64, 70), (64, 128)]
    assert chunks[2] == [(128, 192), (70, 70), (128, 129)]


class _VPadKept(VllmMLAPrefill):
    """Planted: the padded output channels are returned (the strip forgotten)."""

    def _forward(self, case, inputs, kernel, pad):
        res = super()._forward(case, inputs, kernel, pad)
        return KernelOutput(torch.nn.functional.pad(res.out, [0, 64]), res.lse) if pad else res


class _MergeWithoutLse(VllmMLAPrefill):
    """Planted: context and new-token results averaged instead of merged by LSE."""

    def _forward(self, case, inputs, kernel, pad):
        import conformance.engines.vllm_mla.prefill as mod

        real = mod.merge_attn_states
        mod.merge_attn_states = lambda a, la, b, lb: ((a.float() + b.float()).div(2).to(a.dtype), torch.maximum(la, lb))
        try:
            return super()._forward(case, inputs, kernel, pad)
        finally:
            mod.merge_attn_states = real


class _ChunkDropped(VllmMLAPrefill):
    """Planted: the last context chunk is not read."""

    def _chunks(self, case):
        return super()._chunks(case)[:-1]


@pytest.mark.parametrize("bug", [_MergeWithoutLse, _ChunkDropped], ids=lambda b: b.__name__)
def test_seed_004_planted_bugs_fail(bug, monkeypatch):
    res = engine_verdict(prepare_context(MLA_CASE, 0, "cpu"), bug(), monkeypatch)
    assert res.status is Status.FAIL, res.reason
    assert res.stats.error_ratio > 3


def test_seed_004_v_padding_kept_fails(monkeypatch):
    res = engine_verdict(prepare_context(MLA_CASE, 0, "cpu"), _VPadKept(), monkeypatch, _EqualDimsOnly())
    assert res.status is Status.FAIL and res.reason.startswith("shape:"), res.reason


def test_a_refused_call_makes_the_replay_unsupported_with_its_label():
    case = next(c for c in OUR if c.engine == "merge")
    res = check_backend(prepare_context(case, 0, "cpu"), get_backend("fa2"))
    assert res.status is Status.UNSUPPORTED and "runs on cuda" in res.reason
    merge_case = case.replace(window=(8, None))
    with pytest.raises(ValueError, match="without window"):
        MergeStates().plan(merge_case)


def test_report_section_lists_each_engines_scenarios_per_kernel():
    from conformance.reporting.engine_table import engine_sections

    cases = [c for c in OUR if c.scenario in ("split_mid", "context_one_chunk")][:3]
    results = [check_backend(prepare_context(c, 0, "cpu"), get_backend("sdpa-cpu")) for c in cases]
    results.append(check_backend(prepare_context(cases[0], 0, "cpu"), get_backend("fa2")))  # unsupported on cpu
    sections = engine_sections(results, ["fa2", "sdpa-cpu"])
    assert [s["engine"] for s in sections] == sorted({c.engine for c in cases})
    row = next(r for s in sections for r in s["rows"] if r["case_id"] == cases[0].id)
    assert row["cells"][0]["status"] == "unsupported" and row["cells"][1]["text"].startswith("pass ")
    assert row["notes"] and row["notes"][0].startswith("fa2: unsupported: ")
