"""FA4 adapter: translation on CPU (a fake ``flash_attn.cute`` with FA4's conventions), and the real
kernel against the fp32 reference on a GPU (skipped without CUDA or flash-attn-4)."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from attnfast.fa4 import FA4Backend, fa4_plan, fa4_shape_support
from attnref import AttnOptions, Window
from conformance.cases.inputs import make_inputs
from fake_fa3 import (
    fa_case as C,
    assert_matches_reference,
    attend_sequences,
    kvcache_sequences,
    available_or_skip,
    check_declared_case,
)


BACKEND = FA4Backend()


# ------------------------------------------------------------------ a fake flash_attn.cute
def make_fake_fa4() -> types.ModuleType:
    """``flash_attn_varlen_func`` with FA4 b36's signature and conventions, computed by attnref."""
    mod = types.ModuleType("flash_attn.cute")
    mod.calls = []

    def flash_attn_varlen_func(
        q,
        k,
        v,
        qv=None,
        cu_seqlens_q=None,
        cu_seqlens_k=None,
        max_seqlen_q=None,
        max_seqlen_k=None,
        min_seqlen_k=None,
        seqused_q=None,
        seqused_k=None,
        gather_kv_indices=None,
        page_table=None,
        softmax_scale=None,
        causal=False,
        window_size=(None, None),
        learnable_sink=None,
        softcap=0.0,
        num_splits=1,
        pack_gqa=None,
        deterministic=False,
        score_mod=None,
        score_mod_bwd=None,
        mask_mod=None,
        block_sparse_tensors=None,
        aux_tensors=None,
        aux_scalars=None,
        return_lse=False,
        scheduler_metadata=None,
        seqlen_k_per_split=None,
        disable_scheduler_metadata=False,
        gather_bwd_recompute_p=False,
        gather_bwd_token_chunk=None,
    ):
        mod.calls.append(("flash_attn_varlen_func", dict(locals())))
        left, right = window_size
        if left is not None and right is not None and left < 0 and right < 0:
            left = right = None  # b36: only both-negative means unbounded; one negative stays literal
        opts = AttnOptions(
            causal=causal,
            window=Window(left, None if causal else right),
            softcap=softcap or None,
            scale=softmax_scale,
        )  # Window rejects a literal negative: the adapter must never send one
        cu_q = cu_seqlens_q.tolist()
        if page_table is not None:
            assert cu_seqlens_k is None, "page_table is not supported with cu_seqlens_k"
            keys, values = kvcache_sequences(k, v, seqused_k, page_table, [], [])
        else:
            cu_k = cu_seqlens_k.tolist()
            lens = seqused_k.tolist() if seqused_k is not None else [b - a for a, b in zip(cu_k, cu_k[1:])]
            keys = [k[a : a + n] for a, n in zip(cu_k, lens)]
            values = [v[a : a + n] for a, n in zip(cu_k, lens)]
        res = attend_sequences(q, cu_q, keys, values, opts, sinks=learnable_sink)
        return res.out.to(q.dtype), (res.lse.float() if return_lse else None)

    mod.flash_attn_varlen_func = flash_attn_varlen_func
    return mod


@pytest.fixture
def fake_fa4(monkeypatch):
    mod = make_fake_fa4()
    pkg = types.ModuleType("flash_attn")
    pkg.cute = mod
    monkeypatch.setitem(sys.modules, "flash_attn", pkg)
    monkeypatch.setitem(sys.modules, "flash_attn.cute", mod)
    return mod


# ------------------------------------------------------------------ CPU: translation
@pytest.mark.parametrize(
    "case, reason",
    [
        (C([(3, 3)], alibi=True), "alibi: FA4 has no ALiBi"),
        (C([(3, 3)], chunk=2), "local_chunk: FA4 has no chunked"),
        (C([(3, 3)], kv_layout="HND", block_size=16), "hnd: FA4 reads pages"),
        (C([(1, 3)], append=True), "append: FA4 has no kvcache"),
        (C([(3, 3)], dtype="fp32"), "fp32: FA4 takes fp16 and bf16"),
    ],
)
def test_refusal_reasons(case, reason):
    got = BACKEND.supports(case, "cuda")
    assert not got and reason in got.reason, got.reason


