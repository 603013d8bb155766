"""The numerical verdict on one (case, backend): run the kernel once, compare, return a CheckResult.

:func:`prepare_context` builds what every backend of one case shares (inputs, the fp32 reference,
the same-dtype baseline) once; :func:`check_backend` then judges one backend against it with the
tolerance model of :mod:`conformance.verdict.tolerance`.  Each backend gets fresh clones of the input
tensors, because kernels write into them (a kvcache append writes new keys into the cache) and one
backend must not see another's writes.

Failure text has one fixed shape per sub-check, ``"<check>: <what> at <where> > allowed <bound>
(<how the bound is made>)"``, several joined by ``" | "``; the record's ``repro`` field holds the
one-line command that reruns exactly this (case, backend, device, seed).
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from attnfast.base import Backend, KernelOutput, Support
from attnref import AttnResult

from conformance.verdict.baseline import baseline
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import CaseInputs, clone_known, make_inputs
from conformance.records import LOST_DEVICE, CheckResult, ErrorStats, Status, Timing
from conformance.verdict.compare import CHECKS, BaselineErrors, baseline_errors_pending, compare, compare_pending
from conformance.verdict.composition import composition_of
from conformance.verdict.fingerprint import context_tensors, context_fingerprint, digest_of, fingerprints_pending
from conformance.verdict.hostread import read_host
from conformance.verdict.reference import reference
from conformance.verdict.tolerance import resolve

__all__ = [
    "CHECKS",
    "CaseContext",
    "check_backend",
    "compare",
    "composition_of",
    "declared_support",
    "prepare_context",
    "refusal",
    "repro_command",
    "sync",
]


@dataclass
class CaseContext:
    """Everything the backends of one case share.  ``ref_s``: seconds for inputs + reference + baseline;
    ``phases``: the same split as ``{"inputs_s", "reference_s", "baseline_s"}`` (each ended by a device
    synchronisation, so GPU work is charged to the phase that queued it).

    ``ref_charged`` becomes True once a record has counted ``ref_s`` in its ``harness_s``, so the
    harness time summed over a case's records counts the reference once.  ``fingerprint`` and ``corrupted``: the
    guard against kernels that write into memory they were not given (:func:`check_backend`).
    """

    case: AttentionCase
    seed: int
    device: str
    inputs: CaseInputs
    ref: AttnResult
    base: tuple[torch.Tensor, torch.Tensor]
    ref_s: float
    ref_charged: bool = False
    phases: dict[str, float] = dataclasses.field(default_factory=dict)
    #: :func:`context_fingerprint` before the first kernel call on this context (None until then)
    fingerprint: dict[str, str] | None = None
    #: the baseline's part of every bound (:func:`~conformance.verdict.compare.baseline_errors`), read with the
    #: fingerprint (None until then, or when the baseline does not allow it: the comparison then reads it itself)
    base_errors: BaselineErrors | None = None
    #: a kernel changed the context (:func:`check_backend`'s guard): no later backend may be judged against it
    corrupted: bool = False


def sync(device: str) -> None:
    """Wait for the device's queued work (a no-op off CUDA): what a host clock around GPU work needs."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def prepare_context(case: AttentionCase, seed: int = 0, device: str = "cpu") -> CaseContext:
    """Inputs, reference and baseline of ``case`` on ``device``, computed once for every backend.

    For an engine replay (``case.engine``) the reference and baseline are the engine's whole layer
    (:meth:`conformance.engines.base.Engine.reference`); for a graph or invariance case those of its composition
    (:func:`composition_of`)."""
    t0 = time.perf_counter()
    inputs = make_inputs(case, seed, device)
    sync(device)
    t1 = time.perf_counter()
    composition = composition_of(case)
    ref = composition.reference(case, inputs) if composition is not None else reference(case, inputs)
    sync(device)
    t2 = time.perf_counter()
    base = composition.baseline(case, inputs) if composition is not None else baseline(case, inputs)
    sync(device)
    t3 = time.perf_counter()
    phases = {"inputs_s": t1 - t0, "reference_s": t2 - t1, "baseline_s": t3 - t2}
    return CaseContext(case, seed, device, inputs, ref, base, t3 - t0, phases=phases)


def repro_command(case: AttentionCase, backend_name: str, device: str, seed: int) -> str:
    """One shell line that reruns this (case, backend) alone."""
    case_json = json.dumps(case.to_json(), separators=(",", ":"), sort_keys=True)
    return (
        f"attnconf run --backend {shlex.quote(backend_name)} --device {shlex.quote(device)} "
        f"--seed {seed} --case-json {shlex.quote(case_json)}"
    )


