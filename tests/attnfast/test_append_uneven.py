"""Uneven appends (``append_lens``: a count of new keys per request), on CPU.

FA3's ``test_flash_attn_kvcache`` with ``varlen_q`` draws each sequence's new keys apart from its query tokens
(``key_new_padding_mask``) and passes them packed with ``cu_seqlens_k_new`` (hopper/test_flash_attn.py,
flash-attention 0251105a, lines 787-790 and 971-981).  The oracle is ``test_append_short``'s: flash-attention's own
construction (new keys written into a cache at ``cache_seqlens``, the query rows aligned to the end of the keys),
written out independently of ``attnref``; it reads the per-request counts from ``cu_seqlens_k_new``.
"""

from __future__ import annotations

import json
import sys

import pytest
import torch

from attnfast._fa_common import padded_new_tokens
from attnfast.base import Support
from attnfast.fa2 import FA2Backend
from attnfast.fa3 import KVCACHE as FA3_KVCACHE, FA3Backend, fa3_plan
from attnfast.flex import FlexCpuBackend
from attnfast.registry import BUILTIN, get_backend
from attnfast.sdpa import SdpaCpuBackend
from attnref import Numerics, gather_kv
from conformance.cases.case import AttentionCase, CaseError, append_fields
from conformance.cases.inputs import make_inputs
from conformance.cases.space_classify import classify_append
from conformance.ledger.fields import case_view
from conformance.verdict.reference import reference
from fake_fa3 import assert_matches_reference, make_fake_fa3
from test_append_short import C, peer_oracle

PREFIX = r"^invalid AttentionCase: "  # CaseError's one line

ORACLE_CASES = {
    "causal_contig": C([(5, 12), (3, 9), (4, 4)], causal=True, append_lens=(2, 7, 4)),
    "causal_paged_nhd": C(
        [(6, 20), (4, 4), (2, 11)], causal=True, append_lens=(3, 1, 9), kv_layout="NHD", block_size=4
    ),
    "window_paged_hnd": C(
        [(7, 30), (3, 9)], causal=True, window=(3, 0), append_lens=(1, 5), kv_layout="HND", block_size=8
    ),
    "window_sym_one_empty": C([(6, 15), (2, 8)], window=(2, 1), append_lens=(4, 0)),
    "noncausal_mqa": C([(4, 10), (2, 6)], h=4, hk=1, append_lens=(1, 6)),
    "sq_gt_sk": C([(6, 2), (6, 8)], causal=True, append_lens=(2, 3)),  # request 0: kv_len < q_len
}
FP8 = C([(3, 10), (2, 5)], causal=True, kv_layout="NHD", block_size=4, quant="fp8_e4m3", descale="head",
        append_lens=(4, 1))  # fmt: skip


# ---------------------------------------------------------------- the case model
def test_uneven_append_fields_inputs_and_names() -> None:
    case = ORACLE_CASES["causal_paged_nhd"]
    assert case.new_kv_lens == [3, 1, 9] and case.cached_kv_lens == [17, 3, 2]
    assert {"append", "append_uneven"} <= case.features() and "append_short" not in case.features()
    assert "_appendv3.1.9-" in case.id and case.to_json()["append_lens"] == [3, 1, 9]
    inputs = make_inputs(case, seed=0)
    assert inputs.cu_seqlens_k_new.tolist() == [0, 3, 4, 13] and inputs.k_new.shape == (13, 2, 32)
    cu_k = inputs.cu_seqlens_k.tolist()
    for b, n in enumerate(case.new_kv_lens):  # each request's last n keys, packed
        start = inputs.cu_seqlens_k_new[b]
        assert torch.equal(inputs.k_new[start : start + n], inputs.k[cu_k[b + 1] - n : cu_k[b + 1]])
        assert torch.equal(inputs.v_new[start : start + n], inputs.v[cu_k[b + 1] - n : cu_k[b + 1]])
    # the paged cache holds only the keys before the call; the slots the append writes are stale
    keys, _ = gather_kv(inputs.k_cache, inputs.block_table, inputs.seqlens_k)
    for b, keep in enumerate(case.cached_kv_lens):
        got, want = keys[cu_k[b] : cu_k[b + 1]], inputs.k[cu_k[b] : cu_k[b + 1]]
        assert torch.equal(got[:keep], want[:keep]) and not torch.equal(got[keep:], want[keep:])


