"""Seed 001's decode context parallelism: ``conformance/engines/vllm_v1/dcp.py``.

* the placement (``get_dcp_local_seq_lens``, the DCP slot mapping) agrees with the rule "token ``t`` on rank
  ``(t // interleave) % world``", every token on exactly one rank;
* ``cp_lse_ag_out_rs`` over the in-process group equals the reference merge of the ranks' partials;
* the replay across real processes (torch.distributed gloo, 2, 3 and 4 ranks, one spawn with subgroups) passes
  the verdict and agrees with the single-process replay (``-s`` prints the results), the seed's two-call DCP and
  the kernel-cp variant (``test_vllm_v1_dcp_kernel.py``) alike;
* a planted interleave bug fails.
"""

from __future__ import annotations

import math

import pytest
import torch

from attnref import merge_many
from conformance.engines.vllm_v1 import (
    SCENARIOS,
    ThreadGroup,
    VllmV1FlashAttention,
    correct_attn_out,
    context_kv_lens,
    cp_lse_ag_out_rs,
    get_dcp_local_seq_lens,
)
from conformance.engines.vllm_v1.dcp_dist import main, run_dcp_worlds
from conformance.records import Status
from conformance.verdict.check import prepare_context
from tests.conformance.engines.recorder import engine_verdict

ENGINE = VllmV1FlashAttention()
DCP = [c for c in ENGINE.cases() if c.scenario in SCENARIOS and SCENARIOS[c.scenario].dcp > 1]