def _first_read(ctx: CaseContext) -> None:
    """Before the first kernel call on ``ctx``: its fingerprint (:func:`context_fingerprint`) and the baseline's
    part of every bound (:func:`~conformance.verdict.compare.baseline_errors`), in one host read.  A baseline whose
    errors cannot be computed leaves ``base_errors`` None (the comparison then meets the problem where it always
    did)."""
    prints = fingerprints_pending(context_tensors(ctx))
    try:
        errors = baseline_errors_pending(ctx.ref, ctx.base)
    except Exception:  # noqa: BLE001 - raised again by the comparison, after the kernel call, as before
        errors = None
    floats, ints = read_host([] if errors is None else errors.values, prints.values)
    ctx.fingerprint = prints.finish(ints)
    ctx.base_errors = None if errors is None else errors.finish(floats)


def _guard(ctx: CaseContext, now: dict[str, str] | None = None) -> list[str]:
    """The context's tensors that changed since its fingerprint (sorted names), marking the context corrupted when
    any did; ``now``: the context's fingerprint taken already (in one host read with the kernel output's, whose
    names the guard ignores).  The backends get clones of the inputs and never see the reference or baseline, so a
    change is a kernel writing into memory it was not given (FA2's keyless paged rows did:
    ``scripts/investigate_fa2_keyless_writes.py``); every later verdict on this context would be wrong."""
    assert ctx.fingerprint is not None
    if now is None:
        now = context_fingerprint(ctx)
    changed = sorted(k for k in ctx.fingerprint if now.get(k) != ctx.fingerprint[k])
    if changed:
        ctx.corrupted = True
    return changed


def _wrote_outside(changed: list[str], when: str) -> str:
    """The failure text of a kernel that changed the context's tensors ``changed`` (:func:`_guard`)."""
    return (
        f"wrote outside its outputs: {', '.join(changed)} of the case changed {when} (memory the kernel was not "
        "given; the case's inputs and reference are built again for the next backend)"
    )


def _fresh_inputs(inputs: CaseInputs) -> CaseInputs:
    """A copy whose tensors are clones: whatever the kernel writes stays in its own copy."""
    changes: dict[str, Any] = {k: clone_known(v) for k, v in vars(inputs).items() if isinstance(v, torch.Tensor)}
    if inputs.quant is not None:
        quant: dict[str, Any] = {k: v.clone() for k, v in vars(inputs.quant).items() if isinstance(v, torch.Tensor)}
        changes["quant"] = dataclasses.replace(inputs.quant, **quant)
    return dataclasses.replace(inputs, **changes)


def _exc_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")


def _version(backend: Backend) -> str:
    try:
        return backend.version()
    except Exception as exc:  # a broken version probe must not hide the verdict
        return f"unknown ({_exc_line(exc)})"


def _result(
    case: AttentionCase,
    backend: Backend,
    device: str,
    seed: int,
    version: str,
    status: Status,
    reason: str,
    *,
    elapsed: float,
    kernel_s: float = 0.0,
    bench_s: float = 0.0,
    stats: ErrorStats | None = None,
    timing: Timing | None = None,
    extra: dict[str, Any],
) -> CheckResult:
    return CheckResult(
        case_id=case.id,
        backend=backend.name,
        family=backend.family,
        status=status,
        case=case.to_json(),
        reason=reason,
        version=version,
        device=device,
        seed=seed,
        stats=stats,
        timing=timing,
        repro=repro_command(case, backend.name, device, seed),
        elapsed_s=elapsed,
        kernel_s=kernel_s,
        harness_s=elapsed - kernel_s - bench_s,
        extra=extra,
    )


def _engine_extra(case: AttentionCase, engine: Any) -> dict[str, Any]:
    return {"engine": {"engine": case.engine, "scenario": case.scenario, "seed": engine.seed}} if case.engine else {}


def _available(backend: Backend) -> Any:
    """``backend.is_available()``, asked once per backend object (an import probe); a probe that raises is a
    refusal with its message."""
    cached = getattr(backend, "_attnconf_available", None)
    if cached is None:
        try:
            cached = backend.is_available()
        except Exception as exc:  # noqa: BLE001 - a broken probe is a reason, not a crash of the sweep
            cached = Support(False, f"is_available() raised {_exc_line(exc)}")
        try:
            setattr(backend, "_attnconf_available", cached)  # a memo on the adapter object, which declares none
        except AttributeError:
            pass
    return cached


