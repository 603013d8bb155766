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
  returning something else than KernelOutput, or one whose ``out``/``lse`` are not tensors, is an ERROR naming the
  type it returned;
* the phases (inputs, reference, baseline; kernel, verdict, bench) are each the clock between their own ends (a
  clock that only the timed work moves stands in for the real one);
* one host read before the first kernel call on a context (its fingerprint and the baseline's errors, kept for
  every later backend) and one per check after it; a baseline whose errors cannot be computed leaves them unknown
  and the check still judges;
* the availability probe is asked once per backend object, a probe that raises is a refusal with its message; a
  refusal's record carries the context's seed; a kernel's record carries its output's digest;
* a write outside the outputs names every changed tensor and when it happened;
* a refusal record names the device, the adapter's version and an elapsed time of its own; a backend found
  unavailable says so (``no reason given`` when its probe gave none), and one that was available when the run began
  is an ERROR (a lost device), never an UNSUPPORTED;
* a comparison that cannot start (a malformed ``lse_slack``) raises its own exception out of the check.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shlex
import types
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
from conformance.verdict import hostread
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


class _Ndarray(ExactBackend):
    name = "fake-returns-ndarray"

    def finish(self, case: AttentionCase, out: torch.Tensor, lse: torch.Tensor) -> Any:
        return KernelOutput(out.float().numpy(), lse.float())  # type: ignore[arg-type]


class _ListLse(ExactBackend):
    name = "fake-returns-list-lse"

    def finish(self, case: AttentionCase, out: torch.Tensor, lse: torch.Tensor) -> Any:
        return KernelOutput(out.to(case.torch_dtype), lse.float().tolist())  # type: ignore[arg-type]


def test_outputs_that_are_not_tensors_are_errors_naming_the_type(ctx_cpu) -> None:
    rec = check_backend(fresh(ctx_cpu), _Ndarray())
    assert (
        rec.status is Status.ERROR and rec.reason == "TypeError: KernelOutput.out must be a torch.Tensor, got ndarray"
    )
    rec = check_backend(fresh(ctx_cpu), _ListLse())
    assert rec.status is Status.ERROR
    assert rec.reason == "TypeError: KernelOutput.lse must be a torch.Tensor or None, got list"


# ---------------------------------------------------------------- phases, on a clock only the timed work moves
class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    c = _Clock()
    monkeypatch.setattr(check_mod, "time", types.SimpleNamespace(perf_counter=lambda: c.now))
    return c


