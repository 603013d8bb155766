"""Decode context parallelism through the kernel's own cp arguments: ``conformance/engines/vllm_v1/dcp_kernel.py``.

* the plan: one causal call per rank over its interleave-1 share of every key, with ``cp_world`` / ``cp_rank``, the
  shares adding up to the step's keys; the forward hands the kernel ``cp_tot_seqused_k = seq_lens``;
* the scenarios (spec decode and extend, ``q_len > 1``) pass in the single-process replay at worlds 2, 3 and 4
  (sdpa-cpu; both CPU backends at the scenario's world: ``test_vllm_v1_fa.py``; across gloo processes at worlds 2,
  3 and 4: ``test_vllm_v1_dcp.py``, which runs every DCP scenario);
* planted bugs fail: the kernel's rule with the rank offset off by one or the per-rank length in place of
  ``tot_seqlen_k`` (the verdict, error ratio > 3), a cache placed with interleave 4 under the kernel's interleave-1
  rule (the verdict), a runner whose local lengths follow interleave 4 (the shard check, naming
  ``cp_tot_seqused_k``); a scenario asking for kernel cp with interleave 4 is rejected.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import attnfast._torch_common as torch_common
import attnfast.sdpa as sdpa_module
from attnfast.registry import get_backend
from conformance.engines.base import backend_kernel
from conformance.engines.vllm_v1 import SCENARIOS, Scenario, ThreadGroup, VllmV1FlashAttention, dcp_rank_forward
from conformance.engines.vllm_v1.dcp_dist import main
from conformance.engines.vllm_v1.scenarios import _r
from conformance.records import Status
from conformance.verdict.check import compare, prepare_context
from conformance.verdict.tolerance import resolve
from tests.conformance.engines.recorder import Recorder, engine_verdict

ENGINE = VllmV1FlashAttention()
KCP = {c.scenario: c for c in ENGINE.cases() if c.scenario in SCENARIOS and SCENARIOS[c.scenario].kernel_cp}


@pytest.fixture(scope="module")
def contexts():
    return {name: prepare_context(case, 0, "cpu") for name, case in KCP.items()}


def test_the_scenarios_exercise_what_two_calls_cannot():
    assert set(KCP) == {"dcpk2_spec", "dcpk3_extend"}
    for name, case in KCP.items():
        step = ENGINE.step(case)
        assert step.interleave == 1 and step.dcp == SCENARIOS[name].dcp
        assert max(step.q_lens) > 1 and any(c > 0 for c in step.cached), "extend / spec decode over a context"


@pytest.mark.parametrize("name", ["dcpk2_spec", "dcpk3_extend"])
@pytest.mark.parametrize("world", [2, 3, 4])
def test_plan_is_one_cp_call_per_rank_over_its_share(name, world):
    case = KCP[name]
    step = ENGINE.step(case, world=world)
    plan = dict(ENGINE.calls(case, step))
    assert len(plan) == world
    shares = []
    for rank, (label, call) in enumerate(plan.items()):
        assert label.startswith(f"rank {rank}: all keys") and call.causal and not call.engine
        assert (call.cp_world, call.cp_rank, call.num_heads) == (world, rank, case.num_heads)
        assert call.q_lens == step.q_lens
        assert call.kv_lens == [len(range(rank, t, world)) for t in step.kv_lens]
        shares.append(call.kv_lens)
    assert [sum(s) for s in zip(*shares)] == step.kv_lens


@pytest.mark.parametrize("name", ["dcpk2_spec", "dcpk3_extend"])
def test_forward_hands_the_kernel_the_totals(name, contexts):
    rec = Recorder()
    out = ENGINE.forward(KCP[name], contexts[name].inputs, rec)
    step = ENGINE.step(KCP[name])
    assert len(rec.calls) == step.dcp
    for call in rec.calls:
        assert call.inputs.cp_tot_seqused_k.tolist() == step.kv_lens
        assert call.inputs.cp_tot_seqused_k.dtype == torch.int32
    ctx = contexts[name]
    stats = compare(ctx.ref, ctx.base, out, resolve(KCP[name], "sdpa-cpu"))
    assert not stats.failed_checks and stats.error_ratio < 1, stats


@pytest.mark.parametrize("name", ["dcpk2_spec", "dcpk3_extend"])
def test_replay_passes_in_one_process_at_several_worlds(name, contexts):
    """sdpa-cpu at worlds 2-4 (both CPU backends at the scenario's own world: ``test_vllm_v1_fa``)."""
    backend = "sdpa-cpu"
    ctx, kernel_backend = contexts[name], get_backend(backend)
    kernel = backend_kernel(kernel_backend, "cpu")
    inputs = ENGINE.layer_inputs(ctx.case, ctx.inputs)
    for world in (2, 3, 4):
        step = ENGINE.step(ctx.case, world=world)
        results = ThreadGroup(world).run(lambda r, g: dcp_rank_forward(ENGINE, ctx.case, inputs, step, r, g, kernel))
        out = ENGINE._restore(step, torch.cat([o for o, _ in results], 1), torch.cat([x for _, x in results], 0))
        stats = compare(ctx.ref, ctx.base, out, resolve(ctx.case, backend))
        print(f"\n{name} world {world} {backend}: error ratio {stats.error_ratio:.3f}")
        assert not stats.failed_checks, (world, stats)


# ---------------------------------------------------------------------------------------------- planted bugs
def _rank_plus_one(case, sq, sk, device="cpu", cp_total=None):
    """The kernel's rule with local key j read as absolute key j * W + rank + 1."""
    if case.cp_world == 1:
        return _PLAIN(case, sq, sk, device, cp_total)
    i = torch.arange(sq, device=device)[:, None]
    a = torch.arange(sk, device=device)[None, :] * case.cp_world + case.cp_rank + 1
    return (a <= i + cp_total - sq) & (a < cp_total)


def _per_rank_total(case, sq, sk, device="cpu", cp_total=None):
    """The kernel's rule with ``tot_seqlen_k`` missing: the rank's own key count in its place."""
    if case.cp_world == 1:
        return _PLAIN(case, sq, sk, device, cp_total)
    i = torch.arange(sq, device=device)[:, None]
    a = torch.arange(sk, device=device)[None, :] * case.cp_world + case.cp_rank
    return (a <= i + sk - sq) & (a < sk)


_PLAIN = torch_common.visibility


@pytest.mark.parametrize("bug", [_rank_plus_one, _per_rank_total], ids=["rank_plus_one", "per_rank_total"])
@pytest.mark.parametrize("name", ["dcpk2_spec", "dcpk3_extend"])
def test_planted_kernel_rule_bugs_fail(name, bug, contexts, monkeypatch):
    monkeypatch.setattr(torch_common, "visibility", bug)
    monkeypatch.setattr(sdpa_module, "visibility", bug)
    res = engine_verdict(contexts[name], ENGINE, monkeypatch)
    print(f"\n{bug.__name__} on {name}: {res.status.value}, error ratio {res.stats.error_ratio:.3g}")
    assert res.status is Status.FAIL and res.stats.error_ratio > 3, res.reason


class _CacheInterleave4(VllmV1FlashAttention):
    """The runner places the cache with ``cp_kv_cache_interleave_size`` 4 (tokens ``t // 4 % world``) while the
    kernel-cp call reads the rank's keys as the kernel's interleave-1 shard."""

    def slot(self, step, b, pos, rank=0):
        return super().slot(dataclasses.replace(step, interleave=4), b, pos, rank)


class _RunnerInterleave4(VllmV1FlashAttention):
    """The runner configured with ``cp_kv_cache_interleave_size`` 4 throughout (placement and local lengths),
    calling the kernel whose cp rule is interleave 1."""

    def step(self, case, world=None):
        return dataclasses.replace(super().step(case, world), interleave=4)


@pytest.mark.parametrize("name", ["dcpk2_spec", "dcpk3_extend"])
def test_planted_interleave_4_under_the_interleave_1_rule(name, contexts, monkeypatch):
    res = engine_verdict(contexts[name], _CacheInterleave4(), monkeypatch)
    print(f"\n_CacheInterleave4 on {name}: {res.status.value}, error ratio {res.stats.error_ratio:.3g}")
    assert res.status is Status.FAIL and res.stats.error_ratio > 3, res.reason
    res = engine_verdict(contexts[name], _RunnerInterleave4(), monkeypatch)
    print(f"_RunnerInterleave4 on {name}: {res.status.value}: {res.reason}")
    assert res.status is Status.ERROR and "cp_tot_seqused_k" in res.reason and "interleave-1" in res.reason


def test_scenario_rejects_kernel_cp_without_interleave_1_or_a_group():
    with pytest.raises(ValueError, match="kernel_cp needs dcp >= 2 and interleave 1"):
        Scenario(_r((1, 9)), dcp=2, interleave=4, kernel_cp=True)
    with pytest.raises(ValueError, match="kernel_cp needs dcp >= 2 and interleave 1"):
        Scenario(_r((1, 9)), kernel_cp=True)


def test_script_kernel_cp_selects_those_scenarios(monkeypatch, capsys):
    seen = {}

    def fake(cases, worlds, backend, device, seed):
        seen.update(cases=[c.scenario for c in cases], worlds=worlds)
        return [
            dict(status="pass", scenario=c.scenario, world=w, backend=backend, device=device, error_ratio=0.5,
                 single_status="pass", single_error_ratio=0.5, max_abs_vs_single=0.0, failed_checks=[])
            for c in cases for w in worlds
        ]  # fmt: skip

    monkeypatch.setattr("conformance.engines.vllm_v1.dcp_dist.run_dcp_worlds", fake)
    argv = ["--world", "2", "--world", "3", "--backend", "fa3-vllm", "--device", "cuda", "--kernel-cp"]
    assert main(argv) == 0
    assert seen == dict(cases=["dcpk2_spec", "dcpk3_extend"], worlds=[2, 3])
    assert capsys.readouterr().out.count("PASS dcpk") == 4
    with pytest.raises(SystemExit):
        main(["--kernel-cp", "--scenario", "dcp2_decode"])