def declared_support(case: AttentionCase, backend: Backend, device: str) -> Support:
    """What the declarations say about running ``case`` on ``backend``: the composition's own refusal first
    (:func:`composition_of`'s ``refuses``, the same on every backend), then the composition's ``supports`` (or, for
    a single call, the backend's).  From the case alone; raises what a broken ``supports`` raises."""
    composition = composition_of(case)
    if composition is None:
        return backend.supports(case, device)
    declined = composition.refuses(case)
    return Support(False, declined) if declined else composition.supports(case, backend, device)


def refusal(
    case: AttentionCase, backend: Backend, device: str, seed: int = 0, *, was_available: bool = False
) -> CheckResult | None:
    """The record of ``backend`` on ``case`` when it does not run it: UNSUPPORTED with the declared reason (the
    composition's own, :func:`composition_of`'s ``refuses``, then the backend's), or with
    ``not available here: ...`` when the case is supported but the kernel cannot run on this machine
    (:meth:`~attnfast.base.Backend.is_available`: its package is not installed, no device), or ERROR when
    ``supports`` itself raised; None when it runs the case.  Decided from the case alone, before any
    tensor exists, so a case no backend runs costs no inputs, reference or baseline (the worker asks this first).

    ``was_available``: the run found the backend available when it began (``attnconf run``'s describe step); if
    this process now finds it unavailable, the machine changed under the run (a lost or faulted GPU refuses new
    workers), and the record is an ERROR saying so, never an UNSUPPORTED that would read as a refusal."""
    t_start = time.perf_counter()
    engine = composition_of(case)
    try:
        support = declared_support(case, backend, device)
    except Exception as exc:
        status, reason = Status.ERROR, f"supports() raised {_exc_line(exc)}"
    else:
        if support:
            available = _available(backend)
            if available:
                return None
            why = available.reason or "no reason given"
            if was_available:
                status = Status.ERROR
                reason = LOST_DEVICE + why
            else:
                status, reason = Status.UNSUPPORTED, f"not available here: {why}"
        else:
            status, reason = Status.UNSUPPORTED, support.reason or "refused without a reason"
    return _result(
        case,
        backend,
        device,
        seed,
        _version(backend),
        status,
        reason,
        elapsed=time.perf_counter() - t_start,
        extra=_engine_extra(case, engine),
    )


