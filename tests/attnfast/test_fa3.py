"""FA3 adapter: translation on CPU against ``fake_fa3`` (FA3's documented conventions), and the real
Hopper build against the fp32 reference on a GPU (skipped unless ``flash_attn_interface`` imports)."""

from __future__ import annotations

import sys

import pytest
import torch

from attnfast.fa3 import KVCACHE, VARLEN, FA3Backend, fa3_entry, fa3_plan, import_fa3
from attnref import gather_kv
from conformance.cases.inputs import make_inputs
from fake_fa3 import assert_matches_reference, make_fake_fa3, available_or_skip, check_declared_case, fa_case as C


BACKEND = FA3Backend()


@pytest.fixture
def fake_fa3(monkeypatch):
    mod = make_fake_fa3()
    monkeypatch.setitem(sys.modules, "flash_attn_interface", mod)
    return mod


# ------------------------------------------------------------------ CPU: translation
@pytest.mark.parametrize(
    "case, entry",
    [
        (C([(33, 33), (1, 1)], causal=True), VARLEN),
        (C([(1, 40), (1, 97)]), VARLEN),
        (C([(1, 40), (3, 97)], kv_layout="NHD", block_size=16), KVCACHE),
        (C([(1, 40), (3, 97)], append=True), KVCACHE),
    ],
)
def test_entry_point_choice(case, entry):
    assert fa3_entry(case) == entry


@pytest.mark.parametrize(
    "case, reason",
    [
        (C([(3, 3)], alibi=True), "alibi: FA3 has no ALiBi"),
        (C([(3, 3)], sinks=True), "sinks: upstream FA3"),
        (C([(3, 3)], dtype="fp32"), "fp32: FA3 takes fp16, bf16"),
        (C([(3, 3)], head_dim=320), "at most 256"),
        (C([(3, 3)], head_dim=128, head_dim_v=64), "FA3 takes d != dv only"),
        (C([(3, 3)], head_dim=60), "divisible by 8"),
    ],
)
def test_refusal_reasons(case, reason):
    got = BACKEND.supports(case, "cuda")
    assert not got and reason in got.reason, got.reason


def test_is_available_names_the_missing_module():
    try:
        import_fa3()
    except ImportError:
        got = BACKEND.is_available()
        assert not got and "flash_attn_interface" in got.reason, got.reason
    else:
        pytest.skip("a real FA3 build is installed here")


def test_kvcache_arguments():
    case = C(
        [(2, 40), (3, 97)],
        kv_layout="HND",
        block_size=16,
        append=True,
        causal=True,
        window=(8, None),
        chunk=32,
    )
    inputs = make_inputs(case)
    kw = fa3_plan(case, inputs).kwargs
    assert kw["k_cache"].shape == (inputs.k_cache.shape[0], 16, 2, 64), "HND must be passed as an NHD-shaped view"
    assert kw["k_cache"].data_ptr() == inputs.k_cache.data_ptr(), "the HND view must alias the cache (no copy)"
    assert kw["cache_seqlens"].tolist() == [38, 94] and kw["cache_seqlens"].dtype == torch.int32
    assert kw["cu_seqlens_k_new"] is inputs.cu_seqlens_k_new and kw["k"] is inputs.k_new
    assert torch.equal(kw["cu_seqlens_k_new"], inputs.cu_seqlens_q)  # every query token a new key
    assert kw["window_size"] == (8, -1) and kw["attention_chunk"] == 32 and kw["num_splits"] == 0
    assert kw["page_table"] is inputs.block_table and kw["max_seqlen_q"] == 3


def test_varlen_arguments():
    case = C([(5, 9), (2, 2)], window=(3, 3), softcap=10.0, num_splits=4)
    kw = fa3_plan(case, make_inputs(case)).kwargs
    assert kw["window_size"] == (3, 3) and kw["softcap"] == 10.0 and kw["num_splits"] == 4
    assert kw["attention_chunk"] == 0 and kw["return_attn_probs"] is True and kw["max_seqlen_k"] == 9


