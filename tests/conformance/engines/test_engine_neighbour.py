"""Engine-level ``neighbour`` invariance: request 0 through each seed's whole step beside a neighbour that grows by
one token and by one tile and turns from decode to prefill (``conformance.engines.invariance``).

The engine decides which kernel calls request 0 shares with its neighbour (vLLM's decode/prefill split, SGLang's
mixed extend call, V0's prompts-first batch), so a kernel that picks its tile from the call's longest request
breaks request 0 in some engines' steps and not in others; the ``batch`` scenarios never grow a neighbour's queries
and miss it."""

from __future__ import annotations

from typing import ClassVar

import pytest
import torch

from attnfast.base import KernelOutput
from conformance.cases.case import AttentionCase
from conformance.cases.case_json import CaseError
from conformance.suites.registry import get_suite
from conformance.engines import get_engine
from conformance.engines.base import Request
from conformance.engines.invariance import EngineInvariance, promised
from conformance.engines.sglang.scenarios import forward_mode
from conformance.graphs.invariance import variants
from conformance.records import Status
from conformance.reporting.invariance_table import invariance_sections
from conformance.verdict.check import composition_of
from tests.conformance.contexts import params, verdict
from tests.conformance.fakes import ExactBackend

ENGINES = ("vllm_v1_fa", "sglang_fa", "vllm_v0_fa", "vllm_diff")
SUITE = [c for c in get_suite("engines") if c.engine in ENGINES and c.invariance]
NEIGHBOUR = [c for c in SUITE if c.invariance == "neighbour"]
OLD = [c for c in SUITE if c.invariance != "neighbour"]
#: neighbour cases per engine: (head dim, target) x configuration (vLLM V1's batch-invariant mode, SGLang's
#: deterministic inference); V0 at its two neighbour layers; vllm_diff's chunk target only (V0 lists prompts first)
COUNTS = {"vllm_v1_fa": 8, "sglang_fa": 8, "vllm_v0_fa": 4, "vllm_diff": 2}
#: the variants' labels after the first ("beside a neighbour of 129 queries"), in order
CUT_LABELS = ["alone", "beside a neighbour of 1 query"] + [
    f"beside a neighbour of {n} queries" for n in (9, 10, 64, 65, 128)
]


def _nb(engine: str, *parts: str) -> list[AttentionCase]:
    return [c for c in NEIGHBOUR if c.engine == engine and all(p in c.scenario for p in parts)]


