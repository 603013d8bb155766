"""Promises of conformance.verdict.check that mutmut found unchecked (docs "Mutation testing").

* :func:`composition_of` picks what composes a case's kernel calls: its engine, the graph replay, the invariance
  run, or nothing; :func:`prepare_context` takes the reference and baseline from that composition;
* on a CUDA device the harness synchronizes before it stops a clock (CPU-only here: a spy stands in for
  ``torch.cuda.synchronize``);
* the repro line's case JSON is canonical: compact (one shell word, no spaces) and key-sorted at every level;
* a refusal without a reason still says so; a backend-scoped override reaches the verdict;
* a prepared callable's ``extra`` is merged into the record whatever the verdict, its ``problems`` turn a
  numerically passing record into FAIL with those reasons (joined by ``" | "``), and several failed sub-checks
  are joined the same way, in ``failed_checks`` order;
* the timer gets the prepared callable itself; without a timer the record has no timing; a prepared callable
  returning something else than KernelOutput is an ERROR naming the type it returned.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from collections.abc import Callable
from typing import Any

import pytest
import torch

from attnfast.base import KernelOutput, Support
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import CaseInputs, make_inputs
from conformance.suites.registry import get_suite
from conformance.engines import get_engine
from conformance.graphs.invariance import INVARIANCE
from conformance.graphs.replay import GRAPH
from conformance.records import Status, Timing
from conformance.verdict import check as check_mod
from conformance.verdict.check import check_backend, composition_of, prepare_context
from tests.conformance.fakes import ExactBackend

CASE = AttentionCase(requests=((3, 5), (1, 4)), num_heads=2, num_kv_heads=1, head_dim=8, causal=True)
GRAPH_CASE = AttentionCase(
    ((1, 5), (1, 3), (1, 4)), num_heads=2, num_kv_heads=1, head_dim=8, kv_layout="NHD", block_size=4, graph=(2, 1)
)
INVARIANCE_CASE = AttentionCase(
    ((2, 5), (1, 3)), num_heads=2, num_kv_heads=1, head_dim=8, causal=True, invariance="batch"
)


@pytest.fixture(scope="module")
def ctx_cpu():
    return prepare_context(CASE)


def fresh(ctx: check_mod.CaseContext) -> check_mod.CaseContext:
    return dataclasses.replace(ctx, ref_charged=False)


# ---------------------------------------------------------------- compositions
def test_composition_of_names_what_composes_the_calls() -> None:
    assert composition_of(CASE) is None
    assert composition_of(GRAPH_CASE) is GRAPH
    assert composition_of(INVARIANCE_CASE) is INVARIANCE
    engine_case = next(c for c in get_suite("engines") if c.engine)
    composed, engine = composition_of(engine_case), get_engine(engine_case.engine)
    assert type(composed) is type(engine) and composed.seed == engine.seed


def test_an_invariance_case_is_referenced_and_judged_through_its_composition() -> None:
    """The reference covers every variant of the run (more rows than the case alone); the run's matrix is recorded."""
    ctx = prepare_context(INVARIANCE_CASE, seed=2)
    inputs = make_inputs(INVARIANCE_CASE, 2)
    ref = INVARIANCE.reference(INVARIANCE_CASE, inputs)
    base_out, base_lse = INVARIANCE.baseline(INVARIANCE_CASE, inputs)
    assert ctx.ref.out.shape[0] > INVARIANCE_CASE.total_q
    assert torch.equal(ctx.ref.out, ref.out) and torch.equal(ctx.ref.lse, ref.lse)
    assert torch.equal(ctx.base[0], base_out) and torch.equal(ctx.base[1], base_lse)
    rec = check_backend(ctx, ExactBackend())
    assert rec.status is Status.PASS, rec.reason
    assert rec.extra["invariance"]["kind"] == "batch" and rec.extra["invariance"]["pairs"]
    assert rec.extra["notes"]


# ---------------------------------------------------------------- CUDA synchronization
def test_a_cuda_device_is_synchronized_before_each_clock_stops(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: calls.append("sync"))
    monkeypatch.setattr(check_mod, "make_inputs", lambda case, seed=0, device="cpu": make_inputs(case, seed, "cpu"))
    ctx = prepare_context(CASE, 0, "cuda:0")
    # inputs, reference and baseline are each timed to the end of the device's work (the profile's three phases)
    assert calls == ["sync"] * 3 and set(ctx.phases) == {"inputs_s", "reference_s", "baseline_s"}
    rec = check_backend(ctx, ExactBackend())
    assert rec.status is Status.PASS and calls == ["sync"] * 4  # the kernel clock too
    check_mod.sync("cpu")
    assert calls == ["sync"] * 4


# ---------------------------------------------------------------- repro
def _canonical(value: Any) -> bool:
    if isinstance(value, dict):
        return list(value) == sorted(value) and all(_canonical(v) for v in value.values())
    if isinstance(value, list):
        return all(_canonical(v) for v in value)
    return True


