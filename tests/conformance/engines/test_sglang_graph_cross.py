"""Seed 003's CUDA-graph path for encoder-decoder models (``conformance.engines.sglang.graph_cross``).

* the cross-attention layer's decode and the self-attention layer of the same step are ``engines``-suite graph
  scenarios and pass on ``flex-cpu`` here, ``sdpa-cpu`` in ``test_sglang_graph.py`` (eager "replays" on the
  buffers): capture at a bucket of 3, replays of 3, 2 and 1 requests with other encoder and decoder lengths;
* the metadata as the seed writes it: the capture's views of ``encoder_metadata``, the replay's
  ``encoder_lens[:1]`` broadcast, the cumsum, the encoder table from ``req_to_token[:, :encoder_len]`` (columns past
  it stale), the decoder table shifted past the encoder's tokens;
* planted bugs fail: encoder-table columns refreshed only up to the previous batch's encoder length, the decoder
  table left unshifted;
* the finding: a batch of requests with different encoder lengths, replayed exactly as the seed does, fails both
  layers (every row reads request 0's encoder length); writing each row's own length passes;
* bad input raises ``ValueError`` naming the field.
"""

from __future__ import annotations

import pytest
import torch

from conformance.engines.sglang import GRAPH_FINDINGS, GRAPH_SCENARIOS, RunnerBuffers, SGLangFlashAttention
from conformance.engines.sglang.graph_cases import graph_case
from conformance.engines.sglang.graph_cross import ENCODER_LEN_FILL, EncoderDecoderGraphState, allocate_encoder_lens
from conformance.records import Status
from conformance.verdict.check import prepare_context
from tests.conformance.engines.recorder import engine_verdict

ENGINE = SGLangFlashAttention()
CROSS = ("graph_cross_decode", "graph_cross_self_decode")
MIXED = ("graph_cross_decode_mixed_encoder", "graph_cross_self_decode_mixed_encoder")
_CONTEXTS: dict[str, object] = {}


def _ctx(name: str):
    if name not in _CONTEXTS:
        sc = GRAPH_SCENARIOS.get(name) or GRAPH_FINDINGS[name]
        _CONTEXTS[name] = prepare_context(graph_case("sglang_fa", name, sc), 0, "cpu")
    ctx = _CONTEXTS[name]
    ctx.ref_charged = False
    return ctx


def _engine(cls) -> SGLangFlashAttention:
    eng = SGLangFlashAttention()
    eng.graph_state = cls
    return eng


# ------------------------------------------------------------------ scenarios
def test_cross_scenarios_are_suite_cases_and_findings_are_not():
    from conformance.suites.registry import get_suite

    suite = {c.scenario: c for c in get_suite("engines") if c.engine == "sglang_fa" and c.graph}
    assert set(CROSS) <= set(suite) and not set(MIXED) & set(suite)
    cross, self_ = suite["graph_cross_decode"], suite["graph_cross_self_decode"]
    assert not cross.causal and self_.causal and cross.graph == self_.graph == (3, 2, 1)
    assert list(cross.kv_lens) == [23, 23, 23, 64, 64, 40] and list(self_.kv_lens) == [70, 9, 30, 5, 50, 17]


@pytest.mark.parametrize("name", CROSS)
def test_cross_scenarios_pass(name, monkeypatch):
    """On flex-cpu (sdpa-cpu: ``test_sglang_graph.test_graph_scenarios_pass_on_cpu``, over every graph scenario)."""
    res = engine_verdict(_ctx(name), ENGINE, monkeypatch, "flex-cpu")
    assert res.status is Status.PASS, res.reason
    replays = res.extra["graph"]["replays"]
    assert [r["requests"] for r in replays] == [3, 2, 1]
    assert all(r["vs_eager"]["equal"] and r["vs_plain"]["equal"] for r in replays)
    label = "cross attention (encoder page table" if name == "graph_cross_decode" else "decode (graph page table)"
    assert any(label in n for n in res.extra["notes"])


# ------------------------------------------------------------------ the metadata as the seed writes it
def _state(name: str, bs: int):
    state = EncoderDecoderGraphState(GRAPH_SCENARIOS[name])
    state.init_cuda_graph_state(bs)
    runner = RunnerBuffers.allocate(bs, 0, "cpu")
    allocate_encoder_lens(runner)
    md, _ = state.capture(bs, runner.seq_lens, runner.encoder_lens)
    return state, runner, md


def test_capture_views_and_replay_writes():
    state, runner, md = _state("graph_cross_decode", 3)
    buf = state.encoder_metadata
    assert buf["encoder_page_table"].shape == (3, 512) and buf["encoder_cu_seqlens_k"].shape == (4,)
    assert md.encoder_page_table.data_ptr() == buf["encoder_page_table"].data_ptr()
    assert md.encoder_lens_int32.shape == (3,) and runner.encoder_lens.tolist() == [ENCODER_LEN_FILL] * 3
    r2t = torch.arange(5 * 512, dtype=torch.int32).view(5, 512)
    runner.prepare([4, 1, 3], [70, 9, 30], None, [64, 64, 64])
    state.replay(3, r2t, runner)
    assert md.encoder_lens_int32.tolist() == [64] * 3 and md.encoder_cu_seqlens_k.tolist() == [0, 64, 128, 192]
    assert torch.equal(md.encoder_page_table[:, :64], r2t[[4, 1, 3], :64])
    assert torch.equal(md.page_table[:, :70], r2t[[4, 1, 3], 64:134])  # decoder tokens after the encoder's
    enc_before, dec_before = md.encoder_page_table.clone(), md.page_table.clone()
    runner.prepare([0], [17], None, [23])  # padded rows: seq_lens 1, pool indices and encoder lens as left
    state.replay(3, r2t, runner)
    assert runner.encoder_lens.tolist() == [23, 64, 64]
    assert md.encoder_lens_int32.tolist() == [23] * 3 and md.encoder_cu_seqlens_k.tolist() == [0, 23, 46, 69]
    assert torch.equal(md.encoder_page_table[:, :23], r2t[[0, 1, 3], :23])
    assert torch.equal(md.encoder_page_table[:, 23:], enc_before[:, 23:])  # columns past encoder_lens[0]: stale
    assert torch.equal(md.page_table[:, :17], r2t[[0, 1, 3], 23:40])
    assert torch.equal(md.page_table[:, 17:], dec_before[:, 17:])