def _other_side(out: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The fp32 output cast to ``dtype``, each head's first element of every row rounded to its other neighbouring
    value (another accumulation order's last bit: within one ulp, few enough elements that the numbers still pass,
    vllm_diff's subtraction of two attentions included; an exactly representable value stays)."""
    y = out.to(dtype)
    first, x = y[..., :1], out[..., :1]
    down = torch.nextafter(first, torch.full_like(first, -float("inf")))
    up = torch.nextafter(first, torch.full_like(first, float("inf")))
    y[..., :1] = torch.where(first.float() > x, down, torch.where(first.float() < x, up, first))
    return y


class TileByLongestQuery(ExactBackend):
    """Planted (vLLM #51902's class): the kernel picks its tile from the call's longest request; from 10 query tokens
    on every row is accumulated in another order (its last bits differ).  Takes ``num_splits``, so a pinned case
    promises."""

    name: ClassVar[str] = "fake-tile-by-longest-query"

    def other_tile(self, case: AttentionCase) -> bool:
        return max(case.q_lens) >= 10

    def finish(self, case, out, lse):
        if not self.other_tile(case):
            return super().finish(case, out, lse)
        return KernelOutput(_other_side(out, case.torch_dtype), lse.float())


class SplitsByTotalQueries(TileByLongestQuery):
    """Planted (the brief's example): a split count read from the call's total query tokens, another from 10 on."""

    name: ClassVar[str] = "fake-splits-by-total-queries"

    def other_tile(self, case: AttentionCase) -> bool:
        return case.total_q >= 10


class PrefillSplitsOnly(TileByLongestQuery):
    """The same bug on a kernel whose split-count argument reaches only its calls with more than one query row."""

    name: ClassVar[str] = "fake-prefill-splits-only"

    def pins_splits(self, case):
        return max(case.q_lens) > 1 and super().pins_splits(case)


# ------------------------------------------------------------------------------------------------ the scenarios
def test_each_engine_replays_a_growing_neighbour_at_head_dims_64_and_128():
    assert {e: len([c for c in NEIGHBOUR if c.engine == e]) for e in ENGINES} == COUNTS
    assert len({c.id for c in NEIGHBOUR}) == len(NEIGHBOUR) == sum(COUNTS.values())
    for c in NEIGHBOUR:
        assert c.head_dim in (64, 128) and c.num_heads == 7 * c.num_kv_heads  # GQA 7 in every call
        assert c.requests[1] == (129, 1100) and c.requests[0] in ((1, 3000), (5, 3000)), c.id
        assert c.id.startswith(f"{c.engine}-{c.scenario}_") and c.id.split("_")[-1].startswith("invneighbour")
        assert isinstance(composition_of(c), EngineInvariance) and not composition_of(c).refuses(c)
        assert [v.label for v in variants(c)] == ["beside a neighbour of 129 queries", *CUT_LABELS]
    for e in ENGINES:
        assert {c.head_dim for c in NEIGHBOUR if c.engine == e} == {64, 128}, e
    pinned = {c.scenario for c in NEIGHBOUR if c.num_splits == 1}
    assert pinned == {c.scenario for c in _nb("vllm_v1_fa", "batch_invariant") + _nb("sglang_fa", "deterministic")}
    assert len(pinned) == 8


def test_the_neighbours_are_appended_after_every_earlier_case_of_their_engine():
    """New scenarios come last in each engine's cases (the earlier cases keep their ids and their order)."""
    for e in ENGINES:
        kinds = [c.invariance == "neighbour" for c in get_engine(e).cases()]
        assert kinds == sorted(kinds), e


def test_the_engines_decide_which_calls_request_0_shares_with_its_neighbour():
    """vLLM V1 and V0 split decodes from prefills (a decode target shares a call only with a 1-query neighbour);
    SGLang runs a decode beside a prefill as one MIXED extend call and a batch of decodes in DECODE mode."""
    for engine in ("vllm_v1_fa", "vllm_v0_fa"):
        case = _nb(engine, "decode")[0]
        shared = [
            v.label
            for v in variants(case)
            for _, call in get_engine(engine).plan(v.case)
            if call.batch == 2 and call.requests[0] == (1, 3000)
        ]
        assert shared == ["beside a neighbour of 1 query"], engine
    sglang = get_engine("sglang_fa")
    case = _nb("sglang_fa", "decode")[0]
    modes = [sglang.scenario(v.case).mode for v in variants(case)]
    assert modes == ["mixed", "decode", "decode"] + ["mixed"] * 5
    assert all(len(sglang.plan(v.case)) == 1 for v in variants(case))


def test_sglang_forward_mode():
    assert forward_mode((Request(1, 9), Request(1, 3))) == "decode"
    assert forward_mode((Request(1, 9), Request(4, 3))) == "mixed"
    assert forward_mode((Request(1), Request(4, 3))) == "extend"  # a one-token prompt is an extend, not a decode


def test_the_case_model_takes_neighbour_on_an_engine_case_and_still_refuses_splits():
    """Before: ``invariance 'neighbour' is kernel level`` refused every engine case."""
    case = _nb("vllm_v1_fa", "chunk")[0]
    assert case.replace(invariance="neighbour") == case
    with pytest.raises(CaseError, match=r"invariance 'splits' is kernel level.*engines: run, batch, neighbour"):
        case.replace(invariance="splits")
    with pytest.raises(CaseError, match="needs exactly 2 requests"):
        case.replace(requests=((5, 3000), (129, 1100), (1, 20)))


def test_an_engine_that_cannot_replay_a_variant_refuses_the_case_up_front():
    """vllm_diff lists prompts before decodes: a decode target beside a prompt is no batch of V0's."""
    case = _nb("vllm_diff", "d64")[0].replace(requests=((1, 3000), (129, 1100)))
    reason = EngineInvariance(get_engine("vllm_diff")).refuses(case)
    assert "prompts listed before decodes" in reason and reason.startswith("beside a neighbour of 129 queries:")


# ------------------------------------------------------------------------------------------------ verdicts
@pytest.mark.parametrize("case", [c for c in NEIGHBOUR if c.head_dim == 64], ids=lambda c: c.id)
def test_every_d64_neighbour_scenario_passes_on_the_exact_fake(case):
    r = verdict(case, ExactBackend())
    assert r.status is Status.PASS, r.reason
    inv = r.extra["invariance"]
    assert inv["kind"] == "neighbour" and inv["kept"] is True
    assert inv["promised"] is (case.num_splits == 1)
    assert [p["b"] for p in inv["pairs"]] == CUT_LABELS
    assert len(r.extra["notes"]) == 1 + len(CUT_LABELS)


def test_the_old_scenarios_miss_a_tile_picked_from_the_longest_request():
    """Every ``run`` and ``batch`` scenario of the four engines passes on the planted kernel; no promised one sees
    a break (only vllm_diff's unpromised ``inv_batch_prefill``, whose request 0 alone takes another call, reports
    one)."""
    backend = TileByLongestQuery()
    broken = []
    for case in OLD:
        r = verdict(case, backend)
        assert r.status is Status.PASS, (case.id, r.reason)
        if not r.extra["invariance"]["kept"]:
            assert r.extra["invariance"]["promised"] is False, case.id
            broken.append(case.scenario)
    assert broken == ["inv_batch_prefill"]


@pytest.mark.parametrize("case", params(_nb("vllm_v1_fa", "batch_invariant_chunk") + _nb("sglang_fa", "deterministic")))
def test_the_neighbour_scenarios_fail_it_where_the_engine_promises_batch_invariance(case):
    r = verdict(case, TileByLongestQuery())
    assert r.status is Status.FAIL
    assert "invariance neighbour: request 0 'alone' differs from 'beside a neighbour of 129 queries'" in r.reason
    inv = r.extra["invariance"]
    assert inv["promised"] is True and inv["kept"] is False
    equal = {p["b"]: p["equal"] for p in inv["pairs"]}
    # 9 -> 10: the call's longest request reaches the tile the full neighbour's call takes
    assert equal == dict.fromkeys(CUT_LABELS[:3], False) | dict.fromkeys(CUT_LABELS[3:], True)


@pytest.mark.parametrize("case", params(_nb("vllm_v1_fa", "decode") + _nb("vllm_v0_fa", "decode")))
def test_vllms_decode_prefill_split_keeps_a_decode_target_apart_from_the_growing_prefill(case):
    r = verdict(case, TileByLongestQuery())
    assert r.status is Status.PASS and r.extra["invariance"]["kept"] is True, case.id


@pytest.mark.parametrize(
    "case",
    params([c for c in NEIGHBOUR if c.num_splits is None and not (c.engine != "sglang_fa" and "decode" in c.scenario)]),
)
def test_the_default_configurations_report_it(case):
    r = verdict(case, TileByLongestQuery())
    assert r.status is Status.PASS, r.reason
    assert r.extra["invariance"]["promised"] is False and r.extra["invariance"]["kept"] is False


@pytest.mark.parametrize(
    "case", params(_nb("sglang_fa", "deterministic_decode") + _nb("vllm_v1_fa", "batch_invariant_chunk"))
)
def test_a_split_count_read_from_the_total_query_tokens_fails_too(case):
    """The brief's fake."""
    r = verdict(case, SplitsByTotalQueries())
    assert r.status is Status.FAIL and "invariance neighbour" in r.reason, case.id


def test_sglangs_deterministic_verify_already_caught_a_split_count_read_from_the_total_query_tokens():
    """Three 4-token requests: the brief's fake before the neighbour scenarios."""
    old = next(c for c in OLD if c.scenario == "inv_batch_verify_deterministic")
    assert verdict(old, SplitsByTotalQueries()).status is Status.FAIL


def test_the_promise_reads_every_variants_calls():
    """SGLang's decode target beside a prefill is one call of 130 query rows, which this kernel pins; alone (a
    DECODE step of one row) it is not pinned, so the step is not covered by the promise: reported, not failed.
    Before, the promise read the full step's calls only and this case failed."""
    case = _nb("sglang_fa", "deterministic_decode", "d64")[0]
    engine, backend = get_engine("sglang_fa"), PrefillSplitsOnly()
    assert all(backend.pins_splits(c) for _, c in engine.plan(case.replace(invariance="")))
    assert promised(engine, case, backend) is False
    assert promised(engine, case, TileByLongestQuery()) is True
    r = verdict(case, backend)
    assert r.status is Status.PASS, r.reason
    assert r.extra["invariance"]["promised"] is False and r.extra["invariance"]["kept"] is False


def test_the_report_matrix_shows_an_engines_neighbour_break_in_its_column():
    case = _nb("sglang_fa", "deterministic_decode", "d64")[0]
    backend = TileByLongestQuery()
    table = invariance_sections([verdict(case, backend)], [backend.name])
    assert table is not None
    rows = {(r["backend"], r["mode"]): r["cells"] for r in table["rows"]}
    cell = rows[(backend.name, "engine sglang_fa, num_splits = 1")][table["columns"].index("neighbour")]
    assert cell["text"] == "broken 1/1, FAIL 1"
