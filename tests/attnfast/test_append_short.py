"""Short appends (``append_len``: fewer new keys than query tokens) and fp8 appends, on CPU.

The oracle is flash-attention's own construction, written out here independently of ``attnref``: 2.8.3's
``tests/test_flash_attn.py::test_flash_attn_kvcache`` with ``seqlen_new_eq_seqlen_q=False`` (and hopper's, commit
01afd16d248c4c7d0f9aed1914084f16c490eaed) draws ``seqlen_new = randint(1, seqlen_q + 1)`` new keys, writes them into a
cache at ``cache_seqlens`` (``update_mask``), keeps the keys ``arange < cache_seqlens + seqlen_new``
(``key_padding_mask``) and aligns the query rows to the end of those keys (``attention_ref``'s
``construct_local_mask``: row ``i`` sees key ``j`` iff ``j <= i + sk - sq`` under causal, and within ``[i + sk - sq -
left, i + sk - sq + right]`` under a window).
"""

from __future__ import annotations

import math

import pytest
import torch

from attnfast.base import Support
from attnfast.fa2 import KVCACHE as FA2_KVCACHE, FA2Backend, fa2_plan
from attnfast.fa3 import FA3Backend, fa3_plan
from attnfast.registry import BUILTIN, get_backend
from attnfast.sdpa import SdpaCpuBackend
from attnfast.flex import FlexCpuBackend
from conformance.cases.case import AttentionCase, CaseError
from conformance.cases.inputs import make_inputs
from conformance.verdict.reference import reference
from attnref import Numerics


PREFIX = r"^invalid AttentionCase: "  # CaseError's one line


def C(requests, h=4, hk=2, d=32, **kw) -> AttentionCase:
    return AttentionCase(requests=tuple(requests), num_heads=h, num_kv_heads=hk, head_dim=d, append=True, **kw)


def peer_oracle(case: AttentionCase, inputs) -> list[torch.Tensor | None]:
    """Per request ``(sq, h, dv)`` float64 output the peer test's ``attention_ref`` gives, rows that see no key None."""
    outs = []
    cu_q = inputs.cu_seqlens_q.tolist()
    cu_k = inputs.cu_seqlens_k.tolist()
    cu_new = inputs.cu_seqlens_k_new.tolist()
    g = case.num_heads // case.num_kv_heads
    left, right = case.window
    for b, (sq, kl) in enumerate(case.requests):
        n = cu_new[b + 1] - cu_new[b]
        cache_seqlen = kl - n
        width = kl + 5  # a cache wider than the keys, its tail stale
        k_cache = torch.full((width, case.num_kv_heads, case.head_dim), 100.0, dtype=torch.float64)
        v_cache = torch.full((width, case.num_kv_heads, case.dv), 100.0, dtype=torch.float64)
        k_cache[:cache_seqlen] = inputs.k[cu_k[b] : cu_k[b] + cache_seqlen].double()  # the cache before the call
        v_cache[:cache_seqlen] = inputs.v[cu_k[b] : cu_k[b] + cache_seqlen].double()
        arange = torch.arange(width)
        update = (cache_seqlen <= arange) & (arange < cache_seqlen + n)
        k_cache[update] = inputs.k_new[cu_new[b] : cu_new[b + 1]].double()
        v_cache[update] = inputs.v_new[cu_new[b] : cu_new[b + 1]].double()
        key_padding = arange < cache_seqlen + n
        sk = int(key_padding.sum())
        row = torch.arange(sq).unsqueeze(1) + sk - sq
        col = arange.unsqueeze(0)
        visible = key_padding.unsqueeze(0).expand(sq, width).clone()
        if case.causal:
            visible &= col <= row
        if left is not None:
            visible &= col >= row - left
        if right is not None and not case.causal:
            visible &= col <= row + right
        q = inputs.q[cu_q[b] : cu_q[b + 1]].double()
        k = k_cache.repeat_interleave(g, dim=1)
        v = v_cache.repeat_interleave(g, dim=1)
        s = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(case.head_dim)
        s = s.masked_fill(~visible, float("-inf"))
        p = torch.softmax(s, dim=-1).nan_to_num(0.0)
        out = torch.einsum("hqk,khd->qhd", p, v)
        outs.append([out[i] if visible[i].any() else None for i in range(sq)])
    return outs


