"""The case model: validation, ids, JSON round trips, features, and input generation."""

from __future__ import annotations

import json

import pytest
import torch

from conformance.cases.case import FEATURES, AttentionCase
from conformance.cases.inputs import alibi_slopes, make_inputs


def _case(**kw) -> AttentionCase:
    base = dict(requests=((1, 300), (17, 17), (5, 100)), num_heads=8, num_kv_heads=2, head_dim=64, batch_name="mixed")
    base.update(kw)
    return AttentionCase(**base)


def test_id_is_readable_and_stable() -> None:
    case = _case(kv_layout="HND", block_size=16, causal=True, window=(128, 0), softcap=30.0, sinks=True)
    assert case.id.startswith("gqa_h8_kv2_d64_bf16_mixed_ps16hnd_causal_win128-0_cap30_sink-")
    assert case.id == _case(kv_layout="HND", block_size=16, causal=True, window=(128, 0), softcap=30, sinks=True).id


def test_json_round_trip_and_defaults_omitted() -> None:
    case = _case(alibi=True, head_dim_v=32, num_splits=2)
    data = case.to_json()
    assert "softcap" not in data and "kv_layout" not in data
    again = AttentionCase.from_json(json.loads(json.dumps(data)))
    assert again == case and again.id == case.id


def test_from_json_ignores_unknown_keys() -> None:
    data = _case().to_json() | {"field_from_the_future": 3}
    assert AttentionCase.from_json(data) == _case()


def test_distinct_cases_have_distinct_ids() -> None:
    a, b = _case(), _case(requests=((1, 301), (17, 17), (5, 100)))
    assert a.id != b.id and a.id.rsplit("-", 1)[0] == b.id.rsplit("-", 1)[0]


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(num_heads=6, num_kv_heads=4), "multiple of num_kv_heads"),
        (dict(dtype="int4"), "dtype must be one of"),
        (dict(kv_layout="NHD"), "block_size must be set exactly"),
        (dict(block_size=16), "block_size must be set exactly"),
        (dict(window=(-1, 0)), "window must be"),
        (dict(causal=True, window=(4, 4)), "window right must be None or 0"),
        (dict(requests=()), "at least one"),
        (dict(requests=((3, 2),), append=True), "append needs q_len <= kv_len"),
        (dict(softcap=-1.0), "softcap must be a finite number > 0"),
        (dict(quant="fp9"), "quant must be one of"),
        (dict(quant="fp8_e4m3", descale="token"), "descale must be one of"),
        (dict(quant="int8_t1", descale="head"), "descale must be one of"),
        (dict(descale="head"), "apply only to a quantized case"),
        (dict(quant="int8_t2", quant_q=False), "quant_q must be True for the int8 types"),
        (dict(quant="fp8_e4m3", dtype="fp32"), "bf16 or fp16 activation dtype"),
        (dict(quant="int8_t1", append=True, requests=((1, 5),)), "append with quant needs an fp8 type"),
        (dict(quant="int8_t1", qv=True, head_dim_v=512), "qv cannot be combined with an int8 type"),
        (dict(qv=True), "qv needs head_dim_v"),
        (dict(v_padded=True, head_dim_v=64), "v_padded needs head_dim_v < head_dim"),
    ],
)
def test_invalid_cases_are_rejected(kw, message) -> None:
    with pytest.raises(ValueError, match=message):
        _case(**kw)


def test_new_fields_keep_old_ids_and_name_themselves() -> None:
    """Fields added with defaults leave the JSON, the digest and the id of an older case alone."""
    old = _case(causal=True)
    assert set(old.to_json()) == {"requests", "num_heads", "num_kv_heads", "head_dim", "causal", "batch_name"}
    fp8 = _case(quant="fp8_e4m3", descale="head", quant_q=False)
    assert fp8.id.split("-")[0].endswith("_fp8e4m3kv_dshead") and fp8.descale_mode == "head"
    assert {"fp8_e4m3", "fp8_kv_only", "descale_head"} <= fp8.features()
    mla = _case(num_kv_heads=1, head_dim_v=512, qv=True, kv_layout="NHD", block_size=64, scheduler_metadata=True)
    assert mla.id.split("-")[0].endswith("_qv_sched") and {"qv", "sched_meta", "dv", "mqa"} <= mla.features()
    assert _case(quant="int8_t1").descale_mode == "token" and _case(quant="fp8_e5m2").descale_mode == "tensor"
    padded = _case(head_dim=192, head_dim_v=128, v_padded=True)
    assert "v_pad" in padded.features() and padded.padded_v_call().dv == 192 and not padded.padded_v_call().v_padded


def test_committed_records_keep_their_ids() -> None:
    """Every record of the committed H200 run (written before quantization and MLA existed) still names
    the case its JSON describes."""
    import gzip
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "reports" / "h200-2026-11-21" / "default-h200.jsonl.gz"
    records = [json.loads(line) for line in gzip.open(path, "rt")]
    results = [r for r in records if r.get("type") == "result"]
    assert len(results) == 6692
    assert all(AttentionCase.from_json(r["case"]).id == r["case_id"] for r in results)


