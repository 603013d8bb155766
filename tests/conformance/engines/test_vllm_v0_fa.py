"""Seed 002 replayed (vLLM V0 FlashAttention backend, ``conformance.engines.vllm_v0``).

* every scenario passes the verdict on the CPU backends, and every call ``forward`` makes is one ``plan`` lists;
* the metadata is V0's (prefills first, ``query_start_loc``, seq / context lens, block tables, slot mappings with
  the sliding-window padding, ``max_decode_query_len``, encoder and cross fields), and every paged call reads back
  exactly the layer's keys through the cache the engine wrote;
* bad metadata raises ``ValueError`` naming the field;
* planted engine bugs (encoder window spelled as decoder, ``sliding_window`` not minus one, decode order swapped
  in the metadata, fp8 descales dropped, cross attention reading the self-attention cache) fail.
"""

from __future__ import annotations

import json

import pytest
import torch

from attnfast.registry import get_backend
from attnref import quantize, window_from_fa2
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import make_inputs
from conformance.engines import get_engine
from conformance.engines.base import Call, Request
from conformance.engines.vllm_v0 import SCENARIOS, VllmV0FlashAttention
from conformance.engines.vllm_v0.metadata import PAD_SLOT_ID, Seq, build_metadata, check_metadata
from conformance.engines.vllm_v0.scenarios import DECODER, ENCODER_ONLY
from conformance.records import Status
from conformance.verdict.check import check_backend, prepare_context
from tests.conformance.engines.recorder import Recorder, engine_verdict

ENGINE = VllmV0FlashAttention()
CASES = [c for c in ENGINE.cases() if not c.graph and not c.invariance]  # graph, invariance: their own tests
FIRST = {c.scenario: c for c in reversed(CASES)}  # the first config (GQA 8/2, d64, bf16, block 16) of each
_CONTEXTS: dict[str, object] = {}


def _ctx(case: AttentionCase):
    if case.id not in _CONTEXTS:
        _CONTEXTS[case.id] = prepare_context(case, 0, "cpu")
    return _CONTEXTS[case.id]


def _p(new: int, cached: int = 0, encoder: int = 0) -> Seq:
    return Seq(Request(new, cached, encoder), True)


def _d(new: int, cached: int, encoder: int = 0) -> Seq:
    return Seq(Request(new, cached, encoder), False)


def _record(case: AttentionCase, engine: VllmV0FlashAttention = ENGINE) -> list[Call]:
    rec = Recorder()
    engine.forward(case, make_inputs(case, 0, "cpu"), rec)
    return rec.calls


# ------------------------------------------------------------------ scenarios, registry, plan
def test_cases_cover_every_scenario_and_round_trip():
    assert isinstance(get_engine("vllm_v0_fa"), VllmV0FlashAttention)
    assert {c.scenario for c in CASES} == set(SCENARIOS) and len(CASES) == 2 * len(SCENARIOS)
    for case in CASES:
        again = AttentionCase.from_json(json.loads(json.dumps(case.to_json())))
        assert again == case and again.id == case.id and case.id.startswith(f"vllm_v0_fa-{case.scenario}_")
        ENGINE.check(case)


#: every case on sdpa-cpu; on flex-cpu (eager flex builds a block mask per request, ~0.5 s a case) the first config.
ON_BACKENDS = [(c, "sdpa-cpu") for c in CASES] + [(c, "flex-cpu") for c in FIRST.values()]


@pytest.mark.parametrize("case,backend", ON_BACKENDS, ids=[f"{c.id}-{b}" for c, b in ON_BACKENDS])
def test_every_scenario_passes_on_the_cpu_backends(case, backend):
    res = check_backend(_ctx(case), get_backend(backend))
    assert res.status is Status.PASS, res.reason
    labels = [label for label, _ in ENGINE.plan(case)]
    assert [n.split(": " + backend)[0] for n in res.extra["notes"]] == labels


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_every_call_forward_makes_is_planned(case):
    calls = _record(case)
    assert [(c.label, c.case) for c in calls] == ENGINE.plan(case)
    assert all(c.inputs.case is c.case and not c.case.engine for c in calls)