def test_json_round_trip_and_old_records() -> None:
    case = ORACLE_CASES["window_paged_hnd"]
    text = json.dumps(case.to_json())
    assert AttentionCase.from_json(json.loads(text)) == case and AttentionCase.from_json(json.loads(text)).id == case.id
    assert AttentionCase.from_json(json.loads(text), strict=True) == case
    old = {"requests": [[3, 5], [2, 2]], "num_heads": 2, "num_kv_heads": 2, "head_dim": 8, "append": True}
    loaded = AttentionCase.from_json(old)  # a record written before append_lens
    assert loaded.append_lens == () and loaded.new_kv_lens == [3, 2] and "append_lens" not in loaded.to_json()
    assert AttentionCase.from_json(old | {"append_lens": []}) == loaded  # the default, as a list
    assert AttentionCase.from_json(old | {"append_lens": [5, 1]}).new_kv_lens == [5, 1]


@pytest.mark.parametrize(
    "q_lens, new, fields",
    [
        ([3, 2], [3, 2], {"append_len": None, "append_lens": ()}),
        ([3, 2], [1, 1], {"append_len": 1, "append_lens": ()}),
        ([3, 2], [2, 2], {"append_len": 2, "append_lens": ()}),
        ([3, 2], [3, 3], {"append_len": None, "append_lens": (3, 3)}),  # above a q_len: no append_len says it
        ([3, 2], [0, 0], {"append_len": None, "append_lens": (0, 0)}),
        ([3, 2], [1, 2], {"append_len": None, "append_lens": (1, 2)}),
        ([4], [6], {"append_len": None, "append_lens": (6,)}),
    ],
)
def test_append_fields_is_the_one_spelling(q_lens, new, fields) -> None:
    assert append_fields(q_lens, new) == fields
    requests = [(q, n + 5) for q, n in zip(q_lens, new)]
    case = C(requests, **fields)
    assert case.new_kv_lens == list(new)


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(append=False, append_lens=(1, 2)), r"append_lens needs append=True"),
        (dict(append_len=1, append_lens=(1, 2)), r"append_lens and append_len cannot both be set"),
        (dict(append_lens=(1,)), r"append_lens must hold one count per request \(2\), got 1"),
        (dict(append_lens=(1, 2, 3)), r"append_lens must hold one count per request \(2\), got 3"),
        (dict(append_lens=(-1, 2)), r"append_lens\[0\] = -1 must be in \[0, kv_len\] \(5: "),
        (dict(append_lens=(1, 10)), r"append_lens\[1\] = 10 must be in \[0, kv_len\] \(9: "),
        (dict(append_lens=(3, 2)), r"append_lens must hold counts append_len cannot say .* is append_len unset"),
        (dict(append_lens=(1, 1)), r"append_lens must hold counts append_len cannot say .* is append_len=1"),
        (dict(append_lens="12"), r"append_lens must be a sequence of integers \(new keys per request\), got \"12\""),
        (dict(append_lens=(1, 2**63)), r"append_lens\[1\] must fit in a 64-bit integer"),
    ],
)
def test_invalid_uneven_appends_get_one_line_naming_the_field(kw, message) -> None:
    fields = dict(requests=((3, 5), (2, 9)), num_heads=4, num_kv_heads=2, head_dim=32, append=True) | kw
    with pytest.raises(CaseError, match=PREFIX + message) as info:
        AttentionCase(**fields)
    assert len(str(info.value).splitlines()) == 1


@pytest.mark.parametrize("value", ["2", [1.5, 2], [True, 2], [[1], 2], {"a": 1}])
def test_append_lens_json_type_is_checked(value) -> None:
    data = {"requests": [[3, 5], [2, 9]], "num_heads": 2, "num_kv_heads": 2, "head_dim": 8, "append": True}
    with pytest.raises(CaseError, match=r"append_lens must be a list of integers, got") as info:
        AttentionCase.from_json(data | {"append_lens": value})
    assert len(str(info.value).splitlines()) == 1


# ---------------------------------------------------------------- the reference and the torch adapters
@pytest.mark.parametrize("name", sorted(ORACLE_CASES))
def test_reference_and_torch_backends_match_the_peer_oracle(name: str) -> None:
    """attnref (on the packed keys), sdpa-cpu and flex-cpu (writing each request's k_new into the cache) against the
    peer's construction with per-request counts; rows that see no key must be empty (LSE -inf) in the reference."""
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
                for label, out in got.items():
                    torch.testing.assert_close(out.out[token].double(), want, atol=3e-2, rtol=3e-2, msg=label)
            token += 1


