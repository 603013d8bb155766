"""The context-parallel call (``cp`` feature: vLLM FA3's ``cp_world_size`` / ``cp_rank`` / ``cp_tot_seqused_k``) in
the adapters: who declares it, what ``fa3-vllm`` passes, the CPU backends' rule by hand, and planted rule bugs that the
single-call verdict must catch.

The shared cp cases (``torch_cases.CASES["cp*"]``) run against the reference in ``test_sdpa`` / ``test_flex`` (and on
a GPU for ``sdpa-cuda`` and, through ``test_fa3_vllm.CASES``, for the fork itself).
"""

from __future__ import annotations

import pytest
import torch
from torch_cases import CASES

import attnfast._torch_common as torch_common
import attnfast.sdpa as sdpa_module
from attnfast.fa3_vllm import fa3_vllm_plan
from attnfast.flex import make_mask_mod
from attnfast.registry import available_names, get_backend
from conformance.cases.inputs import make_inputs
from conformance.records import Status
from conformance.verdict.check import check_backend, prepare_context

CP_CASES = {name: case for name, case in CASES.items() if case.cp_world > 1}
#: adapters that implement the rule; every other one refuses the feature.
DECLARED = {"sdpa-cpu", "flex-cpu", "sdpa-cuda", "fa3-vllm"}


@pytest.mark.parametrize("name", available_names())
def test_who_declares_cp(name: str) -> None:
    backend = get_backend(name)
    case = CP_CASES["cp3_rank0_sinks"].replace(head_dim=64)
    got = backend.supports(case, backend.devices[0])
    if name in DECLARED:
        assert "cp" in backend.accepts and "cp" not in backend.refusals()
    else:
        assert not got and got.reason.startswith("cp: not declared by this adapter"), got.reason


def test_fa3_vllm_passes_the_cp_arguments_only_for_a_cp_call() -> None:
    case = CP_CASES["cp2_rank1_paged"]
    inputs = make_inputs(case)
    kw = fa3_vllm_plan(case, inputs).kwargs
    assert kw["cp_world_size"] == 2 and kw["cp_rank"] == 1 and kw["causal"]
    tot = kw["cp_tot_seqused_k"]
    assert tot.dtype == torch.int32 and tot.device == inputs.device and tot.tolist() == [19, 20, 1, 4]
    assert kw["seqused_k"].tolist() == list(case.kv_lens)  # the rank's own keys
    plain = case.replace(cp_world=1, cp_rank=0)
    assert not {"cp_world_size", "cp_rank", "cp_tot_seqused_k"} & set(fa3_vllm_plan(plain, make_inputs(plain)).kwargs)


def test_cpu_rule_by_hand() -> None:
    """World 2, rank 1, a 7-key sequence (the rank holds keys 1, 3, 5), 3 queries (tokens 4, 5, 6)."""
    case = CP_CASES["cp2_rank1_paged"]
    want = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 1]], dtype=torch.bool)
    assert torch.equal(torch_common.visibility(case, 3, 3, cp_total=7), want)
    mm = make_mask_mod(case, 3, 3, cp_total=7)
    assert torch.equal(mm(0, 0, torch.arange(3)[:, None], torch.arange(3)[None, :]), want)
    tile = make_mask_mod(case, 3, 3, q_offset=1, cp_total=7)  # a query tile starting at row 1
    assert torch.equal(tile(0, 0, torch.arange(2)[:, None], torch.arange(3)[None, :]), want[1:])
    with pytest.raises(ValueError, match="needs the sequence's total keys"):
        torch_common.visibility(case, 3, 3)
    with pytest.raises(ValueError, match="needs the request's total keys"):
        make_mask_mod(case, 3, 3)


def _rank_plus_one(case, sq, sk, device="cpu", cp_total=None):
    """Planted: local key j read as absolute key j * W + rank + 1."""
    i = torch.arange(sq, device=device)[:, None]
    a = torch.arange(sk, device=device)[None, :] * case.cp_world + case.cp_rank + 1
    return (a <= i + cp_total - sq) & (a < cp_total)


def _local_total(case, sq, sk, device="cpu", cp_total=None):
    """Planted: ``tot_seqlen_k`` missing, the rank's own key count used in its place."""
    i = torch.arange(sq, device=device)[:, None]
    a = torch.arange(sk, device=device)[None, :] * case.cp_world + case.cp_rank
    return (a <= i + sk - sq) & (a < sk)