def test_repro_case_json_is_compact_and_key_sorted() -> None:
    case = CASE.replace(window=(2, 0), softcap=30.0)
    argv = shlex.split(check_mod.repro_command(case, "fake-exact", "cpu", 0))
    case_json = argv[argv.index("--case-json") + 1]
    assert " " not in case_json and "\n" not in case_json
    assert list(case.to_json()) != sorted(case.to_json())  # the case's own order is not sorted ...
    assert _canonical(json.loads(case_json))  # ... the repro's is
    assert AttentionCase.from_json(json.loads(case_json)) == case


# ---------------------------------------------------------------- support and tolerance
class _RefusesSilently(ExactBackend):
    name = "fake-refuses-silently"

    def supports(self, case: AttentionCase, device: str) -> Support:
        return Support(False, "")


def test_a_refusal_without_a_reason_says_so(ctx_cpu) -> None:
    rec = check_backend(fresh(ctx_cpu), _RefusesSilently())
    assert rec.status is Status.UNSUPPORTED and rec.reason == "refused without a reason"


def test_a_backend_scoped_override_reaches_the_record(ctx_cpu) -> None:
    mine = {"backend": "fake-exact", "atol": 0.125}
    other = {"backend": "fake-other", "factor": 99.0}
    rec = check_backend(fresh(ctx_cpu), ExactBackend(), overrides=[mine, other])
    assert rec.extra["tolerance"]["atol"] == 0.125 and rec.extra["tolerance"]["factor"] != 99.0


# ---------------------------------------------------------------- what a prepared callable carries
class _Carrying(ExactBackend):
    """Returns ``out + shift`` from a callable carrying ``extra`` / ``problems`` as a composition's run does."""

    name = "fake-carrying"

    def __init__(self, shift: float = 0.0, extra: dict | None = None, problems: list[str] | None = None) -> None:
        self.shift, self.extra, self.problems = shift, extra, problems

    def prepare(self, case: AttentionCase, inputs: CaseInputs) -> Callable[[], KernelOutput]:
        run = super().prepare(case, inputs)
        owner = self

        class Prepared:
            extra, problems = owner.extra, owner.problems

            def __call__(self) -> KernelOutput:
                got = run()
                return KernelOutput(got.out + owner.shift, got.lse)

        return Prepared()


def test_a_prepared_callables_extra_reaches_the_record(ctx_cpu) -> None:
    rec = check_backend(fresh(ctx_cpu), _Carrying(extra={"graph": {"replays": 2}}))
    assert rec.status is Status.PASS and rec.extra["graph"] == {"replays": 2}
    failed = check_backend(fresh(ctx_cpu), _Carrying(shift=1.0, extra={"graph": {"replays": 3}}))
    assert failed.status is Status.FAIL and failed.extra["graph"] == {"replays": 3}


def test_problems_fail_a_numerically_passing_record(ctx_cpu) -> None:
    problems = ["replay 1 differs bitwise from its eager call", "replay 2 wrote past its rows"]
    rec = check_backend(fresh(ctx_cpu), _Carrying(problems=problems))
    assert rec.status is Status.FAIL
    assert rec.reason == "replay 1 differs bitwise from its eager call | replay 2 wrote past its rows"
    assert rec.stats is not None and rec.stats.failed_checks == ()  # the numbers passed, and are kept
    assert check_backend(fresh(ctx_cpu), _Carrying(problems=[])).status is Status.PASS


def test_failed_sub_checks_are_joined_in_order(ctx_cpu) -> None:
    rec = check_backend(fresh(ctx_cpu), _Carrying(shift=1.0, problems=["not reached: the numbers failed"]))
    assert rec.status is Status.FAIL and len(rec.stats.failed_checks) >= 2
    parts = rec.reason.split(" | ")
    assert [p.split(":")[0] for p in parts] == list(rec.stats.failed_checks)


# ---------------------------------------------------------------- timing and the callable's result
def test_the_timer_times_the_prepared_callable(ctx_cpu) -> None:
    got: list[Any] = []

    def timer(fn: Callable[[], KernelOutput]) -> Timing:
        got.append(fn())
        return Timing(median_ms=1.0, p20_ms=1.0, p80_ms=1.0, reps=1, method="fake")

    rec = check_backend(fresh(ctx_cpu), ExactBackend(), timer=timer)
    assert rec.status is Status.PASS and rec.timing is not None and "timing_error" not in rec.extra
    assert len(got) == 1 and isinstance(got[0], KernelOutput)
    untimed = check_backend(fresh(ctx_cpu), ExactBackend())
    assert untimed.timing is None and "bench_s" not in untimed.extra


class _ReturnsTuple(ExactBackend):
    name = "fake-returns-tuple"

    def finish(self, case: AttentionCase, out: torch.Tensor, lse: torch.Tensor) -> Any:
        return out, lse


def test_a_wrong_return_type_is_an_error_naming_the_type(ctx_cpu) -> None:
    rec = check_backend(fresh(ctx_cpu), _ReturnsTuple())
    assert rec.status is Status.ERROR
    assert rec.reason == "TypeError: the prepared callable must return KernelOutput, got tuple"