@pytest.mark.parametrize(
    "case, cc, reason",
    [
        (C([(1, 900)], num_splits=2), (9, 0), "SplitKV not supported on sm_90"),
        (C([(3, 3)], head_dim=128, head_dim_v=64), (9, 0), "measured only for [(192, 128)]"),
        (C([(3, 3)], head_dim=320), (9, 0), "takes head dims 8..256"),
        (C([(3, 3)], head_dim=160), (10, 0), "d, dv <= 128, (192, 128) or (256, 256)"),
        (C([(3, 3)], kv_layout="NHD", block_size=16), (8, 0), "no paged KV on sm_80"),
        (C([(3, 3)], head_dim=60), (9, 0), "divisible by 8"),
        (C([(3, 300)], head_dim=40, kv_layout="NHD", block_size=16), (9, 0), "irregular head dim"),
        (C([(3, 300)], head_dim=40, kv_layout="NHD", block_size=256), (9, 0), "tile_n (128)"),
        (
            C([(1, 900)], num_splits=2, kv_layout="NHD", block_size=16),
            (12, 0),
            "SplitKV not supported on sm_120",
        ),
    ],
)
def test_shape_refusals_by_compute_capability(case, cc, reason):
    got = fa4_shape_support(case, cc)
    assert not got and reason in got.reason, got.reason


@pytest.mark.parametrize(
    "case, cc",
    [
        (C([(3, 3)], head_dim=192, head_dim_v=128), (9, 0)),
        (C([(3, 3)], head_dim=256), (9, 0)),
        (C([(3, 3)], head_dim=256), (10, 0)),
        (C([(1, 900)], num_splits=2), (10, 0)),
        (C([(3, 3)], kv_layout="NHD", block_size=16, sinks=True), (9, 0)),
        (C([(3, 300)], head_dim=40, kv_layout="NHD", block_size=128), (9, 0)),  # page == tile_n: TMA
        (C([(3, 300)], head_dim=80, kv_layout="NHD", block_size=16), (9, 0)),  # 80 % 16 == 0
    ],
)
def test_shape_accepted(case, cc):
    got = fa4_shape_support(case, cc)
    assert got, got.reason


@pytest.mark.parametrize(
    "kw, window",
    [
        (dict(causal=True), (None, 0)),
        (dict(causal=True, window=(32, None)), (32, 0)),
        (dict(window=(16, 16)), (16, 16)),
        (dict(window=(8, None)), (8, None)),
        ({}, (None, None)),
    ],
)
def test_window_spelling_never_negative(kw, window):
    case = C([(5, 9)], **kw)
    assert fa4_plan(case, make_inputs(case)).kwargs["window_size"] == window


