"""Promises of conformance.verdict.check beyond test_check.py (mutmut found them unchecked: docs "Mutation
testing"): ``prepare_context`` keeps the seed it was given (default 0, the CLI's), builds the inputs on the device
it was given, times itself, and for an engine replay takes the reference and baseline from the engine's whole
layer; an exception becomes one line ``"<Type>: <first line>"`` with nothing dangling when the message is empty;
``check_backend``'s record names the case, backend, device and seed it judged, charges the context's reference time
to the first record only, splits its time into kernel + harness + bench exactly, records the engine of a replay,
and gives each backend its own copy of the quantized tensors too."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import pytest
import torch

from attnfast.base import KernelOutput, Support
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import CaseInputs, make_inputs
from conformance.suites.registry import get_suite
from conformance.engines import get_engine
from conformance.records import Status, Timing
from conformance.verdict import check as check_mod
from conformance.verdict.check import check_backend, prepare_context
from tests.conformance.fakes import ExactBackend

CASE = AttentionCase(requests=((3, 5), (1, 4)), num_heads=2, num_kv_heads=1, head_dim=8, causal=True)


def _same_inputs(a: CaseInputs, b: CaseInputs) -> bool:
    return torch.equal(a.q, b.q) and torch.equal(a.k, b.k) and torch.equal(a.v, b.v)


def test_default_seed_is_zero() -> None:
    ctx = prepare_context(CASE)
    assert ctx.seed == 0 and ctx.device == "cpu"
    assert _same_inputs(ctx.inputs, make_inputs(CASE, 0))


def test_context_keeps_its_seed_and_times_itself() -> None:
    t0 = time.perf_counter()
    ctx = prepare_context(CASE, seed=3)
    wall = time.perf_counter() - t0
    assert ctx.seed == 3 and _same_inputs(ctx.inputs, make_inputs(CASE, 3))
    assert 0.0 <= ctx.ref_s <= wall
    rec = check_backend(ctx, ExactBackend())
    assert rec.seed == 3 and "--seed 3 " in rec.repro


def test_inputs_are_built_on_the_given_device(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[object] = []

    def spy(case: AttentionCase, seed: int = 0, device: str | torch.device = "cpu") -> CaseInputs:
        seen.append(device)
        return make_inputs(case, seed, "cpu")

    monkeypatch.setattr(check_mod, "make_inputs", spy)
    prepare_context(CASE, 0, "cpu:0")
    assert seen == ["cpu:0"]


ENGINE_CASE = min(
    (c for c in get_suite("engines") if c.engine == "merge"), key=lambda c: (c.total_q, c.num_heads * c.head_dim)
)


def test_engine_replay_takes_reference_and_baseline_from_the_engine() -> None:
    case = ENGINE_CASE
    ctx = prepare_context(case, seed=1)
    engine = get_engine(case.engine)
    inputs = make_inputs(case, 1)
    ref, (out, lse) = engine.reference(case, inputs), engine.baseline(case, inputs)
    assert torch.equal(ctx.ref.out, ref.out) and torch.equal(ctx.ref.lse, ref.lse)
    assert torch.equal(ctx.base[0], out) and torch.equal(ctx.base[1], lse)


class _Raises(ExactBackend):
    name = "fake-raises-bare"

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def prepare(self, case: AttentionCase, inputs: CaseInputs) -> Callable[[], KernelOutput]:
        def run() -> KernelOutput:
            raise self.exc

        return run


@pytest.mark.parametrize(
    ("exc", "reason"),
    [
        (ValueError(), "ValueError"),
        (RuntimeError("   \n  "), "RuntimeError"),
        (KeyError(""), "KeyError: ''"),
        (ValueError("shape mismatch in X\nmore"), "ValueError: shape mismatch in X"),
        (RuntimeError("bad: "), "RuntimeError: bad"),
    ],
    ids=["empty", "blank", "quoted_key", "ends_in_x", "trailing_colon"],
)
def test_exception_becomes_one_clean_line(exc: BaseException, reason: str) -> None:
    rec = check_backend(prepare_context(CASE), _Raises(exc))
    assert rec.status is Status.ERROR and rec.reason == reason


# ---------------------------------------------------------------- check_backend's record
def test_record_names_what_it_judged() -> None:
    """A device spelled ``cpu:0`` and seed 3 (not the record's defaults) must reach the record and its repro."""
    ctx = prepare_context(CASE, seed=3, device="cpu:0")
    t0 = time.perf_counter()
    rec = check_backend(ctx, ExactBackend())
    wall = time.perf_counter() - t0
    assert rec.status is Status.PASS and rec.reason == ""
    assert (rec.case_id, rec.backend, rec.family, rec.case) == (CASE.id, "fake-exact", "fake", CASE.to_json())
    assert (rec.device, rec.seed) == ("cpu:0", 3)
    assert "--device cpu:0 " in rec.repro and "--seed 3 " in rec.repro
    assert 0.0 <= rec.elapsed_s <= wall + ctx.ref_s


def test_reference_time_is_charged_to_the_first_record_only() -> None:
    ctx = dataclasses.replace(prepare_context(CASE), ref_s=100.0)
    first = check_backend(ctx, ExactBackend())
    assert ctx.ref_charged is True
    second, third = check_backend(ctx, ExactBackend()), check_backend(ctx, ExactBackend())
    assert first.harness_s >= 100.0 and first.elapsed_s >= 100.0
    assert second.harness_s < 0.5 and third.harness_s < 0.5


class _Slow(ExactBackend):
    name = "fake-slow"

    def prepare(self, case: AttentionCase, inputs: CaseInputs) -> Callable[[], KernelOutput]:
        run = super().prepare(case, inputs)

        def slow() -> KernelOutput:
            time.sleep(0.02)
            return run()

        return slow


def test_time_splits_into_kernel_harness_and_bench() -> None:
    def timer(fn: Callable[[], KernelOutput]) -> Timing:
        time.sleep(0.02)
        return Timing(median_ms=1.0, p20_ms=1.0, p80_ms=1.0, reps=1, method="fake")

    rec = check_backend(dataclasses.replace(prepare_context(CASE), ref_s=0.0), _Slow(), timer=timer)
    bench = rec.extra["bench_s"]
    assert rec.kernel_s >= 0.02 and bench >= 0.02 and rec.harness_s >= 0.0
    assert rec.kernel_s + rec.harness_s + bench == pytest.approx(rec.elapsed_s, abs=1e-9)


class _Refuses(ExactBackend):
    name = "fake-refuses"

    def supports(self, case: AttentionCase, device: str) -> Support:
        assert super().supports(case, device)
        return Support(False, "refuses every call")


def test_engine_replay_is_judged_through_the_engine() -> None:
    """The record names the engine and lists the calls the replay made; a refusal names the refused call."""
    engine = get_engine(ENGINE_CASE.engine)
    want = {"engine": ENGINE_CASE.engine, "scenario": ENGINE_CASE.scenario, "seed": engine.seed}
    labels = [label for label, _ in engine.plan(ENGINE_CASE)]
    ctx = prepare_context(ENGINE_CASE)
    rec = check_backend(ctx, ExactBackend())
    assert rec.status is Status.PASS, rec.reason
    assert rec.extra["engine"] == want
    assert [note.split(":")[0] for note in rec.extra["notes"]] == labels
    refused = check_backend(ctx, _Refuses())
    assert refused.status is Status.UNSUPPORTED and refused.reason == f"{labels[0]}: refuses every call"
    assert refused.extra["engine"] == want


class _ScribblesOnQuant(ExactBackend):
    """Writes zeros into every quantized tensor it is given, as a kernel writing its cache might."""

    name = "fake-scribbles"

    def supports(self, case: AttentionCase, device: str) -> Support:
        return Support(True)

    def prepare(self, case: AttentionCase, inputs: CaseInputs) -> Callable[[], KernelOutput]:
        run = super().prepare(case, inputs)
        for t in vars(inputs.quant).values():
            if isinstance(t, torch.Tensor):
                t.view(torch.uint8).zero_() if t.element_size() == 1 else t.zero_()
        return run


def test_each_backend_gets_its_own_quantized_tensors() -> None:
    case = CASE.replace(quant="fp8_e4m3")
    ctx = prepare_context(case)
    before = {k: v.clone() for k, v in vars(ctx.inputs.quant).items() if isinstance(v, torch.Tensor)}
    assert before
    rec = check_backend(ctx, _ScribblesOnQuant())
    assert rec.status in (Status.PASS, Status.FAIL), rec.reason  # the kernel ran on its own copy
    after = {k: v for k, v in vars(ctx.inputs.quant).items() if isinstance(v, torch.Tensor)}
    for k, v in before.items():
        assert torch.equal(v.view(torch.uint8), after[k].view(torch.uint8)), k
