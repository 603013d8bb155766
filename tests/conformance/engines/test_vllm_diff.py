"""Seed 000 (vLLM V0 differential attention) replayed: conformance.engines.vllm_diff.

* every scenario passes the verdict on the CPU backends, and the calls ``forward`` makes are exactly ``plan``'s;
* the oracle (``reference``) agrees with an independent fp64 numpy implementation of the layer written here;
* the cache is one ``(2, 2, num_blocks, block, hk/2, d)`` tensor and each call reads the pair's groups of it;
* planted bugs (lambda sign, (1 - lambda_init) dropped, contiguous halves instead of stripes, subln skipped,
  the k1 cache read for k2) fail while the bug-free engine passes the same cases;
* bad metadata raises ``ValueError`` naming the field.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from attnfast.registry import get_backend
from conformance.engines import get_engine
from conformance.cases.paged_kv import STALE
from conformance.engines.vllm_diff import (
    RMS_EPS,
    SCENARIOS,
    VllmDifferentialAttention,
    layer_params,
    validate_metadata,
)
from conformance.records import Status
from conformance.verdict.check import CaseContext, check_backend, prepare_context
from tests.conformance.engines.recorder import Recorder, engine_verdict

ENGINE = VllmDifferentialAttention()
CASES = [c for c in ENGINE.cases() if not c.graph and not c.invariance]  # graph, invariance: their own tests
BF16 = {c.scenario: c for c in CASES if c.dtype == "bf16"}
_CONTEXTS: dict[str, CaseContext] = {}


def _ctx(case) -> CaseContext:
    """One prepared context per case for the whole module (check_backend gives each verdict fresh input clones)."""
    if case.id not in _CONTEXTS:
        _CONTEXTS[case.id] = prepare_context(case, 0, "cpu")
    ctx = _CONTEXTS[case.id]
    ctx.ref_charged = False
    return ctx


def test_cases_cover_the_scenarios_and_are_registered():
    assert {c.scenario for c in CASES} == set(SCENARIOS) == {"prefill", "prefix_cached", "decode", "mixed", "gqa"}
    assert isinstance(get_engine("vllm_diff"), VllmDifferentialAttention)
    assert all(c.engine == "vllm_diff" and c.id.startswith(f"vllm_diff-{c.scenario}_") for c in CASES)
    assert "gqa" in BF16["gqa"].features() and "mixed" in BF16["mixed"].features()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
@pytest.mark.parametrize("backend", ["sdpa-cpu", "flex-cpu"])
def test_scenarios_pass_on_the_cpu_backends(case, backend):
    res = check_backend(_ctx(case), get_backend(backend))
    assert res.status is Status.PASS, res.reason
    assert res.extra["engine"] == {"engine": "vllm_diff", "scenario": case.scenario, "seed": "000"}
    assert len(res.extra["notes"]) == len(ENGINE.plan(case))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_plan_is_exactly_the_calls_forward_makes(case):
    rec = Recorder()
    ctx = prepare_context(case, 0, "cpu")
    out = ENGINE.forward(case, ctx.inputs, rec)
    assert [(c.label, c.case) for c in rec.calls] == ENGINE.plan(case)
    assert all(c.inputs.case is c.case for c in rec.calls)
    assert out.lse is None and out.out.shape == (case.total_q, case.num_heads, case.head_dim)
    branches = {label.split()[1] for label, _ in ENGINE.plan(case)}
    assert len(rec.calls) == 4 * len(branches)
    for call in rec.calls:  # each call sees half the heads
        assert (call.case.num_heads, call.case.num_kv_heads) == (case.num_heads // 2, case.num_kv_heads // 2)
        assert call.case.paged == (call.label.endswith("decode") or case.scenario == "prefix_cached")


def test_every_paged_call_reads_the_pairs_groups_of_one_stacked_cache():
    case = BF16["mixed"]
    rec = Recorder()
    ctx = prepare_context(case, 0, "cpu")
    ENGINE.forward(case, ctx.inputs, rec)
    groups = {"attn11": (0, 0), "attn12": (0, 1), "attn21": (1, 0), "attn22": (1, 1)}  # (key group, value group)
    meta = ENGINE.metadata(case)
    paged = [c for c in rec.calls if c.case.paged]
    assert len(paged) == 4
    for call in paged:
        cache = call.inputs.k_cache._base
        assert cache is not None and tuple(cache.shape) == (2, 2, meta.num_blocks, 16, case.num_kv_heads // 2, 64)
        gk, gv = groups[call.label.split()[0]]
        assert call.inputs.k_cache.data_ptr() == cache[gk, 0].data_ptr()
        assert call.inputs.v_cache.data_ptr() == cache[gv, 1].data_ptr()
        assert call.inputs.v_cache._base is cache
    # the written slots hold the keys (stripes of inputs.k), every other slot stays stale
    cache = paged[0].inputs.k_cache._base
    written = {s for b, n in enumerate(case.kv_lens) for s in (meta.blocks[b][t // 16] * 16 + t % 16 for t in range(n))}
    flat = cache.reshape(2, 2, -1, case.num_kv_heads // 2, 64)
    unused = torch.tensor(sorted(set(range(meta.num_blocks * 16)) - written))
    assert bool((flat[:, :, unused] == STALE).all())
    b, t = 3, 50  # a cached token of the second decode
    slot = meta.blocks[b][t // 16] * 16 + t % 16
    row = int(ctx.inputs.cu_seqlens_k[b]) + t
    torch.testing.assert_close(flat[1, 0, slot], ctx.inputs.k[row, 1::2], rtol=0, atol=0)
    torch.testing.assert_close(flat[0, 1, slot], ctx.inputs.v[row, 0::2], rtol=0, atol=0)


# ------------------------------------------------------------------ the oracle, checked independently
def _numpy_layer(case, inputs) -> np.ndarray:
    """The differential attention layer in fp64 numpy, one (request, head pair) at a time."""
    p = layer_params(case)
    q, k, v = (x.double().numpy() for x in (inputs.q, inputs.k, inputs.v))
    h, hk, d = case.num_heads, case.num_kv_heads, case.head_dim
    lq1, lk1, lq2, lk2 = (x.double().numpy() for x in (p.lambda_q1, p.lambda_k1, p.lambda_q2, p.lambda_k2))
    lam = math.exp(float(lq1 @ lk1)) - math.exp(float(lq2 @ lk2)) + p.lambda_init
    w = p.subln_weight.double().numpy()
    out = np.zeros((case.total_q, h, d))
    q0 = k0 = 0
    for sq, sk in case.requests:
        pos = np.arange(sq)[:, None] + sk - sq
        cols = np.arange(sk)[None, :]
        visible = cols <= pos
        if case.window[0] is not None:
            visible &= cols >= pos - case.window[0]
        for i in range(h // 2):
            j = i // (h // hk)  # kv head pair (2j, 2j + 1) of query head pair (2i, 2i + 1)
            vcat = np.concatenate([v[k0 : k0 + sk, 2 * j], v[k0 : k0 + sk, 2 * j + 1]], axis=-1)
            probs = []
            for g in (0, 1):
                s = q[q0 : q0 + sq, 2 * i + g] @ k[k0 : k0 + sk, 2 * j + g].T / math.sqrt(d)
                s = np.where(visible, s, -np.inf)
                e = np.exp(s - s.max(axis=-1, keepdims=True))
                probs.append(e / e.sum(axis=-1, keepdims=True))
            x = probs[0] @ vcat - lam * (probs[1] @ vcat)
            x = x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + RMS_EPS) * w * (1 - p.lambda_init)
            out[q0 : q0 + sq, 2 * i], out[q0 : q0 + sq, 2 * i + 1] = x[:, :d], x[:, d:]
        q0, k0 = q0 + sq, k0 + sk
    return out


SMALL = [BF16["mixed"].replace(requests=((9, 9), (3, 3), (1, 12))), BF16["gqa"].replace(dtype="fp32"), BF16["decode"]]


@pytest.mark.parametrize("case", SMALL, ids=[c.id for c in SMALL])
def test_reference_matches_an_independent_numpy_oracle(case):
    inputs = prepare_context(case, 0, "cpu").inputs
    ref = ENGINE.reference(case, inputs)
    tol = 1e-9 if case.dtype == "fp32" else 1e-4
    np.testing.assert_allclose(ref.out.double().numpy(), _numpy_layer(case, inputs), rtol=tol, atol=tol)
    assert ref.out.dtype == (torch.float64 if case.dtype == "fp32" else torch.float32)
    assert ref.lse.shape == (case.num_heads, case.total_q) and bool(ref.lse.isnan().all())
    base_out, base_lse = ENGINE.baseline(case, inputs)
    assert base_out.dtype == case.torch_dtype and base_lse.shape == ref.lse.shape
    assert float((base_out.double() - ref.out.double()).abs().max()) < 0.1


def test_layer_parameters_are_deterministic_and_in_the_models_ranges():
    case = BF16["prefill"]
    a, b = layer_params(case), layer_params(case)
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        assert torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y
    assert a.lambda_q1.shape == (64,) and a.lambda_q1.dtype == torch.float32
    assert a.subln_weight.shape == (128,) and a.subln_weight.dtype == torch.bfloat16
    assert 0.2 < a.lambda_init < 0.8
    assert not torch.equal(layer_params(BF16["decode"]).lambda_q1, a.lambda_q1)


# ------------------------------------------------------------------ planted bugs
class _LambdaSignFlipped(VllmDifferentialAttention):
    def combine(self, attn1, attn2, lambda_full):
        return attn1 + lambda_full * attn2


class _LambdaInitNotApplied(VllmDifferentialAttention):
    def scale_output(self, attn, lambda_init):
        return attn


class _ContiguousHalves(VllmDifferentialAttention):
    def split_heads(self, x):
        n = x.shape[-2] // 2
        return x[..., :n, :].contiguous(), x[..., n:, :].contiguous()


class _SublnSkipped(VllmDifferentialAttention):
    def subln(self, attn, weight):
        return attn


class _CacheGroupSwapped(VllmDifferentialAttention):
    def read_caches(self, kv_cache):
        key_cache1, value_cache1, _, value_cache2 = super().read_caches(kv_cache)
        return key_cache1, value_cache1, key_cache1, value_cache2  # k2 read from the k1 cache


def _verdict(engine_cls, case, monkeypatch, backend="sdpa-cpu"):
    return engine_verdict(_ctx(case), engine_cls(), monkeypatch, backend)


_BUG_FREE: dict[str, Status] = {}


def _bug_free_status(case, monkeypatch) -> Status:
    """The bug-free engine's verdict of ``case`` on sdpa-cpu, judged once per case for every planted bug."""
    if case.id not in _BUG_FREE:
        _BUG_FREE[case.id] = _verdict(VllmDifferentialAttention, case, monkeypatch).status
    return _BUG_FREE[case.id]