def test_features_are_declared() -> None:
    case = _case(kv_layout="HND", block_size=16, causal=True, window=(128, 0), softcap=30.0, sinks=True, head_dim_v=32)
    feats = case.features()
    assert feats <= set(FEATURES)
    assert {"paged", "hnd", "causal", "window", "softcap", "sinks", "gqa", "dv", "mixed", "chunked", "varlen"} <= feats
    assert "decode" in _case(requests=((1, 5), (1, 9))).features()
    assert "cross" in _case(requests=((7, 30),)).features()


def test_inputs_are_deterministic_and_device_independent() -> None:
    case = _case(kv_layout="NHD", block_size=16, sinks=True, alibi=True)
    a, b = make_inputs(case, seed=3), make_inputs(case, seed=3)
    assert torch.equal(a.q, b.q) and torch.equal(a.k_cache, b.k_cache) and torch.equal(a.block_table, b.block_table)
    assert not torch.equal(make_inputs(case, seed=4).q, a.q)
    assert a.sinks.shape == (8,) and a.alibi_slopes.shape == (8,)


def test_paged_cache_holds_the_keys() -> None:
    case = _case(kv_layout="HND", block_size=16)
    inp = make_inputs(case)
    from attnref import gather_kv

    k, cu = gather_kv(inp.k_cache, inp.block_table, case.kv_lens, layout="HND")
    assert torch.equal(k, inp.k) and cu.tolist() == inp.cu_seqlens_k.tolist()


def test_append_leaves_new_tokens_out_of_the_cache() -> None:
    case = _case(requests=((2, 40), (2, 9)), kv_layout="NHD", block_size=16, append=True)
    inp = make_inputs(case)
    from attnref import gather_kv

    k_old, _ = gather_kv(inp.k_cache, inp.block_table, [38, 7])
    assert torch.equal(k_old[:38], inp.k[:38]) and torch.equal(k_old[38:], inp.k[40:47])
    assert torch.equal(inp.k_new, torch.cat([inp.k[38:40], inp.k[47:49]]))


def test_softcap_inputs_reach_the_cap() -> None:
    case = _case(softcap=30.0, requests=((64, 64),))
    inp = make_inputs(case)
    scores = torch.einsum("qhd,khd->hqk", inp.q.float()[:, :2], inp.k.float()[:, :1].expand(-1, 2, -1)) / 8
    assert scores.abs().max() > 30.0  # so tanh saturates and a missing cap is visible


def test_alibi_slopes_match_the_paper() -> None:
    assert torch.allclose(alibi_slopes(8), torch.tensor([2.0 ** -(i + 1) for i in range(8)]))
    assert alibi_slopes(12).shape == (12,)


@pytest.mark.parametrize(
    "kw",
    [
        dict(quant="fp8_e4m3", kv_layout="NHD", block_size=32),
        dict(quant="fp8_e5m2", descale="head", kv_layout="HND", block_size=16),
        dict(quant="fp8_e4m3", quant_q=False, kv_layout="NHD", block_size=4),
        dict(quant="int8_t1", kv_layout="NHD", block_size=16),
        dict(quant="int8_t2", kv_layout="HND", block_size=8),
        dict(num_kv_heads=1, head_dim_v=512, qv=True, quant="fp8_e4m3", descale="head", kv_layout="NHD", block_size=64),
    ],
)
def test_quantized_inputs_dequantize_exactly(kw) -> None:
    """The fp32 q/k/v the reference reads are exactly stored x descale; the paged caches hold the stored values
    of every real key (and int8 K scales of every real slot); per-head descales really differ."""
    from attnref import gather_kv

    case = _case(**kw)
    inp = make_inputs(case)
    quant = inp.quant
    lens, hk = case.kv_lens, case.num_kv_heads
    if quant.fmt == "int8":
        assert torch.equal(inp.k, quant.k.float() * quant.k_descale[..., None])
    else:
        scale = (
            quant.k_descale
            if quant.k_descale.numel() == 1
            else torch.repeat_interleave(quant.k_descale, torch.tensor(lens), dim=0)
        )
        assert torch.equal(
            inp.k, quant.k.float() * scale.reshape(-1, hk, 1) if scale.numel() > 1 else quant.k.float() * scale
        )
        if case.descale_mode == "head" and case.batch > 1:
            assert quant.k_descale.max() / quant.k_descale.min() > 1.2
    if case.quant_q:
        assert quant.q is not None and quant.q.dtype == quant.k.dtype
    else:
        assert quant.q is None and inp.q.dtype == torch.float32 and torch.equal(inp.q, inp.q.to(torch.bfloat16).float())
    if case.qv:
        assert torch.equal(quant.k_descale, quant.v_descale), "one MLA cache, one scale"
        assert torch.equal(inp.mla_cache[..., :512], inp.v_cache) and torch.equal(inp.mla_cache[..., 512:], inp.k_cache)
    gathered, _ = gather_kv(inp.k_cache, inp.block_table, lens, case.kv_layout)
    assert gathered.dtype == quant.k.dtype and torch.equal(gathered.float(), quant.k.float())
    if quant.k_scale_cache is not None:
        assert quant.k_scale_cache.shape == (inp.k_cache.shape[0], hk, case.block_size)
