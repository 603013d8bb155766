"""Context-parallel cases (``cp_world`` / ``cp_rank``) in the case model and their inputs' totals."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from conformance.cases.case import OPT_IN_FEATURES, AttentionCase
from conformance.cases.inputs import cp_case_totals, cp_local_len, cp_totals, make_inputs
from conformance.suites.registry import get_suite
from conformance.verdict.baseline import baseline
from conformance.verdict.reference import reference


def C(requests, **kw) -> AttentionCase:
    base = dict(num_heads=4, num_kv_heads=2, head_dim=16, causal=True)
    return AttentionCase(requests=tuple(requests), **base | kw)


def test_defaults_leave_ids_and_json_unchanged() -> None:
    plain = C([(1, 9), (3, 10)])
    assert "cp_world" not in plain.to_json() and "cp_rank" not in plain.to_json()
    assert "cp" not in plain.id and "cp" not in plain.features()
    cp = plain.replace(cp_world=2, cp_rank=1)
    assert cp.to_json()["cp_world"] == 2 and cp.to_json()["cp_rank"] == 1
    assert "_cp2r1-" in cp.id and "cp" in cp.features() and "cp" in OPT_IN_FEATURES
    assert AttentionCase.from_json(cp.to_json()) == cp
    assert plain.id != cp.id != plain.replace(cp_world=2, cp_rank=0).id
    assert "cp rank 1 of 2" in cp.summary()


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(cp_world=0), r"cp_rank must be in \[0, cp_world\)"),
        (dict(cp_world=2, cp_rank=2), r"cp_rank must be in \[0, cp_world\)"),
        (dict(cp_rank=1), r"cp_rank must be in \[0, cp_world\)"),
        (dict(cp_world=2, causal=False), "needs causal=True without window or chunk"),
        (dict(cp_world=2, window=(8, 0)), "needs causal=True without window or chunk"),
        (dict(cp_world=2, chunk=4), "needs causal=True without window or chunk"),
        (dict(cp_world=2, alibi=True), "cannot be combined with alibi or append"),
        (dict(cp_world=2, append=True), "cannot be combined with alibi or append"),
    ],
)
def test_validation_names_the_field(kw, message) -> None:
    with pytest.raises(ValueError, match=message):
        C([(1, 9)], **kw)


@pytest.mark.parametrize("world", [2, 3, 5])
def test_derived_totals_are_consistent_and_meet_every_remainder(world: int) -> None:
    reqs = [(1, n) for n in (0, 1, 2, 7, 8, 9, 30)] * world
    for rank in range(world):
        case = C(reqs, cp_world=world, cp_rank=rank)
        totals = cp_totals(make_inputs(case))
        assert totals is not None and len(totals) == case.batch and totals == cp_case_totals(case)
        for t, (_, local) in zip(totals, case.requests):
            assert cp_local_len(t, world, rank) == local == len(range(rank, t, world))
        assert {t % world for t, (_, n) in zip(totals, reqs) if n > 2} == set(range(world))


def test_cp_totals_checks_the_shard() -> None:
    case = C([(1, 9), (3, 10)], cp_world=2, cp_rank=1)
    inputs = make_inputs(case)
    assert cp_totals(dataclasses.replace(inputs, cp_tot_seqused_k=torch.tensor([19, 20]))) == [19, 20]
    bad = {
        "must be set for a context-parallel case": None,
        r"shape \(2,\)": torch.tensor([19]),
        r"cp_tot_seqused_k\[1\] = 22: rank 1 of 2 holds 11 of its keys .* gives sequence 1 10": torch.tensor([19, 22]),
        r"cp_tot_seqused_k\[0\] = -1": torch.tensor([-1, 20]),
    }
    for message, tot in bad.items():
        with pytest.raises(ValueError, match=message):
            cp_totals(dataclasses.replace(inputs, cp_tot_seqused_k=tot))
    plain = make_inputs(case.replace(cp_world=1, cp_rank=0))
    assert plain.cp_tot_seqused_k is None and cp_totals(plain) is None
    with pytest.raises(ValueError, match="cp_world == 1"):
        cp_totals(dataclasses.replace(plain, cp_tot_seqused_k=torch.tensor([9, 10])))


def test_reference_and_baseline_apply_the_rule() -> None:
    """The verdict's two yardsticks mask by the cp rule: a row sees only the keys at or before its absolute
    position, so changing a key beyond it changes nothing, and the plain causal call differs."""
    case = C([(3, 4)], cp_world=2, cp_rank=0)  # total 8 - 0 = 8 (b = 0): keys 0, 2, 4, 6; rows are tokens 5, 6, 7
    inputs = make_inputs(case)
    assert cp_totals(inputs) == [8]
    ref, base = reference(case, inputs), baseline(case, inputs)
    torch.testing.assert_close(base[0].float(), ref.out, atol=2e-2, rtol=2e-2)
    changed = dataclasses.replace(inputs, k=inputs.k.clone(), v=inputs.v.clone())
    changed.k[3] += 5.0  # key 6: beyond row 0 (token 5), visible to rows 1-2
    changed.v[3] += 5.0
    ref2 = reference(case, changed)
    assert torch.equal(ref2.out[0], ref.out[0]) and not torch.equal(ref2.out[1], ref.out[1])
    plain = reference(case.replace(cp_world=1), dataclasses.replace(inputs, cp_tot_seqused_k=None))
    assert not torch.allclose(plain.out, ref.out)


def test_smoke_and_default_hold_cp_cases() -> None:
    for name, worlds in (("smoke", {2, 4}), ("default", {2, 3, 8})):
        cases = [c for c in get_suite(name) if c.cp_world > 1]
        assert {c.cp_world for c in cases} == worlds and {c.paged for c in cases} == {False, True}, name
