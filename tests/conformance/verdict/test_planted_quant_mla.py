"""The verdict's margins on quantization and MLA: every planted bug in the quantized / MLA plumbing fails on
every smoke case that exercises it, and the bug-free fake that reads the same stored tensors passes.

Planted bugs (``tests/conformance/fakes.py``): descale dropped (vLLM 51363), per-tensor descale where
per-head ones were given, fp8 bytes read in the other format, ``qv`` ignored, MLA's query assembled rope
first, V padding not stripped (seed 004).  The error ratios printed by
``python -m pytest tests/conformance/verdict/test_planted_quant_mla.py -s`` are the margins in docs/concepts/verdict.md.
"""

from __future__ import annotations

import pytest

from conformance.cases.case import AttentionCase
from conformance.suites.registry import get_suite
from conformance.records import Status
from conformance.verdict.check import check_backend, prepare_context
from tests.conformance import fakes

#: bug fake -> the features of which a case needs one to expose it.
EXPOSED_BY = {
    fakes.DescaleDroppedBackend: {"fp8_e4m3", "fp8_e5m2", "int8_t1", "int8_t2"},
    fakes.PerTensorDescaleBackend: {"descale_head", "int8_t1", "int8_t2"},
    fakes.WrongFp8FormatBackend: {"fp8_e4m3", "fp8_e5m2"},
    fakes.QvIgnoredBackend: {"qv"},
    fakes.RopeNopeSwappedBackend: {"qv"},
    fakes.VPadNotStrippedBackend: {"v_pad"},
}
CASES = {c.id: c for c in get_suite("smoke") if c.features() & set().union(*EXPOSED_BY.values())}
PAIRS = [(bug, cid) for bug, feats in EXPOSED_BY.items() for cid, c in CASES.items() if c.features() & feats]


@pytest.fixture(scope="module")
def contexts():
    return {cid: prepare_context(case, 0, "cpu") for cid, case in CASES.items()}


def test_every_planted_bug_meets_a_case():
    assert {bug for bug, _ in PAIRS} == set(EXPOSED_BY) and len(PAIRS) >= 20


@pytest.mark.parametrize("cid", sorted(CASES))
def test_stored_exact_passes(contexts, cid):
    res = check_backend(contexts[cid], fakes.StoredExactBackend())
    assert res.status is Status.PASS, res.reason
    print(f"\n{'fake-stored-exact':28s} {cid:70s} error ratio {res.stats.error_ratio:.3f}")


@pytest.mark.parametrize("bug, cid", PAIRS, ids=[f"{b.name}-{c}" for b, c in PAIRS])
def test_planted_bug_fails(contexts, bug, cid):
    res = check_backend(contexts[cid], bug())
    assert res.status is Status.FAIL, (res.status, res.reason)
    ratio = "shape" if res.stats is None else f"{res.stats.error_ratio:.1f}"
    print(f"\n{bug.name:28s} {cid:70s} error ratio {ratio}")


def test_cpu_backends_refuse_a_per_tensor_descale_on_a_per_head_call():
    """A caller that forgets vLLM's ``expand`` to (batch, hk) is caught, as FA3 catches it (measured message:
    "q_descale must have shape (batch_size, num_heads_k)")."""
    import dataclasses

    from attnfast.registry import get_backend
    from conformance.cases.inputs import make_inputs

    case = next(c for c in CASES.values() if "descale_head" in c.features())
    inputs = make_inputs(case)
    inputs.quant = dataclasses.replace(inputs.quant, k_descale=inputs.quant.k_descale[:1, :1].reshape(1))
    with pytest.raises(ValueError, match=r"descale must have shape \(\d+, \d+\) \(batch, kv heads\)"):
        get_backend("sdpa-cpu").prepare(case, inputs)


#: an uneven append (smoke holds none: peer-fa3's varlen_q appends), fp8 so that the stored rows are read
UNEVEN = AttentionCase(((3, 10), (2, 5)), 4, 2, 32, causal=True, append=True, append_lens=(4, 1), quant="fp8_e4m3",
                       kv_layout="NHD", block_size=4)  # fmt: skip


@pytest.mark.parametrize("feature", ["append_quant", "append_short", "append_uneven"])
def test_stored_exact_reads_an_appends_new_keys_not_the_inputs_copy(feature):
    """An append's keys are what the kernel was handed as new keys (``quant.k_new`` / ``v_new`` as stored for an fp8
    append, ``k_new`` / ``v_new`` otherwise), written over each request's last keys: other new bytes give another
    output, so the bug-free fake cannot pass an append by reading the packed copy of the keys."""
    import torch

    from conformance.cases.inputs import make_inputs

    case = UNEVEN if feature == "append_uneven" else next(c for c in get_suite("smoke") if feature in c.features())
    inputs = make_inputs(case, seed=0)
    fake = fakes.StoredExactBackend()
    assert fake.supports(case, "cpu"), fake.supports(case, "cpu").reason
    before = fake.prepare(case, inputs)().out
    holder = inputs.quant if case.quant != "none" else inputs
    for name in ("k_new", "v_new"):
        new = getattr(holder, name)
        setattr(holder, name, (new.float() * -2).to(new.dtype))
        assert not torch.equal(fake.prepare(case, inputs)().out, before), name
        setattr(holder, name, new)
    assert torch.equal(fake.prepare(case, inputs)().out, before)