ORACLE_CASES = {
    "causal_contig": C([(5, 12), (5, 9)], causal=True, append_len=2),
    "causal_paged_nhd": C([(6, 20), (4, 4)], causal=True, append_len=3, kv_layout="NHD", block_size=4),
    "window_paged_hnd": C([(7, 30), (3, 9)], causal=True, window=(3, 0), append_len=1, kv_layout="HND", block_size=8),
    "window_sym": C([(6, 15)], window=(2, 1), append_len=4),
    "noncausal_mqa": C([(4, 10), (2, 6)], h=4, hk=1, append_len=1),
    "empty_cache_sq_gt_sk": C([(6, 2), (6, 8)], causal=True, append_len=2),  # request 0: kv_len < q_len
}


@pytest.mark.parametrize("name", sorted(ORACLE_CASES))
def test_reference_and_torch_backends_match_the_peer_oracle(name: str) -> None:
    """attnref (on the packed keys), sdpa-cpu and flex-cpu (writing k_new into the cache themselves) against the
    peer's construction; rows that see no key must be empty (LSE -inf) in the reference."""
    case = ORACLE_CASES[name]
    inputs = make_inputs(case, seed=3)
    oracle = peer_oracle(case, inputs)
    ref = reference(case, inputs, Numerics())
    got = {"sdpa-cpu": SdpaCpuBackend().prepare(case, inputs)(), "flex-cpu": FlexCpuBackend().prepare(case, inputs)()}
    token = 0
    for rows in oracle:
        for want in rows:
            if want is None:
                assert torch.isneginf(ref.lse[:, token]).all()
            else:
                torch.testing.assert_close(ref.out[token].double(), want, atol=2e-2, rtol=2e-2)
                for name_, out in got.items():
                    torch.testing.assert_close(out.out[token].double(), want, atol=3e-2, rtol=3e-2, msg=name_)
            token += 1


def test_a_short_append_attends_the_new_keys_it_was_given() -> None:
    """The oracle sees k_new: a wrong k_new moves the oracle, the reference on the packed keys does not."""
    case = ORACLE_CASES["causal_contig"]
    inputs = make_inputs(case, seed=3)
    before = peer_oracle(case, inputs)[0][-1]
    inputs.k_new = inputs.k_new + 1.0
    assert not torch.allclose(peer_oracle(case, inputs)[0][-1], before, atol=1e-3)
    assert SdpaCpuBackend().prepare(case, inputs)().out.shape == (case.total_q, case.num_heads, case.dv)


def test_short_append_fields_and_inputs() -> None:
    case = C([(5, 12), (3, 3)], causal=True, append_len=2, kv_layout="NHD", block_size=4)
    assert case.new_kv_lens == [2, 2] and case.cached_kv_lens == [10, 1]
    assert "append_short" in case.features() and "_append2" in case.id
    assert case.to_json()["append_len"] == 2 and AttentionCase.from_json(case.to_json()) == case
    inputs = make_inputs(case, seed=0)
    assert inputs.cu_seqlens_k_new.tolist() == [0, 2, 4] and inputs.k_new.shape == (4, 2, 32)
    assert torch.equal(inputs.k_new[:2], inputs.k[10:12]) and torch.equal(inputs.k_new[2:], inputs.k[13:15])
    full = C([(5, 12), (3, 3)], causal=True)
    assert full.new_kv_lens == [5, 3] and full.cached_kv_lens == [7, 0] and "append_len" not in full.to_json()
    assert "append_short" not in full.features() and full.id.split("-")[0].endswith("_append")
    assert make_inputs(full, seed=0).cu_seqlens_k_new.tolist() == [0, 5, 8]


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(append=False, append_len=1, requests=((3, 5),)), PREFIX + r"append_len needs append=True"),
        (dict(append_len=0, requests=((3, 5),)), PREFIX + r"append_len must be in \[1, q_len\].*got 0"),
        (
            dict(append_len=4, requests=((3, 5),)),
            PREFIX + r"append_len must be in \[1, q_len\].*got 4 with q_lens \[3\]",
        ),
        (dict(append_len=3, requests=((3, 5), (3, 9))), PREFIX + r"append_len must be .*equal to every q_len"),
        (
            dict(append_len=2, requests=((1, 5), (3, 9))),
            PREFIX + r"append_len must be in \[1, q_len\] for every request",
        ),
        (dict(append_len=2, requests=((3, 1),)), PREFIX + r"append_len \(2\) must be <= kv_len for every request"),
        (dict(append_len=-1, requests=((3, 5),)), PREFIX + r"append_len must be in \[1, q_len\]"),
        (dict(quant="int8_t2", requests=((3, 5),)), PREFIX + r"append with quant needs an fp8 type"),
    ],
)
def test_invalid_short_appends_get_one_line_naming_the_field(kw, message) -> None:
    fields = dict(num_heads=4, num_kv_heads=2, head_dim=32, append=True) | kw
    with pytest.raises(CaseError, match=message) as info:
        AttentionCase(**fields)
    assert len(str(info.value).splitlines()) == 1