PATHS = {
    "prefill": ["prefill: flash_attn_varlen_func (contiguous k/v)"],
    "prefix_cached_prefill": ["prefill: flash_attn_varlen_func (paged, seqused_k)"],
    "spec_decode": ["decode: flash_attn_varlen_func (paged, max_decode_query_len > 1)"],
    "decode": ["decode: flash_attn_with_kvcache"],
    "mixed": ["prefill: flash_attn_varlen_func (paged, seqused_k)", "decode: flash_attn_with_kvcache"],
    "mixed_spec": [
        "prefill: flash_attn_varlen_func (paged, seqused_k)",
        "decode: flash_attn_varlen_func (paged, max_decode_query_len > 1)",
    ],
    "encoder": ["encoder: flash_attn_varlen_func (encoder q/k/v)"],
    "encoder_only_window": ["prefill: flash_attn_varlen_func (contiguous k/v)"],
    "cross_prefill": ["prefill: flash_attn_varlen_func (encoder k/v)"],
    "cross_decode": ["decode: flash_attn_with_kvcache (cross cache)"],
    "fp8_prefill": ["prefill: flash_attn_varlen_func (contiguous k/v)"],
    "fp8_kv_cache": ["prefill: flash_attn_varlen_func (paged, seqused_k)", "decode: flash_attn_with_kvcache"],
    "fp8_spec_decode": ["decode: flash_attn_varlen_func (paged, max_decode_query_len > 1)"],
}


@pytest.mark.parametrize("scenario", sorted(PATHS))
def test_each_scenario_takes_the_seeds_path(scenario):
    assert [label for label, _ in ENGINE.plan(FIRST[scenario])] == PATHS[scenario]


def test_call_cases_say_what_each_call_is():
    plan = dict(ENGINE.plan(FIRST["mixed"]))  # case order: decode, prompt, decode, prompt -> prompts first
    pre, dec = plan["prefill: flash_attn_varlen_func (paged, seqused_k)"], plan["decode: flash_attn_with_kvcache"]
    assert pre.requests == ((24, 56), (10, 10)) and pre.causal and pre.kv_layout == "NHD" and pre.block_size == 16
    assert dec.requests == ((1, 34), (1, 71)) and dec.causal
    (_, cross_pre), (_, cross_dec) = ENGINE.plan(FIRST["cross_prefill"])[0], ENGINE.plan(FIRST["cross_decode"])[0]
    assert cross_pre.requests == ((6, 30), (1, 47)) and not cross_pre.causal and not cross_pre.paged
    assert cross_dec.requests == ((1, 30), (1, 47), (1, 64)) and cross_dec.causal and cross_dec.paged
    (_, enc_only), (_, swa) = (
        ENGINE.plan(FIRST["encoder_only_window"])[0],
        ENGINE.plan(FIRST["sliding_window_decode"])[0],
    )
    assert enc_only.window == (15, 15) and not enc_only.causal
    assert swa.window == (15, 0) and swa.causal
    for _, call in ENGINE.plan(FIRST["fp8_kv_cache"]):
        assert call.quant == "fp8_e4m3" and call.descale == "head"  # descales expanded to (num_seqs, hk)
    assert all(c.alibi for _, c in ENGINE.plan(FIRST["alibi"]))


def test_window_spelling_maps_the_models_window():
    """The model's w: the layer case says (w - 1, 0) causal / (w - 1, w - 1) encoder-only; vLLM passes w - 1."""
    for scenario, scn in SCENARIOS.items():
        fa = ENGINE.fa_window(scn)
        win = window_from_fa2(*fa)
        assert (win.left, win.right) == FIRST[scenario].window, scenario
    assert ENGINE.fa_window(SCENARIOS["sliding_window_decode"]) == (15, 0)
    assert ENGINE.fa_window(SCENARIOS["encoder_only_window"]) == (15, 15)
    assert ENGINE.fa_window(SCENARIOS["decode"]) == (-1, -1)


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_paged_calls_read_back_the_layers_keys(scenario):
    """The slot-mapping writes put every key where the block table says: each paged call's keys (read back through
    its table, dequantized for fp8) are exactly the layer's keys of its requests."""
    case = FIRST[scenario]
    inputs = make_inputs(case, 0, "cpu")
    scn = SCENARIOS[scenario]
    order = ENGINE.schedule(scn)
    rec = Recorder()
    ENGINE.forward(case, inputs, rec)
    decodes = [i for i in order if not scn.seqs[i].prompt]
    prompts = [i for i in order if scn.seqs[i].prompt]
    for call in rec.calls:
        if not call.case.paged:
            continue
        reqs = prompts if call.label.startswith("prefill") else decodes
        want = torch.cat([inputs.k_of(i) for i in reqs])
        assert torch.equal(call.inputs.k.float(), want.float()), call.label
        if call.case.quant != "none":
            assert call.inputs.quant.k_descale.shape == (call.case.batch, case.num_kv_heads)


