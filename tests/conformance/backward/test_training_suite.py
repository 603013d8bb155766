"""Suite ``training``: valid backward cases, model-derived (the registry's values), covering windows, soft-cap,
sinks, GQA, packed and unpadded batches, data variants and the deterministic backward; the small twin for CPU."""

from __future__ import annotations

import pytest

from conformance.backward.packing import check_roundtrip, packing_from_position_ids, position_ids_for
from conformance.backward.training import BATCHES, SMALL_BATCHES, TRAINING_MODELS, training_cases
from conformance.cases.case import AttentionCase
from conformance.suites.registry import get_suite
from conformance.models.load import builtin_registry
from conformance.suites.models import case_model, select_model_cases


@pytest.fixture(scope="module")
def full() -> list[AttentionCase]:
    return get_suite("training")


def test_registered_valid_backward_cases(full):
    assert 30 <= len(full) <= 60
    assert full == training_cases()
    for case in full:
        assert case.backward and case.causal and case.dtype == "bf16", case.id
        assert AttentionCase.from_json(case.to_json()) == case  # valid: the constructor re-validates
        assert all(q == k for q, k in case.requests), case.id  # self-attention over each document
        assert case.total_q in (4096, 16384, 4096 + 3001 + 2048 + 517), case.id


def test_covers_windows_softcap_sinks_gqa(full):
    features = set().union(*(c.features() for c in full))
    assert {"window", "softcap", "sinks", "gqa", "backward", "bwd_deterministic"} <= features, features
    assert {c.data for c in full} == {"", "outliers", "offset_v"}
    assert {case_model(c).batch for c in full} == set(BATCHES)
    windows = {c.window for c in full}
    assert (4095, 0) in windows and (127, 0) in windows
    assert any(c.scale is not None for c in full)  # gemma-2-27b's query_pre_attn_scalar 144
    # the 4096-token windows bite: a document longer than the window in pack8k
    assert max(n for c in full if case_model(c).batch == "pack8k" for n, _ in c.requests) > 4096


def test_model_values_come_from_the_registry(full):
    reg = builtin_registry()
    seen = set()
    for case in full:
        ref = case_model(case)
        model = reg.get(ref.model)
        seen.add(ref.model)
        assert ref.tp == 1 and ref.layer in model.layer_counts()
        assert (case.num_heads, case.num_kv_heads, case.head_dim) == (
            model.num_heads,
            model.num_kv_heads,
            model.head_dim,
        )
        assert case.window == model.window(ref.layer) and case.softcap == model.softcap and case.sinks == model.sinks
    assert seen == set(TRAINING_MODELS)
    assert reg.get("gemma-2-9b").softcap == 50.0 and reg.get("gemma-2-9b").sliding_window == 4096
    assert len(select_model_cases(full, ["gpt-oss-20b"])) == 8  # --model selects them


def test_packed_cases_are_their_position_ids_packing(full):
    for case in full:
        kind, spec = BATCHES[case_model(case).batch]
        if kind == "pack":
            check_roundtrip(case, packing_from_position_ids(position_ids_for(spec)))
        else:
            assert [q for q, _ in case.requests] == list(spec[0])


def test_small_twin_for_cpu():
    small = training_cases(lengths="small")
    assert [case_model(c).batch for c in small] == ["s" + case_model(c).batch for c in training_cases()]
    assert all(c.total_q <= 320 for c in small)
    assert max(n for c in small for n, _ in c.requests) > 128  # gpt-oss's window still bites
    assert {c.id for c in small}.isdisjoint(c.id for c in training_cases())
    assert set(SMALL_BATCHES) == set(BATCHES)
    with pytest.raises(ValueError, match="lengths must be"):
        training_cases(lengths="tiny")