def test_the_oracle_and_the_adapters_read_each_requests_own_new_keys() -> None:
    """A wrong new key of the request that appends the most moves the oracle and sdpa-cpu (they read k_new), not the
    reference (it reads the packed keys): the adapters are judged on what they were given."""
    case = ORACLE_CASES["causal_contig"]
    inputs = make_inputs(case, seed=3)
    before, out = peer_oracle(case, inputs)[1][-1], SdpaCpuBackend().prepare(case, inputs)().out
    start = int(inputs.cu_seqlens_k_new[1])
    inputs.k_new[start] += 1.0  # request 1's first new key (7 new keys beside 3 query tokens)
    assert not torch.allclose(peer_oracle(case, inputs)[1][-1], before, atol=1e-3)
    assert not torch.equal(SdpaCpuBackend().prepare(case, inputs)().out[3:6], out[3:6])


def test_an_fp8_uneven_append_matches_the_reference() -> None:
    """The stored fp8 rows of each request's new keys, written by sdpa-cpu and flex-cpu into the stored cache."""
    inputs = make_inputs(FP8, seed=2)
    assert inputs.quant.k_new.shape[0] == 5 and inputs.quant.k_new.dtype == torch.float8_e4m3fn
    for backend in (SdpaCpuBackend(), FlexCpuBackend()):
        assert backend.supports(FP8, "cpu"), backend.supports(FP8, "cpu").reason
        assert_matches_reference(FP8, inputs, backend.prepare(FP8, inputs)(), label=backend.name)


# ---------------------------------------------------------------- adapters: who runs, who refuses
UNEVEN = C([(4, 300), (2, 77)], h=8, hk=2, d=128, causal=True, append_lens=(1, 5))


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_every_adapter_runs_or_refuses_an_uneven_append_with_a_reason(name: str) -> None:
    backend = get_backend(name)
    for case in (UNEVEN, FP8):
        s = backend.supports(case, backend.devices[0])
        assert isinstance(s, Support) and (s.ok or s.reason.strip()), (name, case.id)
    caps = backend.capabilities()
    assert caps["append"].ok or not caps["append_uneven"].ok  # no adapter takes an uneven append but no append


@pytest.mark.parametrize(
    "backend, reason",
    [
        (FA2Backend(), "append_uneven: flash_attn_with_kvcache (2.8.3) takes the new keys as one dense"),
        (get_backend("fa3-vllm"), "append: by the wrapper"),
        (get_backend("fa4"), "append: FA4 has no kvcache entry point"),
        (get_backend("torch-flash"), "append: aten._flash_attention_forward"),
        (get_backend("flashmla"), "append:"),
    ],
)
def test_adapters_refuse_what_they_cannot_append(backend, reason) -> None:
    s = backend.supports(UNEVEN, "cuda")
    assert not s.ok and s.reason.startswith(reason), s.reason


def test_fa3_and_the_torch_backends_accept_an_uneven_append() -> None:
    for backend, device in ((FA3Backend(), "cuda"), (SdpaCpuBackend(), "cpu"), (FlexCpuBackend(), "cpu")):
        assert backend.supports(UNEVEN, device), (backend.name, backend.supports(UNEVEN, device).reason)
    assert not FA3Backend().supports(FP8, "cuda")  # fp8: append_quant, refused by the upstream FA3 adapter


def test_fa2_has_no_dense_view_of_uneven_new_keys() -> None:
    """The one FA2 layout of new keys is (b, seqlen_new, hk, d): the helper that builds it refuses uneven counts (FA2
    refuses the case before, by its declared reason)."""
    inputs = make_inputs(UNEVEN, seed=0)
    with pytest.raises(ValueError, match=r"new keys per request \[1, 5\] are not 1 each"):
        padded_new_tokens(inputs, 1)


# ---------------------------------------------------------------- FA3's arguments and its fake kernel
def test_fa3_plan_of_an_uneven_append_packs_each_requests_new_keys() -> None:
    case = C([(3, 300), (2, 20), (5, 5)], causal=True, append_lens=(1, 7, 0), kv_layout="NHD", block_size=16)
    inputs = make_inputs(case, seed=0)
    call = fa3_plan(case, inputs)
    kw = call.kwargs
    assert call.entry == FA3_KVCACHE
    assert kw["cu_seqlens_k_new"].tolist() == [0, 1, 8, 8] and kw["cu_seqlens_q"].tolist() == [0, 3, 5, 10]
    assert kw["k"].shape == (8, 2, 32) and kw["v"].shape == (8, 2, 32) and kw["k"] is inputs.k_new
    assert kw["cache_seqlens"].dtype == torch.int32 and kw["cache_seqlens"].tolist() == [299, 13, 5]
    assert kw["max_seqlen_q"] == 5 and kw["page_table"] is inputs.block_table