BUGS = [_LambdaSignFlipped, _LambdaInitNotApplied, _ContiguousHalves, _SublnSkipped, _CacheGroupSwapped]
BUG_CASES = [
    (bug, case)
    for bug in BUGS
    for case in CASES
    if not (bug is _CacheGroupSwapped and case.scenario == "prefill")  # prefill reads no cache: see below
]


@pytest.mark.parametrize("bug,case", BUG_CASES, ids=[f"{b.__name__}-{c.scenario}-{c.dtype}" for b, c in BUG_CASES])
def test_planted_bugs_fail(bug, case, monkeypatch):
    res = _verdict(bug, case, monkeypatch)
    assert res.status is Status.FAIL, res.reason
    assert res.stats.error_ratio > 5, res.reason
    assert _bug_free_status(case, monkeypatch) is Status.PASS


def test_cache_group_swap_is_invisible_where_no_call_reads_the_cache(monkeypatch):
    """The seed's prompts attend their new keys directly; only a cache read (decode, prefix hit) shows the swap."""
    assert _verdict(_CacheGroupSwapped, BF16["prefill"], monkeypatch).status is Status.PASS
    assert _verdict(_CacheGroupSwapped, BF16["decode"], monkeypatch, "flex-cpu").status is Status.FAIL


# ------------------------------------------------------------------ metadata and case checks
class _BadMetadata(VllmDifferentialAttention):
    def __init__(self, change) -> None:
        self.change = change

    def metadata(self, case, device="cpu"):
        meta = super().metadata(case, device)
        self.change(meta)
        return meta