PG16 = dict(kv_layout="NHD", block_size=16)
CASES = {
    "prefill_causal": C([(33, 33), (1, 1), (70, 70)], causal=True),
    "sq_gt_sk": C([(40, 20), (9, 3), (16, 16)], causal=True),
    "empty_kv_some": C([(5, 0), (3, 3), (1, 0)]),
    "empty_kv_all": C([(5, 0), (1, 0)]),
    "cross": C([(77, 300), (1, 77), (200, 50)]),
    "window_causal": C([(100, 200), (64, 64)], causal=True, window=(32, None)),
    "window_sym": C([(100, 200), (64, 64)], window=(16, 16)),
    "chunk_causal": C([(100, 200), (64, 64)], causal=True, chunk=32),
    "chunk_window": C([(100, 200)], causal=True, chunk=64, window=(40, None)),
    "softcap_scale": C([(60, 60), (5, 77)], causal=True, softcap=30.0, scale=0.1),
    "mqa_fp16": C([(30, 50), (1, 20)], num_heads=8, num_kv_heads=1, dtype="fp16", causal=True),
    "dv_192_128": C([(30, 50)], head_dim=192, head_dim_v=128, causal=True),
    "splits": C([(1, 1000), (1, 700)], num_splits=3),
    "decode": C([(1, 16), (1, 300), (1, 1)], num_heads=8, num_kv_heads=2),
    "paged_prefill_ps16": C([(300, 300), (17, 17), (50, 600)], causal=True, **PG16),
    "paged_decode_hnd": C([(1, 300), (1, 600), (1, 3)], kv_layout="HND", block_size=32),
    "paged_mixed_window": C([(1, 60), (24, 24), (10, 90)], causal=True, window=(20, None), **PG16),
    "paged_empty_kv": C([(3, 0), (2, 5)], **PG16),
    "append_contig": C([(1, 40), (1, 97)], causal=True, append=True),
    "append_paged_varlen": C([(3, 300), (1, 20), (5, 5)], causal=True, append=True, **PG16),
    # short appends: cu_seqlens_k_new counts append_len keys per request, not the q_len
    "append_short_paged_varlen": C([(3, 300), (2, 20), (5, 5)], causal=True, append=True, append_len=2, **PG16),
    "append_short_contig_window": C([(6, 97), (6, 6)], causal=True, window=(8, 0), append=True, append_len=3),
    # more query tokens than a cache holds after a short append: the call needs a cache max_seqlen_q wide
    "append_short_wider_q": C([(8, 7), (5, 6)], causal=True, append=True, append_len=4),
    # uneven appends (append_lens): each request its own count in cu_seqlens_k_new, more than its q_len, or none
    "append_uneven_paged_varlen": C(
        [(3, 300), (2, 20), (5, 5)], causal=True, append=True, append_lens=(1, 7, 0), **PG16
    ),
    "append_uneven_contig_window": C([(6, 97), (4, 9)], causal=True, window=(8, 0), append=True, append_lens=(2, 9)),
}
CPU_NAMES = [n for n in CASES if max(CASES[n].kv_lens) <= 300 and CASES[n].total_q <= 300]


@pytest.mark.parametrize("name", CPU_NAMES)
def test_translation_against_fake(fake_fa3, name):
    case = CASES[name]
    inputs = make_inputs(case)
    fn = BACKEND.prepare(case, inputs)
    assert_matches_reference(case, inputs, fn(), label=f"fake FA3 {name}")
    assert fake_fa3.calls[-1][0] == fa3_entry(case).rsplit(".", 1)[1]


@pytest.mark.parametrize("name", ["append_paged_varlen", "append_uneven_paged_varlen"])
def test_fake_append_writes_cache_and_repeats(fake_fa3, name):
    case = CASES[name]
    inputs = make_inputs(case)
    fn = BACKEND.prepare(case, inputs)
    first = fn()
    keys, _ = gather_kv(inputs.k_cache, inputs.block_table, inputs.seqlens_k)
    assert torch.equal(keys, inputs.k)
    assert torch.equal(first.out, fn().out)


# ------------------------------------------------------------------ GPU: the real Hopper build
@pytest.fixture(scope="module")
def gpu():
    return available_or_skip(BACKEND)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CASES))
def test_gpu_matches_reference(gpu, name):
    check_declared_case(gpu, name, CASES[name])


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["append_paged_varlen", "append_uneven_paged_varlen"])
def test_gpu_append_writes_cache(gpu, name):
    case = CASES[name]
    inputs = make_inputs(case, seed=1, device="cuda")
    gpu.prepare(case, inputs)()
    keys, _ = gather_kv(inputs.k_cache, inputs.block_table, inputs.seqlens_k)
    assert torch.equal(keys, inputs.k), "FA3 did not write k_new into the paged cache at cache_seqlens"