def test_append_len_json_type_is_checked() -> None:
    data = {"requests": [[3, 5]], "num_heads": 2, "num_kv_heads": 2, "head_dim": 8, "append": True}
    with pytest.raises(CaseError, match="append_len"):
        AttentionCase.from_json(data | {"append_len": "2"})
    assert AttentionCase.from_json(data | {"append_len": 2}).append_len == 2
    assert AttentionCase.from_json(data | {"append_len": None}).append_len is None


def test_short_append_may_see_no_key_with_an_empty_cache() -> None:
    """The peer draws cache_seqlens from 0: kv_len = seqlen_new < q_len is legal for a short append only."""
    C([(6, 2)], causal=True, append_len=2)
    with pytest.raises(CaseError, match="append needs q_len <= kv_len"):
        C([(6, 2)], causal=True)


# ---------------------------------------------------------------- adapters: who runs, who refuses
SHORT = C([(4, 300), (4, 77)], h=8, hk=2, d=128, causal=True, append_len=1)
FP8 = C([(2, 40), (2, 9)], h=8, hk=1, d=128, causal=True, quant="fp8_e4m3", kv_layout="NHD", block_size=16)


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_every_adapter_runs_or_refuses_a_short_and_an_fp8_append_with_a_reason(name: str) -> None:
    backend = get_backend(name)
    device = backend.devices[0]
    for case in (SHORT, FP8):
        s = backend.supports(case, device)
        assert isinstance(s, Support) and (s.ok or s.reason.strip()), (name, case.id)
    caps = backend.capabilities()
    for feature in ("append_short", "append_quant"):
        if not caps["append"].ok:
            continue  # refused already by "append" (sorted first in the reason)
        assert feature in caps


@pytest.mark.parametrize(
    "backend, case, reason",
    [
        (FA2Backend(), FP8, "append_quant: FA2 takes fp16 and bf16 inputs only"),
        (FA3Backend(), FP8, "append_quant: this adapter passes no fp8 inputs"),
        (get_backend("fa4"), SHORT, "append: FA4 has no kvcache entry point"),
        (get_backend("torch-flash"), SHORT, "append: aten._flash_attention_forward"),
        (get_backend("flashmla"), SHORT, "append:"),
        (get_backend("fa3-vllm"), SHORT, "append: by the wrapper"),
    ],
)
def test_adapters_refuse_what_they_cannot_append(backend, case, reason) -> None:
    s = backend.supports(case, "cuda")
    assert not s.ok and s.reason.startswith(reason), s.reason


def test_fa2_and_fa3_and_the_torch_backends_accept_a_short_append() -> None:
    for backend, device in ((FA2Backend(), "cuda"), (FA3Backend(), "cuda"), (SdpaCpuBackend(), "cpu")):
        assert backend.supports(SHORT, device), (backend.name, backend.supports(SHORT, device).reason)
    assert SdpaCpuBackend().supports(FP8, "cpu") and FlexCpuBackend().supports(FP8, "cpu")


# ---------------------------------------------------------------- the kernels' plans (no kernel import)
def test_fa2_plan_of_a_short_append_passes_seqlen_new_new_keys() -> None:
    """FA2 2.8.3 flash_attn_with_kvcache: k (b, seqlen_new, hk, d) written at cache_seqlens, q (b, seqlen_q, h, d)."""
    inputs = make_inputs(SHORT, seed=0)
    call = fa2_plan(SHORT, inputs)
    kw = call.kwargs
    assert call.entry == FA2_KVCACHE
    assert kw["q"].shape == (2, 4, 8, 128) and kw["k"].shape == (2, 1, 2, 128) and kw["v"].shape == (2, 1, 2, 128)
    assert kw["cache_seqlens"].dtype == torch.int32 and kw["cache_seqlens"].tolist() == [299, 76]
    assert torch.equal(kw["k"][:, 0], inputs.k[[299, 376]]) and kw["causal"] is True
    assert kw["k_cache"].shape[1] >= 300  # the contiguous cache holds cache_seqlens + seqlen_new keys


def test_fa2_plan_of_a_paged_short_append() -> None:
    case = C([(16, 300), (16, 5)], h=6, hk=3, d=64, causal=True, window=(64, 0), append_len=5, kv_layout="NHD",
             block_size=256)  # fmt: skip
    inputs = make_inputs(case, seed=0)
    kw = fa2_plan(case, inputs).kwargs
    assert kw["block_table"] is inputs.block_table and kw["k_cache"] is inputs.k_cache
    assert kw["cache_seqlens"].tolist() == [295, 0] and kw["k"].shape == (2, 5, 3, 64)
    assert kw["window_size"] == (64, 0)