@pytest.mark.parametrize("world,interleave", [(2, 1), (3, 4), (4, 16), (3, 1)])
def test_local_seq_lens_follow_the_interleave_rule(world, interleave):
    lens = torch.arange(0, 150, dtype=torch.int32)
    for rank in range(world):
        got = get_dcp_local_seq_lens(lens, world, rank, interleave).tolist()
        want = [sum(1 for t in range(n) if t // interleave % world == rank) for n in lens.tolist()]
        assert got == want


@pytest.mark.parametrize("case", DCP, ids=[c.scenario for c in DCP])
@pytest.mark.parametrize("world", [2, 3, 4])
def test_every_token_has_one_slot_on_its_rank(case, world):
    step = ENGINE.step(case, world=world)
    for b, kv in enumerate(step.kv_lens):
        local = {r: [] for r in range(world)}
        for t in range(kv):
            slots = [ENGINE.slot(step, b, t, r) for r in range(world)]
            owners = [r for r, s in enumerate(slots) if s >= 0]
            assert owners == [t // step.interleave % world]
            local[owners[0]].append(slots[owners[0]])
        for r, slots in local.items():
            bs = step.block_size  # local position i sits at table[i // bs] * bs + i % bs
            want = [step.table[b][i // bs] * bs + i % bs for i in range(len(slots))]
            assert slots == want


def test_lse_corrected_merge_equals_the_reference_merge():
    gen = torch.Generator().manual_seed(0)
    world, tokens, heads, d = 3, 5, 6, 8
    outs = [torch.randn(tokens, heads, d, generator=gen) for _ in range(world)]
    lses = [torch.randn(tokens, heads, generator=gen) * 3 for _ in range(world)]
    lses[1][0] = -math.inf  # rank 1 holds none of token 0's keys
    lses[2][1] = math.inf  # FA2's mark of an empty part reads as -inf
    outs[1][0] = outs[2][1] = 0
    lses[0][2] = lses[1][2] = lses[2][2] = -math.inf  # no key anywhere: factor 0
    results = ThreadGroup(world).run(lambda r, g: cp_lse_ag_out_rs(outs[r], lses[r], g, return_lse=True))
    out = torch.cat([o for o, _ in results], dim=1)
    lse = torch.cat([x for _, x in results], dim=1)
    clean = [torch.where(x == math.inf, -math.inf, x).transpose(0, 1) for x in lses]
    ref = merge_many(outs, clean)
    torch.testing.assert_close(out, ref.out, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(lse.transpose(0, 1), ref.lse, rtol=1e-6, atol=1e-6)
    assert (out[2] == 0).all()
    corrected, glse = correct_attn_out(outs[0], torch.stack(lses), 0)
    assert corrected.shape == outs[0].shape and glse.shape == (tokens, heads)


class _InterleaveIgnored(VllmV1FlashAttention):
    """The DCP owner rule without the interleave: token t written on rank t % world."""

    def _dcp_owner(self, offset, world, interleave):
        return offset % world


@pytest.mark.parametrize("scenario", ["dcp3_mixed", "dcp4_interleave16"])
def test_planted_interleave_bug_fails(scenario, monkeypatch):
    case = next(c for c in DCP if c.scenario == scenario)
    ctx = prepare_context(case, 0, "cpu")
    res = engine_verdict(ctx, _InterleaveIgnored(), monkeypatch)
    print(f"\n_InterleaveIgnored on {scenario}: {res.status.value}, error ratio {res.stats.error_ratio:.3g}")
    assert res.status is Status.FAIL and res.stats.error_ratio > 3, res.reason


@pytest.mark.parametrize("case", DCP, ids=[c.scenario for c in DCP])
@pytest.mark.parametrize("world", [2, 3, 4])
def test_builder_dcp_context_lengths_and_their_bound(case, world):
    """The builder's ``dcp_context_kv_lens`` are each rank's share of every context (counted token by token from
    the rule), and ``max_dcp_context_kv_len`` is the seed's ``ceil(max_seq_len / (world * interleave)) *
    interleave``, which covers every one of them."""
    step = ENGINE.step(case, world=world)
    inter = step.interleave
    want_bound = -(-max(step.kv_lens) // (world * inter)) * inter
    for rank in range(world):
        meta = ENGINE.builder(step, rank).build(0, ENGINE.common_metadata(case, step, rank, "cpu"))
        shares = [sum(1 for t in range(k - q) if t // inter % world == rank) for q, k in zip(step.q_lens, step.kv_lens)]
        assert meta.dcp_context_kv_lens.tolist() == shares
        assert meta.max_dcp_context_kv_len == want_bound >= max(shares)
        assert context_kv_lens(meta, rank) == shares


class _PlantedBuild:
    """The runner's builder with one field of what ``build`` returns recomputed by ``plant(builder, common)``."""

    def __init__(self, builder, field, plant):
        self.builder, self.field, self.plant = builder, field, plant

    def build(self, common_prefix_len, common):
        meta = self.builder.build(common_prefix_len, common)
        setattr(meta, self.field, self.plant(self.builder, common))
        return meta


class _BoundWithoutInterleave(VllmV1FlashAttention):
    """``max_dcp_context_kv_len`` as ``ceil(max_seq_len / world)``: the interleave left out of the partitions."""

    def builder(self, step, rank=0):
        def bound(b, common):
            return -(-common.max_seq_len // b.dcp_world_size)

        return _PlantedBuild(super().builder(step, rank), "max_dcp_context_kv_len", bound)


class _ContextIsSeqLens(VllmV1FlashAttention):
    """``dcp_context_kv_lens`` from ``seq_lens`` (the query lengths not subtracted): the context call reads the
    step's new keys too, unmasked."""

    def builder(self, step, rank=0):
        def lens(b, common):
            return get_dcp_local_seq_lens(common.seq_lens, b.dcp_world_size, b.dcp_rank, b.interleave)

        return _PlantedBuild(super().builder(step, rank), "dcp_context_kv_lens", lens)


@pytest.mark.parametrize("scenario", ["dcp3_mixed", "dcp4_interleave16"])
def test_a_bound_short_of_a_local_context_is_refused_naming_the_field(scenario, monkeypatch):
    """The seed passes ``max_dcp_context_kv_len`` as the context call's ``max_seqlen_k``: a kernel bounds its key
    loop and splits by it, so one shorter than a rank's local context would drop keys (here 30 < 32 and 75 < 80)."""
    case = next(c for c in DCP if c.scenario == scenario)
    res = engine_verdict(prepare_context(case, 0, "cpu"), _BoundWithoutInterleave(), monkeypatch)
    assert res.status is Status.ERROR, res.reason
    assert "max_dcp_context_kv_len" in res.reason and "longest local context" in res.reason, res.reason


def test_the_context_call_reads_the_builders_lengths(monkeypatch):
    case = next(c for c in DCP if c.scenario == "dcp3_mixed")
    res = engine_verdict(prepare_context(case, 0, "cpu"), _ContextIsSeqLens(), monkeypatch)
    print(f"\n_ContextIsSeqLens on dcp3_mixed: {res.status.value}, error ratio {res.stats.error_ratio:.3g}")
    assert res.status is Status.FAIL and res.stats.error_ratio > 3, res.reason


def test_in_process_ranks_call_the_kernel_one_at_a_time(monkeypatch):
    """FA4 on the H100 aborted (SIGABRT) when three rank threads met its first, JIT-compiled, call together: the
    in-process group runs the ranks' kernel calls one at a time, and the result stays right."""
    import threading
    import time

    from attnfast.sdpa import SdpaCpuBackend

    state = {"active": 0, "most": 0, "calls": 0}
    guard = threading.Lock()

    class Watched(SdpaCpuBackend):
        def prepare(self, case, inputs):
            with guard:
                state["active"] += 1
                state["calls"] += 1
                state["most"] = max(state["most"], state["active"])
            time.sleep(0.02)  # a compile's worth of overlap, were the calls concurrent
            try:
                return super().prepare(case, inputs)
            finally:
                with guard:
                    state["active"] -= 1

    case = next(c for c in DCP if c.scenario == "dcp3_mixed")
    res = engine_verdict(prepare_context(case, 0, "cpu"), ENGINE, monkeypatch, Watched())
    assert res.status is Status.PASS, res.reason
    assert state["calls"] >= 6 and state["most"] == 1, state


@pytest.mark.slow
@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not built in")
def test_dcp_across_gloo_processes_with_2_3_4_ranks():
    results = run_dcp_worlds(DCP, [2, 3, 4], "sdpa-cpu", "cpu")
    assert len(results) == 3 * len(DCP)
    for r in results:
        print(
            f"\n{r['scenario']} world {r['world']}: {r['status']} error ratio {r['error_ratio']:.3f}, single-process "
            f"{r['single_status']} {r['single_error_ratio']:.3f}, max |dist - single| {r['max_abs_vs_single']:.2e}"
        )
        assert r["status"] == "pass" and r["single_status"] == "pass", r
        assert r["max_abs_vs_single"] <= 2e-2 and r["lse_max_abs_vs_single"] <= 1e-4, r
    assert {r["world"] for r in results} == {2, 3, 4}
    kernel_cp = {(r["scenario"], r["world"]) for r in results if SCENARIOS[r["scenario"]].kernel_cp}
    assert kernel_cp == {(s, w) for s in ("dcpk2_spec", "dcpk3_extend") for w in (2, 3, 4)}  # one cp call per rank
    with pytest.raises(ValueError, match="DCP world 5 needs"):
        ENGINE.step(DCP[0], world=5)


def test_script_prints_one_verdict_per_run(monkeypatch, capsys):
    seen = {}

    def fake(cases, worlds, backend, device, seed):
        seen.update(cases=[c.scenario for c in cases], worlds=worlds, backend=backend, device=device)
        return [
            dict(status="pass", scenario="dcp2_decode", world=2, backend=backend, device=device, error_ratio=0.3,
                 single_status="pass", single_error_ratio=0.3, max_abs_vs_single=0.0, failed_checks=[])
        ]  # fmt: skip

    monkeypatch.setattr("conformance.engines.vllm_v1.dcp_dist.run_dcp_worlds", fake)
    assert main(["--world", "2", "--backend", "fa3-vllm", "--device", "cuda", "--scenario", "dcp2_decode"]) == 0
    assert seen == dict(cases=["dcp2_decode"], worlds=[2], backend="fa3-vllm", device="cuda")
    assert capsys.readouterr().out.startswith("PASS dcp2_decode world=2 fa3-vllm cuda: error ratio 0.300")