def check_backend(
    ctx: CaseContext,
    backend: Backend,
    *,
    overrides: Sequence[Mapping[str, Any]] = (),
    timer: Callable[[Callable[[], KernelOutput]], Timing] | None = None,
    phases: dict[str, float] | None = None,
) -> CheckResult:
    """Judge ``backend`` on the context's case: UNSUPPORTED, ERROR, FAIL or PASS (with timing if ``timer``).

    ``kernel_s`` is the one verified kernel call (first-call compilation included); ``harness_s`` is
    everything else (support check, preparation, comparison, and the context's ``ref_s`` the first
    time a backend that runs the case uses the context); benchmarking time goes to ``extra["bench_s"]``.
    ``phases``, when given, receives this call's split (seconds): ``kernel_s``, ``verdict_s`` (the comparison, with
    the guard's fingerprints and the output digest it shares its host read with) and ``bench_s`` (the timer); the
    rest of the call is the support check, the input copies and the adapter's ``prepare``.  The record is the same
    with or without it.
    """
    refused = refusal(ctx.case, backend, ctx.device, ctx.seed)
    if refused is not None:
        return refused
    t_start = time.perf_counter()
    case = ctx.case
    ref_share = 0.0 if ctx.ref_charged else ctx.ref_s
    ctx.ref_charged = True
    clock = {"kernel": 0.0, "bench": 0.0, "verdict": 0.0}
    engine = composition_of(case)
    extra: dict[str, Any] = _engine_extra(case, engine)
    version = _version(backend)

    def finish(
        status: Status, reason: str, stats: ErrorStats | None = None, timing: Timing | None = None
    ) -> CheckResult:
        if phases is not None:
            phases.update({f"{k}_s": v for k, v in clock.items()})
        return _result(
            case,
            backend,
            ctx.device,
            ctx.seed,
            version,
            status,
            reason,
            elapsed=time.perf_counter() - t_start + ref_share,
            kernel_s=clock["kernel"],
            bench_s=clock["bench"],
            stats=stats,
            timing=timing,
            extra=extra,
        )

    tol = resolve(case, backend.name, overrides)
    extra["tolerance"] = tol.fields()
    if ctx.fingerprint is None:
        _first_read(ctx)
    try:
        inputs = _fresh_inputs(ctx.inputs)
        fn = backend.prepare(case, inputs) if engine is None else engine.prepare(case, inputs, backend, ctx.device)
        t0 = time.perf_counter()
        result = fn()
        sync(ctx.device)
        clock["kernel"] = time.perf_counter() - t0
        notes = list(getattr(fn, "notes", None) or ())  # read after the call: an engine lists the calls it made
        if notes:
            extra["notes"] = notes
        variant = getattr(fn, "variant", None)  # the kernel variant that ran (attnfast.base: Backend.prepare)
        if variant:
            extra["variant"] = dict(variant)
    except Exception as exc:
        return finish(Status.ERROR, _exc_line(exc))
    # One host read for the kernel output's digest, the context's fingerprint (the guard) and the comparison's
    # statistics: the comparison is queued before the guard is judged and used only when it passes (a comparison that
    # cannot even start, on an output of another shape, raises as it would after the guard).
    mistyped = _type_problem(result)
    named = {} if mistyped else {"kernel out": result.out, "kernel lse": result.lse}
    t0 = time.perf_counter()
    prints_pending = fingerprints_pending({**named, **context_tensors(ctx)})
    plan = plan_error = None
    try:
        if named and not _shape_problem(ctx, result):
            plan = compare_pending(ctx.ref, ctx.base, result, tol, known=ctx.base_errors)
    except Exception as exc:  # noqa: BLE001 - raised below, where the comparison stands
        plan_error = exc
    floats, ints = read_host([] if plan is None else plan.values, prints_pending.values)
    prints = prints_pending.finish(ints)
    clock["verdict"] = time.perf_counter() - t0
    changed = _guard(ctx, prints)
    if changed:
        extra["wrote_outside"] = changed
        return finish(Status.FAIL, _wrote_outside(changed, "during the call"))
    if mistyped:
        return finish(Status.ERROR, mistyped)
    problem = _shape_problem(ctx, result)
    if problem:
        return finish(Status.FAIL, problem)
    extra["digest"] = digest_of({"out": prints["kernel out"], "lse": prints["kernel lse"]})
    if plan_error is not None:
        raise plan_error
    assert plan is not None  # well typed and shaped, and compare_pending did not raise: it ran
    t0 = time.perf_counter()
    stats, details, base_nonfinite = plan.finish(floats)
    clock["verdict"] += time.perf_counter() - t0
    if base_nonfinite:
        extra["baseline_nonfinite"] = base_nonfinite
    extra.update(getattr(fn, "extra", None) or {})  # a composition's own record fields (graph replays, ...)
    if stats.failed_checks:
        return finish(Status.FAIL, " | ".join(details), stats)
    nonfinite = stats.nonfinite_fields()
    if nonfinite:  # no pass carries a NaN/inf statistic, whatever a sub-check missed (records.ErrorStats)
        return finish(Status.FAIL, f"nonfinite statistics: {', '.join(nonfinite)}", stats)
    problems = list(getattr(fn, "problems", None) or ())  # what a composition found beyond the numbers
    if problems:
        return finish(Status.FAIL, " | ".join(problems), stats)
    timing = None
    if timer is not None:
        t0 = time.perf_counter()
        try:
            timing = timer(fn)
        except Exception as exc:  # the verdict stands; the missing number is explained
            extra["timing_error"] = _exc_line(exc)
        clock["bench"] = time.perf_counter() - t0
        extra["bench_s"] = clock["bench"]
        changed = _guard(ctx)  # the repetitions call the kernel again
        if changed:
            extra["wrote_outside"] = changed
            return finish(Status.FAIL, _wrote_outside(changed, "while timed"), stats, timing)
    return finish(Status.PASS, "", stats, timing)


def _type_problem(result: object) -> str:
    """Why ``result`` is not a :class:`KernelOutput` of tensors (an ERROR's reason), or ``""``."""
    if not isinstance(result, KernelOutput):
        return f"TypeError: the prepared callable must return KernelOutput, got {type(result).__name__}"
    if not isinstance(result.out, torch.Tensor):
        return f"TypeError: KernelOutput.out must be a torch.Tensor, got {type(result.out).__name__}"
    if result.lse is not None and not isinstance(result.lse, torch.Tensor):
        return f"TypeError: KernelOutput.lse must be a torch.Tensor or None, got {type(result.lse).__name__}"
    return ""


def _shape_problem(ctx: CaseContext, result: KernelOutput) -> str:
    want_out, want_lse = tuple(ctx.ref.out.shape), tuple(ctx.ref.lse.shape)
    if tuple(result.out.shape) != want_out:
        return f"shape: out {tuple(result.out.shape)} != reference {want_out} (total_q, h, dv)"
    if result.lse is not None and tuple(result.lse.shape) != want_lse:
        return f"shape: lse {tuple(result.lse.shape)} != reference {want_lse} (h, total_q)"
    return ""
