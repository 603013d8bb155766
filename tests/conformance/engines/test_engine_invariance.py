"""Engine-level invariances (``conformance.engines.invariance``): request 0 through each seed's whole step, alone, in
its batch, last, beside shorter requests, and run twice; promised breaks fail, the others are reported."""

from __future__ import annotations

import dataclasses
import json
from typing import ClassVar

import pytest
import torch

from attnfast.base import KernelOutput, Support
from attnfast.registry import get_backend
from conformance.cases.case import AttentionCase
from conformance.suites.registry import get_suite
from conformance.engines import get_engine
from conformance.engines.invariance import EngineInvariance, promised
from conformance.records import Status
from conformance.reporting.invariance_table import invariance_sections
from conformance.verdict.check import composition_of, prepare_context
from tests.conformance.contexts import params, verdict
from tests.conformance.fakes import ExactBackend

#: the four seeds with a CUDA-graph path, and their scenarios whose batch break is a promise broken.
ENGINES = ("vllm_v1_fa", "sglang_fa", "vllm_v0_fa", "vllm_diff")
PROMISED = {
    "vllm_v1_fa": {"inv_batch_invariant_decode", "inv_batch_invariant_mixed"},
    "sglang_fa": {"inv_batch_decode_deterministic", "inv_batch_extend_deterministic", "inv_batch_verify_deterministic"},
    "vllm_v0_fa": set(),
    "vllm_diff": set(),
}
CASES = [c for name in ENGINES for c in get_engine(name).cases() if c.invariance]
#: one case per (engine, kind, batch-invariant configuration) for the pass test (the CPU run covers them all), a
#: neighbour kind's at each head dim (the d128 one is slow: :func:`tests.conformance.contexts.params`)
SAMPLE = list(
    {(c.engine, c.invariance, c.num_splits, c.invariance == "neighbour" and c.head_dim): c for c in CASES}.values()
)


def _case(engine: str, scenario: str) -> AttentionCase:
    return next(c for c in CASES if c.engine == engine and c.scenario == scenario)


def _ulp_up(res: KernelOutput) -> KernelOutput:
    """The call's first output element one ulp up (another accumulation order, small enough for the numbers)."""
    out = res.out.clone()
    out[0, 0, 0] = torch.nextafter(out[0, 0, 0], torch.tensor(float("inf"), dtype=out.dtype))
    return KernelOutput(out, res.lse)


class BatchDependent(ExactBackend):
    """Planted: a request's output depends on the batch around it (one ulp up in the first row of any call of
    more than one request, as a split heuristic that reads the batch size gives)."""

    name: ClassVar[str] = "fake-batch-dependent"

    def prepare(self, case, inputs):
        run = super().prepare(case, inputs)
        return (lambda: _ulp_up(run())) if case.batch > 1 else run


class AutotunedNonDeterministic(ExactBackend):
    """Planted: a kernel that changes its configuration once it has seen a call (an autotuner's cache: the first
    run of every call takes one merge order, every later run another, one ulp apart)."""

    name: ClassVar[str] = "fake-autotuned"

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def prepare(self, case, inputs):
        run, key = super().prepare(case, inputs), json.dumps(case.to_json(), sort_keys=True)

        def call() -> KernelOutput:
            again = key in self.seen
            self.seen.add(key)
            return _ulp_up(run()) if again else run()

        return call


class BatchDependentNoSplits(BatchDependent):
    """The same, on a kernel without a split-count argument (it supports every split count the case names, as SDPA
    does, by ignoring it): nothing is pinned, so nothing is promised."""

    name: ClassVar[str] = "fake-batch-dependent-no-splits"
    batch_invariance_via: ClassVar[str | None] = None


class BatchDependentSplitsInDecodeOnly(BatchDependent):
    """The same, on a kernel whose prefill path never splits: it takes ``num_splits = 1`` there (nothing to split)
    but no other split count, so only its decode calls have a split count to pin."""

    name: ClassVar[str] = "fake-batch-dependent-decode-splits"

    def pins_splits(self, case):  # as FA2: only its decode entry takes num_splits
        return max(case.q_lens) <= 1 and super().pins_splits(case)


class WrongAlone(ExactBackend):
    """Planted: a request computed alone is wrong (keys scaled), bitwise far from any batch: caught numerically."""

    name: ClassVar[str] = "fake-wrong-alone"

    def prepare(self, case, inputs):
        run = super().prepare(case, inputs)
        if case.batch > 1:
            return run
        return lambda: KernelOutput(run().out * 1.5, run().lse)