@pytest.fixture
def fake_fa3(monkeypatch):
    mod = make_fake_fa3()
    monkeypatch.setitem(sys.modules, "flash_attn_interface", mod)
    return mod


@pytest.mark.parametrize("name", sorted(ORACLE_CASES))
def test_fa3_against_its_fake_kernel(fake_fa3, name: str) -> None:
    """The adapter's call run by the fake FA3 (attnref on the arguments it receives, the new keys written at
    cache_seqlens through cu_seqlens_k_new), against the reference; the cache then holds every key."""
    case = ORACLE_CASES[name]
    inputs = make_inputs(case, seed=1)
    assert FA3Backend().supports(case, "cuda"), FA3Backend().supports(case, "cuda").reason
    assert_matches_reference(case, inputs, FA3Backend().prepare(case, inputs)(), label=f"fake FA3 {name}")
    ((entry, args),) = fake_fa3.calls
    assert entry == "flash_attn_with_kvcache" and args["cu_seqlens_k_new"].tolist() == inputs.cu_seqlens_k_new.tolist()
    if case.paged:
        keys, _ = gather_kv(inputs.k_cache, inputs.block_table, inputs.seqlens_k, layout=case.kv_layout)
        assert torch.equal(keys, inputs.k)


def test_the_fake_fa3_refuses_new_keys_that_cu_seqlens_k_new_does_not_count(fake_fa3) -> None:
    """hopper/flash_api.cpp: k_new is (total_k_new, h_k, d) with cu_seqlens_k_new of batch + 1 entries; a dense
    (b, n, hk, d) k or a count list of the wrong length is not that call."""
    case = ORACLE_CASES["causal_contig"]
    inputs = make_inputs(case, seed=1)
    kw = fa3_plan(case, inputs).kwargs
    fn = fake_fa3.flash_attn_with_kvcache
    with pytest.raises(RuntimeError, match="cu_seqlens_k_new must have shape"):
        fn(**(kw | {"cu_seqlens_k_new": kw["cu_seqlens_k_new"][:-1]}))
    with pytest.raises(RuntimeError, match=r"k_new must have shape \(total_k_new, h_k, d\)"):
        fn(**(kw | {"k": kw["k"][:-1]}))


# ---------------------------------------------------------------- the fuzzer's shrinker, the ledger, the space
def test_the_shrinker_keeps_each_kept_requests_new_keys() -> None:
    from conformance.fuzz.shrink import _HANDLED, candidates, complexity

    assert "append_lens" in _HANDLED
    case = C([(5, 12), (3, 9), (4, 4), (2, 6)], causal=True, append_lens=(2, 7, 4, 1))
    moves = dict(candidates(case))
    assert all(complexity(c) < complexity(case) for c in moves.values())
    assert moves["keep only request 1 (3, 9)"].new_kv_lens == [7]
    assert moves["keep only request 3 (2, 6)"].append_len == 1  # one request of 1 new key: a short append
    assert moves["keep only request 2 (4, 4)"].append_len is None  # its q_len new keys
    assert moves["drop request 0 (5, 12)"].new_kv_lens == [7, 4, 1]
    assert moves["keep the first half of the requests"].new_kv_lens == [2, 7]
    assert moves["append_lens [2, 7, 4, 1] -> None"].new_kv_lens == [5, 3, 4, 2]
    assert moves["append_lens[1] 7 -> 0"].new_kv_lens == [2, 0, 4, 1]
    assert not moves["drop append"].append and not moves["drop append"].append_lens
    shrunk = moves["request 1 (3, 9) -> (2, 8)"]  # a length move keeps the request's count
    assert shrunk.requests[1] == (2, 8) and shrunk.new_kv_lens == [2, 7, 4, 1]


def test_ledger_fields_of_an_uneven_append() -> None:
    view = case_view(UNEVEN)
    assert view.value("append_uneven") is True and view.value("append_len") is None
    assert (view.value("min_new_kv_len"), view.value("max_new_kv_len")) == (1, 5)
    short = case_view(C([(4, 9), (4, 7)], append_len=2))
    assert short.value("append_uneven") is False and short.value("max_new_kv_len") == 2
    assert case_view(C([(4, 9)]).replace(append=False)).value("max_new_kv_len") == 0


def test_the_case_space_buckets_an_uneven_append_with_the_short_ones() -> None:
    assert classify_append(UNEVEN) == "short" and classify_append(UNEVEN.replace(append_lens=())) is True