def _short_table(meta):
    meta.block_tables = meta.block_tables[:, :1]


def _seq_lens_short(meta):
    meta.seq_lens = meta.seq_lens.clone()
    meta.seq_lens[0] = 2


def _query_start_loc_wrong(meta):
    meta.query_start_loc = meta.query_start_loc.clone()
    meta.query_start_loc[-1] += 1


def _block_out_of_range(meta):
    meta.block_tables = meta.block_tables.clone()
    meta.block_tables[-1, 0] = meta.num_blocks


def _slot_mapping_short(meta):
    meta.slot_mapping = meta.slot_mapping[:-1]


BAD = [
    ("decode", _short_table, r"block_tables has 1 columns; sequence 0 needs 2 blocks of 32 for seq_lens\[0\] = 50"),
    ("prefix_cached", _seq_lens_short, r"seq_lens\[0\] = 2 is shorter than the 24 query tokens query_start_loc"),
    ("mixed", _query_start_loc_wrong, r"query_start_loc must be non-decreasing from 0 to the 44 query tokens"),
    ("gqa", _block_out_of_range, r"block_tables\[2\] = \[\d+, \d+\] holds a block outside the cache's \d+"),
    ("prefill", _slot_mapping_short, r"slot_mapping must hold one slot per query token \(106\)"),
]