def test_fa3_plan_of_a_short_append_counts_the_new_keys_in_cu_seqlens_k_new() -> None:
    case = C([(3, 300), (2, 20), (5, 5)], causal=True, append_len=2, kv_layout="NHD", block_size=16)
    inputs = make_inputs(case, seed=0)
    kw = fa3_plan(case, inputs).kwargs
    assert kw["cu_seqlens_k_new"].tolist() == [0, 2, 4, 6] and kw["cu_seqlens_q"].tolist() == [0, 3, 5, 10]
    assert kw["k"].shape == (6, 2, 32) and kw["cache_seqlens"].tolist() == [298, 18, 3]
    assert kw["max_seqlen_q"] == 5
    full = C([(3, 300), (2, 20)], causal=True, kv_layout="NHD", block_size=16)
    fkw = fa3_plan(full, make_inputs(full, seed=0)).kwargs
    assert torch.equal(fkw["cu_seqlens_k_new"], fkw["cu_seqlens_q"])  # every query a new key: today's call


# ---------------------------------------------------------------- fp8 appends
def test_fp8_append_new_keys_are_the_caches_own_fp8_bytes() -> None:
    """As hopper/test_flash_attn.py (01afd16d) builds them: k_new goes through the same cast as the cache, so the
    stored new rows are the stored keys' rows and share the cache's descales."""
    case = C([(3, 10), (2, 5)], causal=True, kv_layout="HND", block_size=4, quant="fp8_e4m3", descale="head",
             append_len=1)  # fmt: skip
    inputs = make_inputs(case, seed=2)
    quant = inputs.quant
    assert quant.k_new.dtype == torch.float8_e4m3fn and quant.v_new.dtype == torch.float8_e4m3fn
    assert torch.equal(quant.k_new.view(torch.uint8), quant.k[[9, 14]].view(torch.uint8))
    assert torch.equal(quant.v_new.view(torch.uint8), quant.v[[9, 14]].view(torch.uint8))


@pytest.mark.parametrize("append_len", [None, 1])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_fp8_append_writes_the_stored_rows_into_the_stored_cache(append_len, layout) -> None:
    """sdpa-cpu / flex-cpu's append (``_torch_common.sequences``) writes the stored fp8 rows (not the dequantized ones)
    into a clone of the stored cache: every request then reads exactly its stored keys, dequantized with the
    cache's descales; other new bytes give other keys."""
    from attnfast._torch_common import _dequant_kv, sequences

    case = C([(3, 10), (2, 5)], append_len=append_len, causal=True, kv_layout=layout, block_size=4,
             quant="fp8_e4m3", descale="head")  # fmt: skip
    inputs = make_inputs(case, seed=2)
    quant, cu_k = inputs.quant, inputs.cu_seqlens_k.tolist()
    cache_before = inputs.k_cache.clone()
    first = sequences(case, inputs)
    for seq in first:
        keys = slice(cu_k[seq.index], cu_k[seq.index + 1])
        k, v = _dequant_kv(case, inputs, seq.index, quant.k[keys], quant.v[keys], None)
        assert torch.equal(seq.k, k.to(case.torch_dtype)) and torch.equal(seq.v, v.to(case.torch_dtype))
    assert torch.equal(inputs.k_cache.view(torch.uint8), cache_before.view(torch.uint8))  # a clone was written
    out = SdpaCpuBackend().prepare(case, inputs)().out
    quant.k_new = (quant.k_new.float() * 2).to(torch.float8_e4m3fn)
    assert not torch.equal(sequences(case, inputs)[0].k, first[0].k)
    assert not torch.equal(SdpaCpuBackend().prepare(case, inputs)().out, out)


# ---------------------------------------------------------------- the fuzzer draws and shrinks them
def test_the_fuzzer_draws_short_appends_and_the_shrinker_undoes_them() -> None:
    from conformance.fuzz.draw import draw
    from conformance.fuzz.shrink import candidates, complexity

    drawn = [d.case for d in (draw(0, i) for i in range(400)) if d.case is not None and d.case.append]
    short = [c for c in drawn if c.append_len is not None]
    assert short and len(short) < len(drawn)  # some appends short, not all
    case = short[0]
    moves = dict(candidates(case))
    label = f"append_len {case.append_len} -> None"
    assert moves[label].append_len is None and moves[label].append
    assert all(complexity(c) < complexity(case) for c in moves.values())
    assert moves["drop append"].append_len is None and not moves["drop append"].append