def test_compile_key_names_the_kernel_not_the_lengths():
    """Compile affinity (conformance/running/pool.py) groups cases by this key: runtime arguments (lengths,
    block tables, the scale, a non-tile page size) must not change it; what FA4 specialises on must."""
    from attnfast.fa4 import fa4_compile_key

    key = fa4_compile_key
    base = C([(33, 33), (1, 70)], causal=True)
    assert key(base) == key(C([(5, 900)], causal=True)) == key(C([(33, 33)], causal=True, scale=0.3))
    assert key(base) != key(C([(33, 33)]))  # causal or not
    assert key(base) != key(C([(33, 33)], causal=True, head_dim=128))
    assert key(base) != key(C([(33, 33)], causal=True, dtype="fp16"))
    assert key(base) != key(C([(33, 33)], causal=True, num_kv_heads=1))  # pack_gqa follows the ratio
    assert key(base) != key(C([(33, 33)], causal=True, sinks=True))
    # the soft-cap's value, not only its presence: FA4 hashes the score_mod closure holding it (utils.hash_callable)
    caps = {v: key(C([(33, 33)], causal=True, softcap=v)) for v in (30.0, 50.0)}
    assert caps[30.0] != caps[50.0] and base not in caps.values()
    assert key(C([(5, 900)], causal=True, softcap=30.0)) == caps[30.0]
    # queries beyond one query tile (x the GQA group): FA4's other scheduler, another kernel (max_m_blocks_leq_one)
    assert key(base) != key(C([(200, 200), (1, 70)], causal=True))
    assert key(C([(200, 200)], causal=True)) == key(C([(300, 900)], causal=True))
    assert key(C([(33, 33)], window=(16, None))) != key(C([(33, 33)], window=(16, 16)))  # bounded sides
    paged = {b: key(C([(1, 70)], causal=True, kv_layout="NHD", block_size=b)) for b in (16, 64, 128)}
    assert paged[16] == paged[64] != paged[128]  # 128: d64's key tile, the TMA loader
    assert paged[16] != key(C([(1, 70)], causal=True))
    # a V-padded case compiles the equal-dims kernel it calls
    vpad = C([(3, 3)], causal=True, head_dim=192, head_dim_v=128, v_padded=True)
    assert key(vpad) == key(C([(3, 3)], causal=True, head_dim=192))
    assert FA4Backend().compile_key(base) == key(base)
    # a backward case also compiles FA4's backward kernel (deterministic or not): a key of its own, so the compile
    # phase compiles it instead of leaving it to the checks; a forward key is unchanged by the backward's part
    bwd = C([(33, 33)], causal=True, backward=True)
    assert key(bwd) != key(C([(33, 33)], causal=True)) and key(bwd)[:-1] == key(C([(33, 33)], causal=True))
    assert key(bwd) != key(C([(33, 33)], causal=True, backward=True, deterministic=True))
    # ... and whether the longest request's queries and keys fit one backward tile (single_q_block, single_k_block
    # of _flash_attn_bwd's key): at d64 the tile is 128 x 128, at d128 64 (causal) or 80 (not) x 128; MHA here, so
    # that the forward's one-query-tile part (192 rows at d64) stays the same
    mha = dict(causal=True, backward=True, num_kv_heads=4)
    b33 = key(C([(33, 33)], **mha))
    assert b33 == key(C([(128, 128), (5, 9)], **mha))
    for other in (key(C([(129, 129)], **mha)), key(C([(33, 129)], **mha))):
        assert other != b33 and other[:-1] == b33[:-1]  # the same forward kernel, another backward one
    d128 = {n: key(C([(n, n)], head_dim=128, backward=True, num_kv_heads=4)) for n in (64, 80, 81)}
    assert d128[64] == d128[80] != d128[81]
    d128c = {n: key(C([(n, n)], head_dim=128, backward=True, num_kv_heads=4, causal=True)) for n in (64, 65)}
    assert d128c[64] != d128c[65]


def test_paged_arguments():
    case = C([(3, 40), (1, 97)], kv_layout="NHD", block_size=16, sinks=True)
    inputs = make_inputs(case)
    kw = fa4_plan(case, inputs).kwargs
    assert kw["k"] is inputs.k_cache and kw["page_table"] is inputs.block_table
    assert kw["seqused_k"] is inputs.seqlens_k and "cu_seqlens_k" not in kw
    assert kw["learnable_sink"].dtype == torch.float32 and kw["num_splits"] == 1 and kw["return_lse"] is True