def test_fp8_writes_reproduce_the_stored_tensors():
    inputs = make_inputs(FIRST["fp8_kv_cache"], 0, "cpu")
    quant = inputs.quant
    for x, stored, scale in ((inputs.q, quant.q, quant.q_descale), (inputs.k, quant.k, quant.k_descale)):
        assert torch.equal(quantize(x, scale, "fp8_e4m3").view(torch.uint8), stored.view(torch.uint8))
    assert torch.equal(quantize(inputs.v, quant.v_descale, "fp8_e4m3").view(torch.uint8), quant.v.view(torch.uint8))


# ------------------------------------------------------------------ metadata as V0's builder makes it
def _meta(scenario: str, bs: int = 16):
    scn = SCENARIOS[scenario]
    seqs = [scn.seqs[i] for i in ENGINE.schedule(scn)]
    tables, cross = ENGINE._tables(scn, seqs, bs)
    return ENGINE.build_metadata(scn, seqs, tables, cross, bs, "cpu"), tables, cross


def test_metadata_of_a_mixed_step():
    meta, tables, _ = _meta("mixed")  # scheduled: P(24, ctx 32), P(10), D(1, ctx 33), D(1, ctx 70)
    assert (meta.num_prefills, meta.num_prefill_tokens, meta.num_decode_tokens) == (2, 34, 2)
    assert meta.query_start_loc.tolist() == [0, 24, 34, 35, 36] and meta.seq_lens == [56, 10, 34, 71]
    assert meta.seq_start_loc.tolist() == [0, 56, 66, 100, 171]
    assert meta.context_lens_tensor.tolist() == [32, 0, 33, 70]
    assert (meta.max_query_len, meta.max_decode_query_len) == (24, 1)
    assert (meta.max_prefill_seq_len, meta.max_decode_seq_len) == (56, 71)
    width = max(len(t) for t in tables)
    assert meta.block_tables.tolist() == [t + [0] * (width - len(t)) for t in tables]  # chunked: prompts too
    want = []
    for t, (c, n) in zip(tables, [(32, 56), (0, 10), (33, 34), (70, 71)]):
        want += [t[p // 16] * 16 + p % 16 for p in range(c, n)]
    assert meta.slot_mapping.tolist() == want
    dec = meta.decode_part()
    assert dec.tokens == slice(34, 36) and dec.query_lens == [1, 1] and dec.seq_lens == [34, 71]


def test_metadata_block_tables_follow_prefix_hits_and_chunking():
    meta, _, _ = _meta("prefill")  # no chunked prefill, no prefix hit: the prompt's own k/v, empty rows
    assert meta.block_tables.shape == (3, 0) and meta.max_decode_query_len == 1
    assert PAD_SLOT_ID not in meta.slot_mapping.tolist() and meta.slot_mapping.numel() == 170
    meta, tables, _ = _meta("prefix_cached_prefill")  # a hit anywhere: every prompt gets its table
    assert meta.block_tables[2, : len(tables[2])].tolist() == tables[2]
    meta, _, _ = _meta("spec_decode")
    assert meta.max_decode_query_len == 4 and meta.num_prefills == 0


def test_slot_mapping_skips_a_prompts_tokens_outside_the_window():
    """V0's compute_slot_mapping_start_idx: a prompt's first query_len - sliding_window tokens get PAD_SLOT_ID."""
    meta, tables, _ = _meta("sliding_window_prefill")  # prompts 50, 9, 33 with w = 16
    slots = meta.slot_mapping.tolist()
    assert slots[:34] == [PAD_SLOT_ID] * 34 and slots[34:50] == [
        tables[0][p // 16] * 16 + p % 16 for p in range(34, 50)
    ]
    assert PAD_SLOT_ID not in slots[50:59] and slots[59:76] == [PAD_SLOT_ID] * 17


def test_cross_metadata():
    meta, _, cross = _meta("cross_decode")
    assert meta.encoder_seq_lens == [30, 47, 64] and meta.encoder_seq_start_loc.tolist() == [0, 30, 77, 141]
    assert meta.max_encoder_seq_len == 64 and meta.num_encoder_tokens == 141
    want = [t[p // 16] * 16 + p % 16 for t, e in zip(cross, [30, 47, 64]) for p in range(e)]
    assert meta.cross_slot_mapping.tolist() == want


# ------------------------------------------------------------------ validation
BAD_INPUTS = [
    ("block table too short", dict(seqs=[_p(40)], tables=[[0, 1]]), r"block_tables\[0\] is too short: 2 blocks"),
    ("one row per sequence", dict(seqs=[_p(4), _p(5)], tables=[[0]]), r"block_tables must hold one row per sequence"),
    (
        "encoder without cross cache",
        dict(seqs=[_p(3, encoder=20)], tables=[[0]]),
        r"cross_block_tables: seqs\[0\] has 20 encoder tokens but the step has no cross-attention cache",
    ),
    (
        "cross table too short",
        dict(seqs=[_p(3, encoder=20)], tables=[[0]], cross=[[1]]),
        r"cross_block_tables\[0\] is too short",
    ),
    (
        "prefill after a decode",
        dict(seqs=[_d(1, 5), _p(4)], tables=[[0], [1]], chunked=True),
        r"is_prompt: .* seqs\[0\] is a decode and seqs\[1\] a prefill",
    ),
    ("mixed without chunked prefill", dict(seqs=[_p(4), _d(1, 5)], tables=[[0], [1]]), r"chunked_prefill"),
    (
        "encoder-decoder mixing",
        dict(seqs=[_p(4, encoder=3), _d(1, 5, encoder=3)], tables=[[0], [1]], cross=[[2], [3]], chunked=True),
        r"is_prompt: V0's encoder-decoder runner",
    ),
    ("prefix hit with a window", dict(seqs=[_p(4, 16)], tables=[[0, 1]], window=8), r"sliding_window: V0 does not"),
    ("decode without context", dict(seqs=[_d(1, 0)], tables=[[0]]), r"seqs\[0\]: a decode needs cached context"),
    ("block size", dict(seqs=[_p(4)], tables=[[0]], bs=24), r"block_size must be a positive multiple of 16"),
]


@pytest.mark.parametrize("args,match", [b[1:] for b in BAD_INPUTS], ids=[b[0] for b in BAD_INPUTS])
def test_bad_batch_descriptions_name_the_field(args, match):
    with pytest.raises(ValueError, match=match):
        build_metadata(
            args["seqs"],
            args["tables"],
            block_size=args.get("bs", 16),
            chunked_prefill=args.get("chunked", False),
            sliding_window=args.get("window"),
            cross_block_tables=args.get("cross"),
        )


def test_bad_metadata_names_the_field():
    meta, _, _ = _meta("mixed")
    check_metadata(meta)
    bad_lens = [56, 11, 34, 71]  # seq 1 claims 11 tokens: query_start_loc says 10 new, context 0
    with pytest.raises(ValueError, match=r"seq_lens\[1\] = 11 disagrees with query_start_loc \(query_len 10\)"):
        check_metadata(meta.replace(seq_lens=bad_lens, seq_lens_tensor=torch.tensor(bad_lens)))
    with pytest.raises(ValueError, match=r"query_start_loc ends at 37"):
        check_metadata(meta.replace(query_start_loc=torch.tensor([0, 24, 34, 35, 37])))
    with pytest.raises(ValueError, match=r"block_tables has 2 columns of 16 slots, too short for row 3"):
        check_metadata(meta.replace(block_tables=meta.block_tables[:, :2]))
    with pytest.raises(ValueError, match=r"max_decode_query_len must be 1"):
        check_metadata(meta.replace(max_decode_query_len=2))
    with pytest.raises(ValueError, match=r"slot_mapping must hold one slot per query token \(36\)"):
        check_metadata(meta.replace(slot_mapping=meta.slot_mapping[:-1]))
    cross, _, _ = _meta("cross_decode")
    with pytest.raises(ValueError, match=r"cross_block_tables: encoder tokens without a cross-attention cache"):
        check_metadata(cross.replace(cross_block_tables=None))


def test_a_case_that_does_not_describe_its_scenario_is_refused():
    case = FIRST["sliding_window_decode"]
    with pytest.raises(ValueError, match=r"window must be \(15, 0\)"):
        ENGINE.plan(case.replace(window=(16, 0)))
    with pytest.raises(ValueError, match=r"requests must be"):
        ENGINE.plan(case.replace(requests=((1, 62), (1, 11), (1, 34))))
    with pytest.raises(ValueError, match=r"paged must be True"):
        ENGINE.plan(case.replace(kv_layout="contiguous", block_size=None))
    with pytest.raises(ValueError, match=r"head_dim must be one of"):
        ENGINE.plan(case.replace(head_dim=80))
    with pytest.raises(ValueError, match=r"scenario must be one of"):
        ENGINE.plan(case.replace(scenario="nope"))


def test_a_refused_call_makes_the_replay_unsupported_with_its_label():
    res = check_backend(_ctx(FIRST["decode"]), get_backend("fa2"))
    assert res.status is Status.UNSUPPORTED and "runs on cuda" in res.reason


# ------------------------------------------------------------------ planted engine bugs
class _EncoderWindowAsDecoder(VllmV0FlashAttention):
    """Planted: an encoder-only layer given the decoder's (w - 1, 0), as the seed's __init__ literally spells it."""

    def fa_window(self, scn):
        return (-1, -1) if scn.sliding_window is None else (scn.sliding_window - 1, 0)


class _WindowNotMinusOne(VllmV0FlashAttention):
    """Planted: the model's sliding_window passed as is (one key too many on the left)."""

    def fa_window(self, scn):
        w = scn.sliding_window
        return (-1, -1) if w is None else ((w, w) if scn.attn_type == ENCODER_ONLY else (w, 0))


def _pick(idx, *lists):
    return [None if xs is None else [xs[i] for i in idx] for xs in lists]


class _DecodesBeforePrefills(VllmV0FlashAttention):
    """Planted: the metadata lists decodes before prefills (V1's order) while the tokens are V0's, prefills first."""

    def build_metadata(self, scn, seqs, tables, cross, bs, dev):
        idx = sorted(range(len(seqs)), key=lambda i: seqs[i].prompt)
        return super().build_metadata(scn, *_pick(idx, seqs, tables, cross), bs, dev)


class _DecodesReversed(VllmV0FlashAttention):
    """Planted: the decodes enter the metadata in reverse order; the tokens stay in the scheduler's order."""

    def build_metadata(self, scn, seqs, tables, cross, bs, dev):
        n = sum(s.prompt for s in seqs)
        idx = list(range(n)) + list(range(len(seqs) - 1, n - 1, -1))
        return super().build_metadata(scn, *_pick(idx, seqs, tables, cross), bs, dev)


class _DescaleDropped(VllmV0FlashAttention):
    """Planted: fp8 descales not passed (the kernel's default 1.0)."""

    def descale(self, scale, num_seqs, num_kv_heads):
        return torch.ones(num_seqs, num_kv_heads)


class _CrossReadsSelfCache(VllmV0FlashAttention):
    """Planted: the cross-attention decode gets the decoder's seq lens and self-attention block tables."""

    def seq_len_block_table_args(self, meta, attn_type):
        return super().seq_len_block_table_args(meta, DECODER)


PLANTED = [
    (_EncoderWindowAsDecoder, "encoder_only_window"),
    (_WindowNotMinusOne, "sliding_window_prefill"),
    (_WindowNotMinusOne, "sliding_window_decode"),
    (_WindowNotMinusOne, "sliding_window_spec"),
    (_WindowNotMinusOne, "encoder_only_window"),
    (_DecodesReversed, "decode"),
    (_DecodesReversed, "spec_decode"),
    (_DecodesReversed, "mixed"),
    (_DecodesReversed, "cross_decode"),
    (_DescaleDropped, "fp8_prefill"),
    (_DescaleDropped, "fp8_kv_cache"),
    (_DescaleDropped, "fp8_spec_decode"),
    (_CrossReadsSelfCache, "cross_decode"),
]


def _check_with(bug, case, monkeypatch):
    return engine_verdict(_ctx(case), bug(), monkeypatch)


@pytest.mark.parametrize("bug,scenario", PLANTED, ids=[f"{b.__name__}-{s}" for b, s in PLANTED])
def test_planted_bugs_fail(bug, scenario, monkeypatch):
    case = FIRST[scenario]
    assert check_backend(_ctx(case), get_backend("sdpa-cpu")).status is Status.PASS  # the bug-free engine
    res = _check_with(bug, case, monkeypatch)
    assert res.status is Status.FAIL, res.reason
    assert res.stats.error_ratio > 10, res.reason


@pytest.mark.parametrize("scenario", ["mixed", "mixed_spec", "alibi", "fp8_kv_cache"])
def test_decodes_before_prefills_in_the_metadata_is_an_error_naming_is_prompt(scenario, monkeypatch):
    res = _check_with(_DecodesBeforePrefills, FIRST[scenario], monkeypatch)
    assert res.status is Status.ERROR and "is_prompt: V0's builder reads the first num_prefills" in res.reason


def test_the_cross_bug_reads_stale_self_attention_blocks():
    calls = _record(FIRST["cross_decode"], _CrossReadsSelfCache())
    assert calls[0].case.requests == ((1, 6), (1, 10), (1, 3))  # decoder seq lens, not the encoder's 30/47/64
    assert bool((calls[0].inputs.k.float() == 100.0).all())  # every slot it reads is stale
