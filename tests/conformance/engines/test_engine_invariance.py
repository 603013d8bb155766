"""Engine-level invariances (``conformance.engines.invariance``): request 0 through each seed's whole step, alone, in
its batch, last, beside shorter requests, and run twice; promised breaks fail, the others are reported."""

from __future__ import annotations

import json
from typing import ClassVar

import pytest
import torch

from attnfast.base import KernelOutput
from attnfast.registry import get_backend
from conformance.cases.case import AttentionCase
from conformance.cases.suites import get_suite
from conformance.engines import get_engine
from conformance.engines.invariance import EngineInvariance
from conformance.records import Status
from conformance.reporting.invariance_table import invariance_sections
from conformance.verdict.check import check_backend, composition_of, prepare_context
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
#: one case per (engine, kind, batch-invariant configuration) for the pass test (the CPU run covers them all)
SAMPLE = list({(c.engine, c.invariance, c.num_splits): c for c in CASES}.values())
_CONTEXTS: dict[str, object] = {}


def _case(engine: str, scenario: str) -> AttentionCase:
    return next(c for c in CASES if c.engine == engine and c.scenario == scenario)


def _verdict(case: AttentionCase, backend):
    if case.id not in _CONTEXTS:
        _CONTEXTS[case.id] = prepare_context(case, 0, "cpu")
    return check_backend(_CONTEXTS[case.id], backend)  # type: ignore[arg-type]


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


class WrongAlone(ExactBackend):
    """Planted: a request computed alone is wrong (keys scaled), bitwise far from any batch: caught numerically."""

    name: ClassVar[str] = "fake-wrong-alone"

    def prepare(self, case, inputs):
        run = super().prepare(case, inputs)
        if case.batch > 1:
            return run
        return lambda: KernelOutput(run().out * 1.5, run().lse)


# ------------------------------------------------------------------------------------------------ the scenarios
def test_every_seed_with_a_graph_path_has_run_and_batch_scenarios_in_the_engines_suite():
    suite = {c.id for c in get_suite("engines") if c.invariance}
    assert suite == {c.id for c in CASES} and len(suite) == len(CASES)
    for name in ENGINES:
        kinds = {c.invariance for c in CASES if c.engine == name}
        assert kinds == {"run", "batch"}, name
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


@pytest.mark.parametrize("case", SAMPLE, ids=[c.id for c in SAMPLE])
def test_every_invariance_scenario_passes_and_keeps_its_invariance_on_sdpa_cpu(case):
    r = _verdict(case, get_backend("sdpa-cpu"))
    assert r.status is Status.PASS, r.reason
    inv = r.extra["invariance"]
    assert inv["kind"] == case.invariance and inv["kept"] is True
    # SDPA takes no split count (batch_invariance_via None): even the batch-invariant scenarios promise run only
    assert inv["promised"] is (case.invariance == "run")
    labels = {"run": ["second run"], "batch": ["alone", "in batch (last)", "beside shorter requests"]}
    assert [p["b"] for p in inv["pairs"]] == labels[case.invariance]
    assert r.extra["engine"]["engine"] == case.engine and r.extra["engine"]["scenario"] == case.scenario
    assert len(r.extra["notes"]) == 1 + len(labels[case.invariance])  # one line per variant's step


# ------------------------------------------------------------------------------------------------ planted bugs
@pytest.mark.parametrize(
    "engine,scenario",
    [("vllm_v1_fa", "inv_batch_invariant_decode"), ("sglang_fa", "inv_batch_decode_deterministic")],
)
def test_a_batch_dependent_kernel_fails_a_promised_scenario(engine, scenario):
    r = _verdict(_case(engine, scenario), BatchDependent())
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
    r = _verdict(_case(engine, scenario), BatchDependent())
    assert r.status is Status.PASS, r.reason
    inv = r.extra["invariance"]
    assert inv["promised"] is False and inv["kept"] is False
    assert not next(p for p in inv["pairs"] if p["b"] == "alone")["equal"]


def test_nothing_is_promised_on_a_kernel_without_a_split_count():
    r = _verdict(_case("vllm_v1_fa", "inv_batch_invariant_decode"), BatchDependentNoSplits())
    assert r.status is Status.PASS, r.reason  # a break, reported: the mode cannot pin what the kernel lacks
    assert r.extra["invariance"]["promised"] is False and r.extra["invariance"]["kept"] is False


def test_a_nondeterministic_kernel_fails_the_run_scenarios():
    for engine, scenario in (("vllm_v1_fa", "inv_run_mixed"), ("sglang_fa", "inv_run_decode")):
        r = _verdict(_case(engine, scenario), AutotunedNonDeterministic())
        assert r.status is Status.FAIL, (engine, r.reason)
        assert "invariance run: request 0 'second run' differs from 'first run'" in r.reason


def test_every_variant_is_judged_numerically():
    r = _verdict(_case("vllm_v0_fa", "inv_batch_decode"), WrongAlone())
    assert r.status is Status.FAIL and "invariance" not in r.reason  # the numbers, not a promise


# ------------------------------------------------------------------------------------------------ the report
def test_the_report_matrix_has_a_row_per_engine_configuration():
    records = [
        _verdict(_case("vllm_v1_fa", "inv_batch_invariant_decode"), BatchDependent()),
        _verdict(_case("vllm_v0_fa", "inv_batch_decode"), BatchDependent()),
        _verdict(_case("sglang_fa", "inv_run_decode"), ExactBackend()),
    ]
    table = invariance_sections(records, ["fake-batch-dependent", "fake-exact"])
    assert table is not None
    rows = {(r["backend"], r["mode"]): r["cells"] for r in table["rows"]}
    batch, run = table["columns"].index("batch"), table["columns"].index("run")
    assert rows[("fake-batch-dependent", "engine vllm_v1_fa, num_splits = 1")][batch]["text"] == "broken 1/1, FAIL 1"
    assert rows[("fake-batch-dependent", "engine vllm_v0_fa")][batch]["text"] == "broken 1/1"
    assert rows[("fake-exact", "engine sglang_fa")][run]["text"] == "kept 1/1"
    assert any("'alone' vs 'in batch (first)'" in n for n in table["notes"])