CASES = {
    "prefill_causal": C([(33, 33), (1, 1), (70, 70)], causal=True),
    "mixed_causal": C([(1, 60), (24, 24), (10, 90)], causal=True),
    "sq_gt_sk": C([(40, 20), (9, 3), (16, 16)], causal=True),
    "empty_kv": C([(5, 0), (3, 3), (1, 0)]),
    "cross": C([(77, 300), (1, 77), (200, 50)]),
    "window_causal": C([(100, 200), (64, 64)], causal=True, window=(64, None)),
    "window_sym": C([(100, 200), (64, 64)], window=(32, 32)),
    "window_left_only_sq_gt_sk": C([(40, 20)], window=(8, None)),
    "softcap": C([(60, 60), (5, 77)], causal=True, softcap=30.0),
    "sinks_masked_rows": C([(40, 20), (9, 30)], causal=True, sinks=True),
    "sinks_window": C([(60, 90), (5, 77)], causal=True, window=(16, None), sinks=True),
    "scale": C([(20, 40)], causal=True, scale=0.05),
    "mqa_d128_fp16": C([(30, 50), (1, 20)], num_heads=8, num_kv_heads=1, head_dim=128, dtype="fp16", causal=True),
    "d96": C([(30, 50)], head_dim=96, causal=True),
    "d256": C([(30, 50)], head_dim=256, causal=True),
    "dv_192_128": C([(30, 50), (7, 7)], head_dim=192, head_dim_v=128, causal=True),
    "decode_gqa": C([(1, 16), (1, 300), (1, 1)], num_heads=8, num_kv_heads=2),
    "paged_ps16_prefill": C([(300, 300), (17, 17), (50, 600)], causal=True, kv_layout="NHD", block_size=16),
    "paged_ps128_decode_d128": C([(1, 300), (1, 600), (1, 3)], head_dim=128, kv_layout="NHD", block_size=128),
    "paged_ps1_spec": C([(4, 30), (4, 7)], causal=True, kv_layout="NHD", block_size=1),
    "paged_window_sinks": C(
        [(4, 300), (4, 520)], causal=True, window=(64, None), sinks=True, kv_layout="NHD", block_size=32
    ),
    "paged_empty_kv_sinks": C([(3, 0), (2, 5)], sinks=True, kv_layout="NHD", block_size=16),
}
CPU_NAMES = [n for n in CASES if max(CASES[n].kv_lens) <= 300]


@pytest.mark.parametrize("name", CPU_NAMES)
def test_translation_against_fake(fake_fa4, name):
    case = CASES[name]
    inputs = make_inputs(case)
    assert_matches_reference(case, inputs, BACKEND.prepare(case, inputs)(), label=f"fake FA4 {name}")
    assert fake_fa4.calls, "the fake kernel was not called"


# ------------------------------------------------------------------ GPU: the real kernel
@pytest.fixture(scope="module")
def gpu():
    return available_or_skip(BACKEND)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CASES))
def test_gpu_matches_reference(gpu, name):
    check_declared_case(gpu, name, CASES[name])


@pytest.mark.gpu
def test_gpu_splits_refused_on_sm90(gpu):
    """The sm_90 refusal of num_splits > 1 is measured; this shows whether it still holds."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("only meaningful on sm_90")
    case = C([(1, 2000), (1, 900)], num_splits=2)
    assert not gpu.supports(case, "cuda")
    from flash_attn.cute import flash_attn_varlen_func

    inputs = make_inputs(case, seed=0, device="cuda")
    kwargs = dict(fa4_plan(case, inputs).kwargs)
    with pytest.raises(Exception, match="SplitKV"):
        flash_attn_varlen_func(**kwargs)


@pytest.mark.gpu
@pytest.mark.parametrize("block_size, asserts", [(16, True), (64, True), (128, False)])
def test_gpu_irregular_head_dim_paged_refusal_is_the_kernels(gpu, block_size, asserts):
    """d40 paged: a page other than FA4's tile_n (128 here) asserts "irregular head dim"; page 128 runs."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("only meaningful on sm_90")
    case = C([(3, 300), (1, 77)], head_dim=40, kv_layout="NHD", block_size=block_size)
    assert bool(gpu.supports(case, "cuda")) is not asserts
    from flash_attn.cute import flash_attn_varlen_func

    kwargs = dict(fa4_plan(case, make_inputs(case, seed=0, device="cuda")).kwargs)
    if asserts:
        with pytest.raises(AssertionError, match="irregular head dim"):
            flash_attn_varlen_func(**kwargs)
    else:
        flash_attn_varlen_func(**kwargs)
        torch.cuda.synchronize()