def test_bad_input_names_the_field():
    state, runner, _ = _state("graph_cross_decode", 2)
    runner.prepare([0], [500], None, [40])
    with pytest.raises(ValueError, match=r"encoder_lens: encoder 40 \+ decoder 500 tokens exceed req_to_token's 512"):
        state.replay(2, torch.zeros(1, 512, dtype=torch.int32), runner)
    case = _ctx("graph_cross_decode").case
    with pytest.raises(ValueError, match=r"requests must be .* encoder and decoder lengths are the scenario's"):
        ENGINE.check(case.replace(requests=((1, 30),) * 6))
    with pytest.raises(ValueError, match=r"causal must be False for scenario 'graph_cross_decode'"):
        ENGINE.check(case.replace(causal=True))


# ------------------------------------------------------------------ planted bugs
class StaleEncoderColumns(EncoderDecoderGraphState):
    """``encoder_page_table`` refreshed only up to the previous batch's encoder length (the rest stale)."""

    previous = 0

    def replay_encoder(self, md, req_to_token, req_pool_indices, encoder_lens, bs):
        before = md.encoder_page_table.clone()
        super().replay_encoder(md, req_to_token, req_pool_indices, encoder_lens, bs)
        enc, prev = int(encoder_lens[0]), self.previous
        if enc > prev:
            md.encoder_page_table[:, prev:enc].copy_(before[:, prev:enc])
        self.previous = enc


class UnshiftedDecoderTable(EncoderDecoderGraphState):
    """The decoder's ``page_table`` left as ``normal_decode_set_metadata`` wrote it (not shifted past the encoder)."""

    def replay_encoder(self, md, req_to_token, req_pool_indices, encoder_lens, bs):
        before = md.page_table.clone()
        super().replay_encoder(md, req_to_token, req_pool_indices, encoder_lens, bs)
        md.page_table.copy_(before)


@pytest.mark.parametrize(
    "cls, name",
    [(StaleEncoderColumns, "graph_cross_decode"), (UnshiftedDecoderTable, "graph_cross_self_decode")],
    ids=["stale-encoder-columns", "unshifted-decoder-table"],
)
def test_planted_bugs_fail(cls, name, monkeypatch):
    res = engine_verdict(_ctx(name), _engine(cls), monkeypatch)
    assert res.status is Status.FAIL, res.reason


# ------------------------------------------------------------------ the finding: encoder size 1
class PerRequestEncoder(EncoderDecoderGraphState):
    """What the seed's replay would need for a batch of encoder lengths: each row its own length and shift."""

    def replay_encoder(self, md, req_to_token, req_pool_indices, encoder_lens, bs):
        super().replay_encoder(md, req_to_token, req_pool_indices, encoder_lens, bs)
        md.encoder_lens_int32.copy_(encoder_lens)
        md.encoder_cu_seqlens_k[1:].copy_(torch.cumsum(encoder_lens, 0, dtype=torch.int32))
        longest, n = int(encoder_lens.max()), md.max_seq_len_k
        md.encoder_page_table[:, :longest].copy_(req_to_token[req_pool_indices, :longest])
        for r in range(bs):
            e = int(encoder_lens[r])
            md.page_table[r, :n].copy_(req_to_token[req_pool_indices[r], e : e + n])


@pytest.mark.parametrize("name", MIXED)
def test_finding_mixed_encoder_lengths_read_request_zeros(name, monkeypatch):
    """``encoder_lens[:1]`` written to every row: request 1 on reads request 0's encoder length (the cross layer
    the wrong number of encoder keys, the self layer a table shifted by the wrong count): the numbers fail."""
    seed = engine_verdict(_ctx(name), ENGINE, monkeypatch)
    assert seed.status is Status.FAIL, seed.reason
    assert seed.stats is not None and seed.stats.failed_checks
    fixed = engine_verdict(_ctx(name), _engine(PerRequestEncoder), monkeypatch)
    assert fixed.status is Status.PASS, fixed.reason
    state = EncoderDecoderGraphState(GRAPH_FINDINGS[name])
    state.init_cuda_graph_state(3)
    runner = RunnerBuffers.allocate(3, 0, "cpu")
    allocate_encoder_lens(runner)
    md, _ = state.capture(3, runner.seq_lens, runner.encoder_lens)
    runner.prepare([0, 1, 2], [70, 9, 30], None, [23, 64, 40])
    state.replay(3, torch.arange(3 * 512, dtype=torch.int32).view(3, 512), runner)
    assert md.encoder_lens_int32.tolist() == [23, 23, 23]