# ------------------------------------------------------------------------------------------------ the scenarios
def test_every_seed_with_a_graph_path_has_run_batch_and_neighbour_scenarios_in_the_engines_suite():
    suite = {c.id for c in get_suite("engines") if c.invariance}
    assert suite == {c.id for c in CASES} and len(suite) == len(CASES)
    for name in ENGINES:
        kinds = {c.invariance for c in CASES if c.engine == name}
        assert kinds == {"run", "batch", "neighbour"}, name
        pinned = {c.scenario for c in CASES if c.engine == name and c.invariance == "batch" and c.num_splits == 1}
        assert pinned == PROMISED[name], name
    for case in CASES:
        assert AttentionCase.from_json(json.loads(json.dumps(case.to_json()))) == case
        assert case.id.startswith(f"{case.engine}-{case.scenario}_") and "inv" in case.id
        assert isinstance(composition_of(case), EngineInvariance)
        assert composition_of(case).seed == get_engine(case.engine).seed


def test_splits_stays_kernel_level():
    case = _case("vllm_v1_fa", "inv_batch_decode")
    with pytest.raises(ValueError, match="invariance 'splits' is kernel level"):
        case.replace(invariance="splits")
    with pytest.raises(ValueError, match="cannot be combined with graph"):
        AttentionCase(
            ((1, 20), (1, 9)),
            graph=(2,),
            invariance="run",
            num_heads=4,
            num_kv_heads=2,
            head_dim=16,
            kv_layout="NHD",
            block_size=16,
            causal=True,
        )


@pytest.mark.parametrize("case", params(SAMPLE))
def test_every_invariance_scenario_passes_and_keeps_its_invariance_on_sdpa_cpu(case):
    r = verdict(case, get_backend("sdpa-cpu"))
    assert r.status is Status.PASS, r.reason
    inv = r.extra["invariance"]
    assert inv["kind"] == case.invariance and inv["kept"] is True
    # SDPA takes no split count (batch_invariance_via None): even the batch-invariant scenarios promise run only
    assert inv["promised"] is (case.invariance == "run")
    cuts = [f"beside a neighbour of {n} queries" for n in (9, 10, 64, 65, 128)]
    labels = {
        "run": ["second run"],
        "batch": ["alone", "in batch (last)", "beside shorter requests"],
        "neighbour": ["alone", "beside a neighbour of 1 query", *cuts],
    }
    assert [p["b"] for p in inv["pairs"]] == labels[case.invariance]
    assert r.extra["engine"]["engine"] == case.engine and r.extra["engine"]["scenario"] == case.scenario
    assert len(r.extra["notes"]) == 1 + len(labels[case.invariance])  # one line per variant's step


# ------------------------------------------------------------------------------------------------ planted bugs
@pytest.mark.parametrize(
    "engine,scenario",
    [("vllm_v1_fa", "inv_batch_invariant_decode"), ("sglang_fa", "inv_batch_decode_deterministic")],
)
def test_a_batch_dependent_kernel_fails_a_promised_scenario(engine, scenario):
    r = verdict(_case(engine, scenario), BatchDependent())
    assert r.status is Status.FAIL
    assert "invariance batch: request 0 'alone' differs from 'in batch (first)'" in r.reason
    assert r.extra["invariance"]["promised"] is True and r.extra["invariance"]["kept"] is False


@pytest.mark.parametrize(
    "engine,scenario",
    [
        ("vllm_v1_fa", "inv_batch_decode"),
        ("sglang_fa", "inv_batch_decode"),
        ("vllm_v0_fa", "inv_batch_decode"),
        ("vllm_diff", "inv_batch_decode"),
    ],
)
def test_a_batch_dependent_kernel_is_reported_in_a_default_configuration(engine, scenario):
    r = verdict(_case(engine, scenario), BatchDependent())
    assert r.status is Status.PASS, r.reason
    inv = r.extra["invariance"]
    assert inv["promised"] is False and inv["kept"] is False
    assert not next(p for p in inv["pairs"] if p["b"] == "alone")["equal"]


def test_nothing_is_promised_on_a_kernel_without_a_split_count():
    r = verdict(_case("vllm_v1_fa", "inv_batch_invariant_decode"), BatchDependentNoSplits())
    assert r.status is Status.PASS, r.reason  # a break, reported: the mode cannot pin what the kernel lacks
    assert r.extra["invariance"]["promised"] is False and r.extra["invariance"]["kept"] is False


