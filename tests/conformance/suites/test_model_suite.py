"""The ``models`` suite: every registry model in it, realistic shapes, the model recorded on each case,
``select_model_cases``, and a sample run through the verdict on sdpa-cpu at CPU sizes."""

from __future__ import annotations

import pytest

from conformance.cases.case import AttentionCase
from conformance.suites.registry import get_suite
from conformance.models import builtin_registry
from conformance.suites.models import BATCHES, ModelRef, case_model, model_cases, select_model_cases
from conformance.records import Status
from conformance.running.env import resolve_backend
from conformance.verdict.check import check_backend, prepare_context


@pytest.fixture(scope="module")
def suite() -> list[AttentionCase]:
    return get_suite("models")


def test_every_registry_model_layer_kind_and_suite_tp_has_cases(suite: list[AttentionCase]) -> None:
    refs = [case_model(c) for c in suite]
    assert all(r is not None for r in refs)
    got = {(r.model, r.layer, r.tp) for r in refs}
    for model in builtin_registry():
        kinds = ("mla-decode", "mla-prefill") if model.mla else tuple(model.layer_counts())
        for tp in model.suite_tps:
            for kind in kinds:
                assert (model.name, kind, tp) in got, (model.name, kind, tp)
    assert {r.model for r in refs} == set(builtin_registry().names())
    assert 300 <= len(suite) <= 3000


def test_cases_carry_the_models_shapes(suite: list[AttentionCase]) -> None:
    by = {}
    for c in suite:
        ref = case_model(c)
        by.setdefault((ref.model, ref.layer, ref.tp), []).append(c)
    v3 = by[("deepseek-v3", "mla-decode", 1)]
    assert {(c.num_heads, c.num_kv_heads, c.head_dim, c.dv, c.qv) for c in v3} == {(128, 1, 64, 512, True)}
    assert {c.block_size for c in v3} == {64, 1} and any(c.quant == "fp8_e4m3" for c in v3)
    assert v3[0].scale == pytest.approx(0.135234, rel=1e-5)
    v3p = by[("deepseek-v3", "mla-prefill", 8)]
    assert {(c.num_heads, c.num_kv_heads, c.head_dim, c.dv) for c in v3p} == {(16, 16, 192, 128)}
    assert any(c.v_padded for c in v3p)
    oss = by[("gpt-oss-120b", "sliding", 8)]
    assert {(c.num_heads, c.num_kv_heads, c.head_dim, c.window, c.sinks) for c in oss} == {(8, 1, 64, (127, 0), True)}
    assert {c.window for c in by[("gpt-oss-120b", "global", 1)]} == {(None, None)}
    scout = by[("llama-4-scout-17b-16e", "chunked", 8)]
    assert {(c.num_heads, c.num_kv_heads, c.chunk) for c in scout} == {(5, 1, 8192)}
    gemma = by[("gemma-2-27b", "sliding", 1)]
    assert {(c.softcap, c.window) for c in gemma} == {(50.0, (4095, 0))}
    assert len({c.scale for c in gemma}) == 1 and gemma[0].scale == pytest.approx(144**-0.5, rel=1e-6)
    assert all(c.alibi for c in by[("bloom", "global", 8)]) and by[("bloom", "global", 8)][0].num_heads == 14
    llama = by[("llama-3.1-70b", "global", 8)]
    assert {c.block_size for c in llama} == {16, 1, 256, None} and {c.quant for c in llama} == {"none", "fp8_e4m3"}
    assert {c.kv_layout for c in llama if c.block_size is None} == {"contiguous"}  # the contiguous varlen prefill
    assert {c.batch_name.rsplit(".", 1)[1] for c in llama} == {"dec", "pf", "cpmix", "spec"}
    assert max(k for c in llama for _, k in c.requests) == 32768
    assert all(c.causal for c in suite)


def test_case_ids_show_the_model_and_survive_json(suite: list[AttentionCase]) -> None:
    ids = [c.id for c in suite]
    assert len(set(ids)) == len(ids)
    case = suite[0]
    assert "@" in case.id and case_model(case).model in case.id
    back = AttentionCase.from_json(case.to_json())
    assert back.id == case.id and case_model(back) == case_model(case)
    # the content hash ignores the model label: the same shapes in another suite are the same call
    assert case.replace(batch_name="").digest() == case.digest()


def test_select_model_cases_filters_any_case_list(suite: list[AttentionCase]) -> None:
    picked = select_model_cases(suite, ["gpt-oss-20b", "deepseek-v3"])
    assert picked and {case_model(c).model for c in picked} == {"gpt-oss-20b", "deepseek-v3"}
    assert picked == [c for c in suite if case_model(c).model in ("gpt-oss-20b", "deepseek-v3")]
    assert select_model_cases(get_suite("smoke"), ["gpt-oss-20b"]) == []  # other suites' cases name no model
    assert case_model(get_suite("smoke")[0]) is None
    with pytest.raises(ValueError, match="--model must be one of .*got 'gpt-5'"):
        select_model_cases(suite, ["gpt-oss-20b", "gpt-5"])


def test_small_lengths_keep_the_shapes_and_shrink_the_batches() -> None:
    model = builtin_registry().get("gpt-oss-20b")
    full, small = model_cases([model]), model_cases([model], lengths="small")
    assert len(full) == len(small)
    for f, s in zip(full, small):
        assert f.replace(requests=s.requests, batch_name=s.batch_name) == s
        assert max(k for _, k in s.requests) <= 300
    assert max(k for _, k in BATCHES["dec"]) == 32768
    with pytest.raises(ValueError, match="lengths must be"):
        model_cases([model], lengths="tiny")


# one small case per feature the models bring: sinks + a window that cuts, chunked-local, ALiBi over a TP slice,
# MLA absorbed decode (128-head model at TP 8), MQA with a replicated kv head, an fp8 cache
SAMPLE = [
    ("gpt-oss-120b", "sliding", 8, "scpmix", "none"),
    ("llama-4-scout-17b-16e", "chunked", 8, "sspec", "none"),
    ("bloom", "global", 8, "sdec", "none"),
    ("deepseek-v3", "mla-decode", 8, "sdec", "none"),
    ("qwen3-235b-a22b", "global", 8, "scpmix", "fp8_e4m3"),
]


def test_a_sample_of_models_passes_on_sdpa_cpu() -> None:
    backend = resolve_backend("sdpa-cpu")
    names = sorted({s[0] for s in SAMPLE})
    cases = model_cases([builtin_registry().get(n) for n in names], lengths="small")
    chosen = []
    for model, layer, tp, batch, quant in SAMPLE:
        match = [
            c
            for c in cases
            if case_model(c) == ModelRef(model, layer, tp, batch) and c.quant == quant and c.block_size in (16, 64)
        ]
        assert match, (model, layer, tp, batch)
        chosen.append(match[0])
    for case in chosen:
        result = check_backend(prepare_context(case, seed=0, device="cpu"), backend)
        assert result.status is Status.PASS, (case.id, result.status, result.reason)
