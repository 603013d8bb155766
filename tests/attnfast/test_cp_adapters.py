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