@pytest.mark.parametrize("scenario,change,message", BAD, ids=[b[1].__name__ for b in BAD])
def test_bad_metadata_raises_naming_the_field(scenario, change, message, monkeypatch):
    case = BF16[scenario]
    engine = _BadMetadata(change)
    with pytest.raises(ValueError, match=message):
        engine.plan(case)
    with pytest.raises(ValueError, match=message):
        engine.forward(case, prepare_context(case, 0, "cpu").inputs, Recorder())
    res = _verdict(lambda: _BadMetadata(change), case, monkeypatch)
    assert res.status is Status.ERROR and "ValueError" in res.reason


def test_validate_metadata_accepts_the_builders_metadata_and_checks_seq_start_loc():
    for case in CASES:
        validate_metadata(ENGINE.metadata(case), num_tokens=case.total_q, block_size=case.block_size)
    meta = ENGINE.metadata(BF16["prefill"])
    meta.seq_start_loc = meta.seq_start_loc + 1
    with pytest.raises(ValueError, match="seq_start_loc .* must equal query_start_loc"):
        validate_metadata(meta, num_tokens=BF16["prefill"].total_q, block_size=16)


@pytest.mark.parametrize(
    "changes,message",
    [
        (dict(num_heads=6, num_kv_heads=3), "must be even"),
        (dict(block_size=8), "block size multiple of 16"),
        (dict(kv_layout="HND"), "must be NHD"),
        (dict(alibi=True), "no alibi"),
        (dict(head_dim=48), "head_dim must be one of"),
        (dict(requests=((1, 40), (30, 30))), "prompts listed before decodes"),
        (dict(window=(47, 0), requests=((24, 64),)), "prefix caching with a sliding window"),
        (dict(scenario="nope"), "scenario must be one of"),
    ],
)
def test_cases_the_seed_cannot_run_are_refused(changes, message):
    with pytest.raises(ValueError, match=message):
        ENGINE.plan(BF16["mixed"].replace(**changes))