def test_batch_invariance_is_promised_only_when_every_call_of_the_step_pins_its_splits():
    """vLLM V1's mixed step makes a prefill call and a decode call: with a split count to pin in the decode call
    only, the batch-invariant mode does not cover the whole step, so a break is reported, not failed."""
    case = _case("vllm_v1_fa", "inv_batch_invariant_mixed")
    engine, backend = get_engine("vllm_v1_fa"), BatchDependentSplitsInDecodeOnly()
    labels = [label for label, _ in engine.plan(case.replace(invariance=""))]
    calls = engine.plan(case.replace(invariance="", num_splits=1))
    assert [backend.pins_splits(c) for _, c in calls] == [False, True]
    assert labels == ["prefill (varlen, paged)", "decode (paged kvcache)"]
    assert promised(engine, case, backend) is False
    assert promised(engine, case, BatchDependent()) is True  # every call pins it
    r = verdict(case, backend)
    assert r.status is Status.PASS, r.reason
    assert r.extra["invariance"]["promised"] is False and r.extra["invariance"]["kept"] is False


def test_batch_invariance_is_not_promised_for_a_step_without_calls():
    """An engine step that plans no kernel call pins nothing (``all`` of nothing is no promise)."""

    class NoCalls:
        def plan(self, case):
            return []

    case = _case("vllm_v1_fa", "inv_batch_invariant_decode")
    assert promised(NoCalls(), case, ExactBackend()) is False  # type: ignore[arg-type]
    assert promised(NoCalls(), case.replace(invariance="run"), ExactBackend()) is True  # type: ignore[arg-type]


def test_a_nondeterministic_kernel_fails_the_run_scenarios():
    for engine, scenario in (("vllm_v1_fa", "inv_run_mixed"), ("sglang_fa", "inv_run_decode")):
        r = verdict(_case(engine, scenario), AutotunedNonDeterministic())
        assert r.status is Status.FAIL, (engine, r.reason)
        assert "invariance run: request 0 'second run' differs from 'first run'" in r.reason


def test_every_variant_is_judged_numerically():
    r = verdict(_case("vllm_v0_fa", "inv_batch_decode"), WrongAlone())
    assert r.status is Status.FAIL and "invariance" not in r.reason  # the numbers, not a promise


# ------------------------------------------------------------------------------------------------ the contract
class RefusesAlone(ExactBackend):
    """Takes every call of a batch of several requests, refuses a call of one request."""

    name: ClassVar[str] = "fake-refuses-alone"

    def supports(self, case, device):
        return Support(False, "planted: no batch of one") if case.batch == 1 else super().supports(case, device)


def test_an_engine_invariance_is_supported_only_when_every_variant_is_and_names_the_refused_one():
    case = _case("vllm_v1_fa", "inv_batch_decode")
    composition = EngineInvariance(get_engine("vllm_v1_fa"))
    assert composition.supports(case, ExactBackend(), "cpu") == Support(True)
    assert composition.supports(case, RefusesAlone(), "cpu") == Support(
        False, "alone: decode (paged kvcache): planted: no batch of one"
    )


@pytest.mark.parametrize("kind", ["", "splits"])
def test_an_engine_invariance_refuses_a_kind_it_cannot_replay(kind):
    """Only ``run``, ``batch`` and ``neighbour`` (the engine sets its own split count); the refusal names the kinds
    and the value."""
    case = _case("vllm_v1_fa", "inv_run_mixed")
    object.__setattr__(case := case.replace(invariance=""), "invariance", kind)  # past the case's own check
    composition = EngineInvariance(get_engine("vllm_v1_fa"))
    message = (
        rf"invariance must be one of \['run', 'batch', 'neighbour'\] for an engine case \(the engine sets its own "
        rf"split count\), got '{kind}'"
    )
    for call in (
        lambda: composition.supports(case, ExactBackend(), "cpu"),
        lambda: composition.prepare(case, None, ExactBackend(), "cpu"),
        lambda: composition.reference(case, None),
    ):
        with pytest.raises(ValueError, match=message):
            call()


def test_a_case_without_an_invariance_promises_nothing_even_with_num_splits_1():
    case = _case("vllm_v1_fa", "inv_batch_invariant_decode")
    assert case.num_splits == 1
    assert promised(get_engine("vllm_v1_fa"), case.replace(invariance=""), ExactBackend()) is False


class Reporting:
    """An engine whose step reports each kernel call in ``notes`` and a problem of its own (a graph replay's)."""

    def __init__(self, engine):
        self.engine = engine

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def prepare(self, case, inputs, backend, device):
        run = self.engine.prepare(case, inputs, backend, device)

        def step():
            out = run()
            step.notes = ["call A", "call B"]
            return out

        step.problems = [f"planted problem of a batch of {case.batch}"]
        return step