@pytest.mark.parametrize("bug", [_rank_plus_one, _local_total], ids=["rank_plus_one", "local_total"])
@pytest.mark.parametrize("name", sorted(CP_CASES))
def test_planted_rule_bugs_fail_the_single_call_verdict(bug, name, monkeypatch) -> None:
    ctx = prepare_context(CP_CASES[name], 0, "cpu")
    backend = get_backend("sdpa-cpu")
    assert check_backend(ctx, backend).status is Status.PASS
    monkeypatch.setattr(torch_common, "visibility", bug)  # score_bias's mask and the derived LSE
    monkeypatch.setattr(sdpa_module, "visibility", bug)  # the rows the adapter treats as fully masked
    res = check_backend(ctx, backend)
    print(f"\n{bug.__name__} on {name}: {res.status.value}, error ratio {res.stats.error_ratio:.3g}")
    assert res.status is Status.FAIL and res.stats.error_ratio > 3, res.reason


# ------------------------------------------------------------------ GPU: the fork's kernel itself
@pytest.mark.gpu
@pytest.mark.parametrize("world", [2, 3])
def test_gpu_fa3_vllm_cp_rule_and_merge(world: int) -> None:
    """The fork's cp arguments, called directly: each rank's call equals attnref's cp rule, differs from the plain
    causal call over the same shard (the arguments are not ignored: a Mask built from uninitialised cp fields
    would show here), and the ranks merged by LSE are causal attention over all keys."""
    from attnref import AttnOptions, ContextParallel, attention_varlen, merge_many
    from attnfast.fa3_vllm import import_vllm_fa3
    from fake_fa3 import available_or_skip

    available_or_skip(get_backend("fa3-vllm"))
    fn = import_vllm_fa3().flash_attn_varlen_func
    gen = torch.Generator().manual_seed(world)
    h, hk, d, dev, dt = 8, 2, 128, "cuda", torch.bfloat16
    seqs = [(1, 300), (5, 77), (16, 16), (3, 1), (40, 520)]  # (q_len, total keys): decode, spec, prefill, extend
    q = torch.randn(sum(s for s, _ in seqs), h, d, generator=gen).to(dev, dt)
    ks = [torch.randn(t, hk, d, generator=gen).to(dev, dt) for _, t in seqs]
    vs = [torch.randn(t, hk, d, generator=gen).to(dev, dt) for _, t in seqs]

    def cu(lens):
        return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=dev)

    cu_q, tot = cu([s for s, _ in seqs]), torch.tensor([t for _, t in seqs], dtype=torch.int32, device=dev)
    outs, lses = [], []
    for rank in range(world):
        k = torch.cat([x[rank::world] for x in ks])
        v = torch.cat([x[rank::world] for x in vs])
        local = [x[rank::world].shape[0] for x in ks]
        common = dict(max_seqlen_q=max(s for s, _ in seqs), cu_seqlens_q=cu_q, max_seqlen_k=max(local),
                      cu_seqlens_k=cu(local), causal=True, return_softmax_lse=True, fa_version=3)  # fmt: skip
        out, lse = fn(q, k, v, cp_world_size=world, cp_rank=rank, cp_tot_seqused_k=tot, **common)
        plain, _ = fn(q, k, v, **common)
        want = attention_varlen(q.float(), k.float(), v.float(), cu_q, cu(local), cp_tot_seqused_k=tot,
                                options=AttnOptions(causal=True, cp=ContextParallel(world, rank)))  # fmt: skip
        torch.testing.assert_close(out.float(), want.out, atol=2e-2, rtol=2e-2)
        live = torch.isfinite(want.lse)
        torch.testing.assert_close(lse.float()[live], want.lse[live], atol=1e-3, rtol=1e-3)
        assert not torch.allclose(plain.float(), want.out, atol=2e-2, rtol=2e-2), "cp arguments ignored"
        outs.append(out.float())
        lses.append(torch.where(torch.isposinf(lse), -torch.inf, lse.float()))
    merged = merge_many(outs, lses)
    full = attention_varlen(q.float(), torch.cat(ks).float(), torch.cat(vs).float(), cu_q, cu([t for _, t in seqs]),
                            options=AttnOptions(causal=True))  # fmt: skip
    torch.testing.assert_close(merged.out, full.out, atol=2e-2, rtol=2e-2)