def _advancing(clock: _Clock, seconds: float, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        clock.advance(seconds)
        return fn(*args, **kwargs)

    return wrapped


def test_prepare_context_times_each_phase(clock: _Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(check_mod, "make_inputs", _advancing(clock, 1.0, check_mod.make_inputs))
    monkeypatch.setattr(check_mod, "reference", _advancing(clock, 2.0, check_mod.reference))
    monkeypatch.setattr(check_mod, "baseline", _advancing(clock, 4.0, check_mod.baseline))
    ctx = prepare_context(CASE)
    assert ctx.phases == {"inputs_s": 1.0, "reference_s": 2.0, "baseline_s": 4.0} and ctx.ref_s == 7.0


class _Slow(ExactBackend):
    """An exact kernel whose call takes ``seconds`` on the test's clock."""

    name = "fake-slow"

    def __init__(self, clock: _Clock, seconds: float) -> None:
        self.clock, self.seconds = clock, seconds

    def prepare(self, case: AttentionCase, inputs: CaseInputs) -> Callable[[], KernelOutput]:
        return _advancing(self.clock, self.seconds, super().prepare(case, inputs))


def test_check_backend_times_kernel_verdict_and_bench_apart(
    ctx_cpu, clock: _Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the comparison's host read takes 0.5 and finishing its statistics 0.25: the verdict is both windows' sum
    monkeypatch.setattr(check_mod, "read_host", _advancing(clock, 0.5, check_mod.read_host))
    real_pending = check_mod.compare_pending

    def pending(*args: Any, **kwargs: Any) -> Any:
        plan = real_pending(*args, **kwargs)
        return dataclasses.replace(plan, finish=_advancing(clock, 0.25, plan.finish))

    monkeypatch.setattr(check_mod, "compare_pending", pending)
    ctx = fresh(ctx_cpu)
    phases: dict[str, float] = {}
    rec = check_backend(ctx, _Slow(clock, 8.0), phases=phases)
    assert rec.status is Status.PASS, rec.reason
    assert phases == {"kernel_s": 8.0, "verdict_s": 0.75, "bench_s": 0.0}
    assert rec.kernel_s == 8.0

    def timer(fn: Callable[[], KernelOutput]) -> Timing:
        clock.advance(16.0)
        return Timing(median_ms=1.0, p20_ms=1.0, p80_ms=1.0, reps=1, method="fake")

    phases = {}
    rec = check_backend(ctx, _Slow(clock, 2.0), timer=timer, phases=phases)
    assert phases == {"kernel_s": 2.0, "verdict_s": 0.75, "bench_s": 16.0} and rec.extra["bench_s"] == 16.0


class _BrokenPrepare(ExactBackend):
    name = "fake-broken-prepare"

    def prepare(self, case: AttentionCase, inputs: CaseInputs) -> Callable[[], KernelOutput]:
        raise RuntimeError("no kernel for this case")


def test_an_error_before_the_call_reports_zero_phases(ctx_cpu, clock: _Clock) -> None:
    phases: dict[str, float] = {}
    rec = check_backend(fresh(ctx_cpu), _BrokenPrepare(), phases=phases)
    assert rec.status is Status.ERROR and rec.reason == "RuntimeError: no kernel for this case"
    assert phases == {"kernel_s": 0.0, "verdict_s": 0.0, "bench_s": 0.0}


# ---------------------------------------------------------------- host reads and the baseline's errors
@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every host read of the verdict: the check's own and those of pending results read alone (the guard's)."""
    seen: list[str] = []
    real = hostread.read_host

    def counting(where: str) -> Callable[..., Any]:
        def read(*args: Any, **kwargs: Any) -> Any:
            seen.append(where)
            return real(*args, **kwargs)

        return read

    monkeypatch.setattr(check_mod, "read_host", counting("check"))
    monkeypatch.setattr(hostread, "read_host", counting("pending"))
    return seen


def test_one_host_read_before_the_first_call_and_one_per_check(reads: list[str]) -> None:
    ctx = prepare_context(CASE)
    assert ctx.fingerprint is None and ctx.base_errors is None
    assert check_backend(ctx, ExactBackend()).status is Status.PASS
    assert reads == ["check", "check"]  # the fingerprint with the baseline's errors, then the call's
    assert ctx.fingerprint is not None and ctx.base_errors is not None
    assert check_backend(ctx, ExactBackend()).status is Status.PASS
    assert reads == ["check"] * 3

    def timer(fn: Callable[[], KernelOutput]) -> Timing:
        fn()
        return Timing(median_ms=1.0, p20_ms=1.0, p80_ms=1.0, reps=1, method="fake")

    assert check_backend(ctx, ExactBackend(), timer=timer).status is Status.PASS
    assert reads == ["check"] * 4 + ["pending"]  # the guard after the repetitions


def test_every_check_compares_with_the_baseline_errors_read_first(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[Any, ...]] = []
    real = check_mod.compare_pending

    def spy(ref: Any, base: Any, result: Any, tol: Any, *, known: Any) -> Any:
        seen.append((ref, base, result, tol, known))
        return real(ref, base, result, tol, known=known)

    monkeypatch.setattr(check_mod, "compare_pending", spy)
    ctx = prepare_context(CASE)
    for _ in range(2):
        assert check_backend(ctx, ExactBackend()).status is Status.PASS
    assert len(seen) == 2
    for ref, base, result, tol, known in seen:
        assert ref is ctx.ref and base is ctx.base and known is ctx.base_errors and known is not None
        assert isinstance(result, KernelOutput) and tol == check_mod.resolve(CASE, "fake-exact", ())


def test_baseline_errors_that_cannot_be_computed_leave_the_check_to_judge(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("no baseline errors")

    monkeypatch.setattr(check_mod, "baseline_errors_pending", broken)
    ctx = prepare_context(CASE)
    assert check_backend(ctx, ExactBackend()).status is Status.PASS
    assert ctx.fingerprint is not None and ctx.base_errors is None
    assert check_backend(ctx, _Carrying(shift=1.0)).status is Status.FAIL


# ---------------------------------------------------------------- availability, seeds, digests
class _Probe(ExactBackend):
    """An exact kernel whose availability probe answers ``answer`` (or raises it), counting how often it is asked."""

    name = "fake-probe"

    def __init__(self, answer: Support | Exception) -> None:
        self.answer, self.asked = answer, 0

    def is_available(self) -> Support:
        self.asked += 1
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def test_the_availability_probe_is_asked_once_and_a_raising_probe_refuses(ctx_cpu) -> None:
    probe = _Probe(ImportError("libfake.so: cannot open shared object file\nsecond line"))
    for _ in range(2):
        rec = check_backend(fresh(ctx_cpu), probe)
        assert rec.status is Status.UNSUPPORTED
        assert (
            rec.reason
            == "not available here: is_available() raised ImportError: libfake.so: cannot open shared object file"
        )
    assert probe.asked == 1
    counted = _Probe(Support(True))
    assert all(check_backend(fresh(ctx_cpu), counted).status is Status.PASS for _ in range(3))
    assert counted.asked == 1


def test_a_refusal_carries_the_contexts_seed() -> None:
    ctx = prepare_context(CASE, seed=7)
    rec = check_backend(ctx, _RefusesSilently())
    assert rec.status is Status.UNSUPPORTED and rec.seed == 7


class _Lse(ExactBackend):
    name = "fake-lse-shift"

    def __init__(self, shift: float) -> None:
        self.shift = shift

    def finish(self, case: AttentionCase, out: torch.Tensor, lse: torch.Tensor) -> KernelOutput:
        return KernelOutput(out.to(case.torch_dtype), lse.float() + self.shift)


def test_the_record_carries_the_digest_of_out_and_lse(ctx_cpu) -> None:
    from conformance.verdict.fingerprint import digest_of, fingerprints

    ctx = fresh(ctx_cpu)
    got = ExactBackend().prepare(CASE, ctx.inputs)()
    want = digest_of(fingerprints({"out": got.out, "lse": got.lse}))
    rec = check_backend(ctx, ExactBackend())
    assert rec.extra["digest"] == want
    shifted = check_backend(fresh(ctx_cpu), _Lse(2.0**-10))  # within tolerance: a pass with another lse
    assert shifted.status is Status.PASS and shifted.extra["digest"] != want


# ---------------------------------------------------------------- writes outside the outputs
def test_a_write_outside_names_every_changed_tensor_and_when() -> None:
    ctx = prepare_context(CASE)

    class Stray(ExactBackend):
        name = "fake-stray-two"

        def prepare(self, case: AttentionCase, inputs: CaseInputs) -> Callable[[], KernelOutput]:
            run = super().prepare(case, inputs)

            def stray() -> KernelOutput:
                for t in (ctx.ref.out, ctx.base[1]):
                    t.view(-1)[0] += 1
                return run()

            return stray

    rec = check_backend(ctx, Stray())
    assert rec.status is Status.FAIL and rec.extra["wrote_outside"] == ["base[1]", "ref.out"]
    assert rec.reason == (
        "wrote outside its outputs: base[1], ref.out of the case changed during the call (memory the kernel was not "
        "given; the case's inputs and reference are built again for the next backend)"
    )


def test_a_write_while_timed_is_named_too() -> None:
    ctx = prepare_context(CASE)

    def timer(fn: Callable[[], KernelOutput]) -> Timing:
        ctx.ref.lse.view(-1)[0] += 1
        return Timing(median_ms=1.0, p20_ms=1.0, p80_ms=1.0, reps=1, method="fake")

    rec = check_backend(ctx, ExactBackend(), timer=timer)
    assert rec.status is Status.FAIL and rec.extra["wrote_outside"] == ["ref.lse"]
    assert rec.stats is not None and rec.stats.failed_checks == () and rec.timing is not None  # both kept
    assert rec.reason.startswith("wrote outside its outputs: ref.lse of the case changed while timed (memory")


# ---------------------------------------------------------------- refusals
class _Unavailable(ExactBackend):
    name = "fake-unavailable"

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def is_available(self) -> Support:
        return Support(False, self.reason)


def test_a_refusal_record_names_device_version_and_its_own_time(clock: _Clock) -> None:
    rec = check_mod.refusal(CASE, _Unavailable("libfake missing"), "cpu")
    assert rec is not None and rec.status is Status.UNSUPPORTED
    assert rec.reason == "not available here: libfake missing"
    assert (rec.device, rec.version, rec.seed, rec.elapsed_s, rec.kernel_s, rec.harness_s) == (
        "cpu",
        check_mod._version(_Unavailable("")),
        0,
        0.0,
        0.0,
        0.0,
    )
    assert rec.version and not rec.version.startswith("unknown")
    rec = check_mod.refusal(CASE, _Unavailable(""), "cpu")
    assert rec is not None and rec.reason == "not available here: no reason given"


def test_a_backend_lost_since_the_run_began_is_an_error() -> None:
    rec = check_mod.refusal(CASE, _Unavailable("no CUDA device"), "cuda", 3, was_available=True)
    assert rec is not None and rec.status is Status.ERROR and rec.seed == 3
    assert rec.reason == (
        "not available in this worker, though it was when the run began (a lost device?): no CUDA device"
    )
    assert check_mod.refusal(CASE, ExactBackend(), "cpu", was_available=True) is None


class _BadSlack(ExactBackend):
    name = "fake-bad-slack"

    def finish(self, case: AttentionCase, out: torch.Tensor, lse: torch.Tensor) -> KernelOutput:
        return KernelOutput(out.to(case.torch_dtype), lse.float(), lse_slack=torch.zeros(1, 1))


def test_a_comparison_that_cannot_start_raises_its_own_exception(ctx_cpu) -> None:
    with pytest.raises(ValueError, match="^kernel lse_slack must have the reference LSE's shape"):
        check_backend(fresh(ctx_cpu), _BadSlack())


def test_nonfinite_statistics_are_all_named_and_kept(ctx_cpu, monkeypatch: pytest.MonkeyPatch) -> None:
    real = check_mod.compare_pending

    def missed(*args: Any, **kwargs: Any) -> Any:  # a comparison whose sub-checks missed two NaN statistics
        plan = real(*args, **kwargs)

        def finish(values: list[float]) -> Any:
            stats, _, base = plan.finish(values)
            return dataclasses.replace(stats, failed_checks=(), max_abs=math.nan, mean_abs=math.inf), [], base

        return dataclasses.replace(plan, finish=finish)

    monkeypatch.setattr(check_mod, "compare_pending", missed)
    rec = check_backend(fresh(ctx_cpu), ExactBackend())
    assert rec.status is Status.FAIL and rec.reason == "nonfinite statistics: max_abs=nan, mean_abs=inf"
    assert rec.stats is not None and math.isnan(rec.stats.max_abs) and rec.stats.mean_abs == math.inf