def test_each_variant_notes_its_calls_and_passes_on_the_problems_of_its_step():
    case = _case("vllm_v1_fa", "inv_run_mixed")
    ctx = prepare_context(case, 0, "cpu")
    run = EngineInvariance(Reporting(get_engine("vllm_v1_fa"))).prepare(case, ctx.inputs, ExactBackend(), "cpu")
    run()
    call = case.replace(invariance="")
    assert run.notes == [
        f"first run: {call.summary()}: 2 call(s); call A; call B",
        f"second run: {call.summary()}: 2 call(s); call A; call B",
    ]
    assert run.problems == [
        f"first run: planted problem of a batch of {case.batch}",
        f"second run: planted problem of a batch of {case.batch}",
    ]


def test_a_step_without_notes_or_problems_notes_no_call():
    class Silent(Reporting):
        def prepare(self, case, inputs, backend, device):
            run = self.engine.prepare(case, inputs, backend, device)
            return lambda: run()

    case = _case("vllm_v1_fa", "inv_run_mixed")
    ctx = prepare_context(case, 0, "cpu")
    run = EngineInvariance(Silent(get_engine("vllm_v1_fa"))).prepare(case, ctx.inputs, ExactBackend(), "cpu")
    run()
    assert run.notes == [
        f"{label}: {case.replace(invariance='').summary()}: 0 call(s)" for label in ("first run", "second run")
    ]
    assert run.problems == []


# ------------------------------------------------------------------------------------------------ the report
def test_the_report_matrix_has_a_row_per_engine_configuration():
    records = [
        verdict(_case("vllm_v1_fa", "inv_batch_invariant_decode"), BatchDependent()),
        verdict(_case("vllm_v0_fa", "inv_batch_decode"), BatchDependent()),
        verdict(_case("sglang_fa", "inv_run_decode"), ExactBackend()),
    ]
    table = invariance_sections(records, ["fake-batch-dependent", "fake-exact"])
    assert table is not None
    rows = {(r["backend"], r["mode"]): r["cells"] for r in table["rows"]}
    batch, run = table["columns"].index("batch"), table["columns"].index("run")
    assert rows[("fake-batch-dependent", "engine vllm_v1_fa, num_splits = 1")][batch]["text"] == "broken 1/1, FAIL 1"
    assert rows[("fake-batch-dependent", "engine vllm_v0_fa")][batch]["text"] == "broken 1/1"
    assert rows[("fake-exact", "engine sglang_fa")][run]["text"] == "kept 1/1"
    assert any("'alone' vs 'in batch (first)'" in n for n in table["notes"])


def test_neighbour_invariance_is_promised_like_batch_when_every_call_pins_its_splits():
    """``neighbour`` promises what ``batch`` does: with ``num_splits = 1`` and a kernel that pins it in every call
    of every variant's step; without the split count pinned, nothing."""
    case = _case("vllm_v1_fa", "inv_neighbour_batch_invariant_decode_d64")
    engine = get_engine("vllm_v1_fa")
    assert case.num_splits == 1 and promised(engine, case, BatchDependent()) is True
    assert promised(engine, case, BatchDependentNoSplits()) is False
    assert promised(engine, case.replace(num_splits=None), BatchDependent()) is False


@pytest.mark.parametrize("kind", ["", "splits"])
def test_an_engine_invariance_declares_the_kinds_it_cannot_replay(kind):
    """:meth:`EngineInvariance.refuses` names the kinds it replays and the value, as a declared refusal."""
    case = _case("vllm_v1_fa", "inv_run_mixed")
    object.__setattr__(case := case.replace(invariance=""), "invariance", kind)  # past the case's own check
    assert EngineInvariance(get_engine("vllm_v1_fa")).refuses(case) == (
        "invariance must be one of ['run', 'batch', 'neighbour'] for an engine case (the engine sets its own split "
        f"count), got {kind!r}"
    )


def test_an_engine_invariance_declares_inputs_it_cannot_cut_per_request():
    """Quantized inputs are not cut per request by the batches' assembly: a declared refusal, not an error."""
    case = dataclasses.replace(_case("vllm_v1_fa", "inv_batch_decode"))  # a copy: CASES is shared
    object.__setattr__(case, "quant", "fp8")  # past the case's own check: the refusal must not lean on it
    assert EngineInvariance(get_engine("vllm_v1_fa")).refuses(case) == (
        "invariance: its batches are assembled from q, k, v only; quantized inputs (quant) are not cut per request"
    )
