"""The numerical verdict: reference and baseline, compare() on hand-built tensors, check_backend end to end.

The planted-bug backends of ``fakes.py`` are the evidence that the tolerance model works: the exact
backend passes every case with margin, and every bug fails on a case that exercises its feature.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

from tests.conformance import fakes
import pytest
import torch

from attnfast.base import KernelOutput
from attnref import AttnResult
from conformance.verdict import baseline as baseline_mod
from conformance.cases.case import AttentionCase
from conformance.verdict.check import CaseContext, check_backend, compare, prepare_context, repro_command
from conformance.cases.inputs import make_inputs
from conformance.records import Status, Timing
from conformance.verdict.reference import reference
from conformance.verdict.tolerance import Tolerance

GQA = dict(num_heads=4, num_kv_heads=2, head_dim=32)
MIXED = ((24, 24), (1, 40), (9, 30))

#: Small cases covering each feature a planted bug or the check itself depends on.
CASES: dict[str, AttentionCase] = {
    "causal_bf16": AttentionCase(requests=MIXED, causal=True, **GQA),
    "window_fp16": AttentionCase(requests=MIXED, causal=True, window=(6, 0), dtype="fp16", **GQA),
    "window_sym_bf16": AttentionCase(requests=MIXED, window=(5, 3), **GQA),
    # a wide window makes the off-by-one small (one key in 49): the factor, not only the mean check, must catch it
    "window_wide_bf16": AttentionCase(requests=((64, 160), (1, 200)), causal=True, window=(48, 0), **GQA),
    "softcap_bf16": AttentionCase(requests=MIXED, causal=True, softcap=30.0, **GQA),
    "sinks_bf16": AttentionCase(requests=MIXED, causal=True, sinks=True, **GQA),
    "alibi_fp16": AttentionCase(requests=MIXED, causal=True, alibi=True, dtype="fp16", **GQA),
    "paged_append_bf16": AttentionCase(requests=MIXED, causal=True, kv_layout="NHD", block_size=8, append=True, **GQA),
    "paged_hnd_fp16": AttentionCase(requests=MIXED, causal=True, kv_layout="HND", block_size=16, dtype="fp16", **GQA),
    "masked_rows_bf16": AttentionCase(requests=((6, 3), (2, 0), (4, 4)), causal=True, **GQA),
    "mqa_decode_fp16": AttentionCase(
        requests=((1, 50), (1, 1)), num_heads=4, num_kv_heads=1, head_dim=64, dtype="fp16"
    ),
    "chunk_fp32": AttentionCase(requests=MIXED, causal=True, chunk=8, dtype="fp32", **GQA),
}

_CONTEXTS: dict[str, CaseContext] = {}


def ctx_of(name: str) -> CaseContext:
    """One context per case for the whole module (check_backend never mutates it but ref_charged and its guard's
    fingerprint)."""
    if name not in _CONTEXTS:
        _CONTEXTS[name] = prepare_context(CASES[name], seed=0)
    return _CONTEXTS[name]


# ---------------------------------------------------------------- reference and baseline
def test_fp32_baseline_matches_reference_and_masks_rows():
    case = CASES["masked_rows_bf16"].replace(dtype="fp32")
    inputs = make_inputs(case)
    ref = reference(case, inputs)
    out, lse = baseline_mod.baseline(case, inputs)
    assert ref.out.dtype == torch.float64  # fp32 inputs are judged against fp64
    torch.testing.assert_close(out.double(), ref.out, atol=1e-5, rtol=1e-5)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref.lse))
    assert torch.isneginf(ref.lse).any()  # the case really has fully masked rows
    assert (out[torch.isneginf(lse).T] == 0).all()


def test_baseline_tiling_does_not_change_the_result(monkeypatch):
    case, inputs = CASES["sinks_bf16"], make_inputs(CASES["sinks_bf16"])
    whole = baseline_mod.baseline(case, inputs)
    monkeypatch.setattr(baseline_mod, "MAX_TILE_ELEMS", 4 * 40 * 3)  # a few query rows per tile
    tiled = baseline_mod.baseline(case, inputs)
    assert torch.equal(whole[0], tiled[0]) and torch.equal(whole[1], tiled[1])


def test_low_precision_baseline_has_rounding_error():
    ctx = ctx_of("causal_bf16")
    err = float((ctx.base[0].float() - ctx.ref.out).abs().max())
    assert 1e-4 < err < 5e-2  # bf16 noise: neither exact nor broken


# ---------------------------------------------------------------- compare on hand-built tensors
TOL = Tolerance(
    factor=2,
    atol=1e-3,
    atol_rel=math.inf,  # a fixed atol: these tests pin its arithmetic (the row cap: test_peer_bounds.py)
    rtol=0,
    mean_factor=2,
    mean_atol=1e-4,
    lse_factor=2,
    lse_atol=1e-3,
    lse_rtol=0,
    min_cosine=0.99,
    max_mismatch_frac=0,
)


def hand_built() -> tuple[AttnResult, tuple[torch.Tensor, torch.Tensor]]:
    """4 tokens, 2 heads, dim 3; (token 3, head 0) is a fully masked row."""
    gen = torch.Generator().manual_seed(0)
    out = torch.randn(4, 2, 3, generator=gen)
    out[3, 0] = 0
    lse = torch.randn(2, 4, generator=gen)
    lse[0, 3] = -math.inf
    base_out = out + 0.01 * torch.randn(4, 2, 3, generator=gen)
    base_out[3, 0] = 0
    base_lse = lse + 0.002
    return AttnResult(out, lse), (base_out, base_lse)


def test_compare_exact_passes():
    ref, base = hand_built()
    stats = compare(ref, base, KernelOutput(ref.out.clone(), ref.lse.clone()), TOL)
    assert stats.failed_checks == () and stats.error_ratio == 0 and stats.cosine == pytest.approx(1.0)
    assert stats.lse_max_abs == 0 and stats.lse_allowed == pytest.approx(2 * 0.002 + 1e-3, rel=1e-4)


def test_compare_worst_position_and_ratio():
    ref, base = hand_built()
    out = ref.out.clone()
    out[2, 1, 0] += 0.5
    out[1, 0, 2] -= 0.3
    stats = compare(ref, base, KernelOutput(out, None), TOL)
    b_max = float((base[0] - ref.out).abs().max())
    assert stats.worst == (2, 1, 0)
    assert stats.baseline_max_abs == pytest.approx(b_max)
    assert stats.error_ratio == pytest.approx(0.5 / (2 * b_max + 1e-3), rel=1e-4)
    assert "max_error" in stats.failed_checks and stats.lse_max_abs is None
    assert stats.mismatch_frac == pytest.approx(2 / 24)


def test_compare_mismatch_allowance_and_rtol():
    ref, base = hand_built()
    out = ref.out.clone()
    out[0, 0, 0] += 0.2
    allow = Tolerance(max_mismatch_frac=0.05).over(TOL)
    assert "max_error" not in compare(ref, base, KernelOutput(out, None), allow).failed_checks
    relative = Tolerance(rtol=0.2 / float(ref.out[0, 0, 0].abs())).over(TOL)
    stats = compare(ref, base, KernelOutput(out, None), relative)
    assert "max_error" not in stats.failed_checks and stats.error_ratio <= 1


def test_compare_nonfinite():
    ref, base = hand_built()
    out = ref.out.clone()
    out[1, 1, 2] = math.nan
    stats = compare(ref, base, KernelOutput(out, None), TOL)
    assert stats.nonfinite == 1 and stats.worst == (1, 1, 2)
    assert {"nonfinite", "max_error"} <= set(stats.failed_checks)


def test_compare_masked_rows_output_and_lse():
    ref, base = hand_built()
    out = ref.out.clone()
    out[3, 0, 1] = 0.5
    stats = compare(ref, base, KernelOutput(out, ref.lse.clone()), TOL)
    assert "masked_rows" in stats.failed_checks
    lse = ref.lse.clone()
    lse[0, 3] = math.inf  # FA2's convention, not normalised by the adapter
    stats = compare(ref, base, KernelOutput(ref.out.clone(), lse), TOL)
    assert stats.failed_checks == ("masked_rows",)


def test_compare_lse_mean_and_cosine_separately():
    ref, base = hand_built()
    lse = ref.lse.clone()
    lse[1, 2] += 0.1
    assert compare(ref, base, KernelOutput(ref.out.clone(), lse), TOL).failed_checks == ("lse",)
    # a uniform offset under the max bound but far above the baseline's mean error
    b_max = float((base[0] - ref.out).abs().max())
    shifted = ref.out + 0.9 * (2 * b_max) * torch.sign(ref.out)
    shifted[3, 0] = 0
    assert compare(ref, base, KernelOutput(shifted, None), TOL).failed_checks == ("mean_error",)
    loose = Tolerance(factor=1e6, mean_factor=1e6).over(TOL)
    assert compare(ref, base, KernelOutput(-ref.out, None), loose).failed_checks == ("cosine",)


def test_compare_needs_a_resolved_tolerance():
    ref, base = hand_built()
    with pytest.raises(ValueError, match="resolved"):
        compare(ref, base, KernelOutput(ref.out, None), Tolerance(factor=2))


# ---------------------------------------------------------------- check_backend
@pytest.mark.parametrize("name", sorted(CASES))
def test_exact_backend_passes_with_margin(name):
    result = check_backend(ctx_of(name), fakes.ExactBackend())
    assert result.status is Status.PASS, result.reason
    assert result.stats.error_ratio < 0.5 and result.stats.lse_max_abs <= result.stats.lse_allowed
    assert result.kernel_s > 0 and result.harness_s > 0 and result.elapsed_s >= result.kernel_s
    assert result.extra["tolerance"]["factor"] >= 2


BUG_CASES = [
    (fakes.WindowOffByOneBackend, "window_fp16", "max_error"),
    (fakes.WindowOffByOneBackend, "window_sym_bf16", "max_error"),
    (fakes.WindowOffByOneBackend, "window_wide_bf16", "max_error"),
    (fakes.SinksIgnoredBackend, "sinks_bf16", "max_error"),
    (fakes.SoftcapMissingBackend, "softcap_bf16", "max_error"),
    (fakes.LseSignBackend, "causal_bf16", "lse"),
    (fakes.LseSignBackend, "paged_append_bf16", "lse"),
    (fakes.NoisyBackend, "causal_bf16", "max_error"),
    (fakes.NoisyBackend, "mqa_decode_fp16", "max_error"),
    (fakes.NoisyBackend, "chunk_fp32", "mean_error"),
]


@pytest.mark.parametrize("bug, name, check", BUG_CASES, ids=[f"{b.name}-{n}" for b, n, _ in BUG_CASES])
def test_planted_bug_fails(bug, name, check):
    result = check_backend(ctx_of(name), bug())
    assert result.status is Status.FAIL
    assert check in result.stats.failed_checks, result.reason
    assert result.reason.startswith(result.stats.failed_checks[0] + ":")


def test_planted_bugs_are_invisible_without_their_feature():
    for bug in (fakes.WindowOffByOneBackend, fakes.SinksIgnoredBackend, fakes.SoftcapMissingBackend):
        assert check_backend(ctx_of("causal_bf16"), bug()).status is Status.PASS


def test_failure_reason_shape():
    reason = check_backend(ctx_of("window_fp16"), fakes.WindowOffByOneBackend()).reason
    pattern = (
        r"^max_error: \|out-ref\| \S+ at \(token \d+, head \d+, dim \d+\) > allowed \S+ "
        r"\(2 x baseline \S+ \+ (atol \S+|atol_rel \S+ x \|ref\| \S+)\); "
        r"error ratio \d+\.\d\d; \d+ of \d+ elements over"
    )
    assert re.match(pattern, reason), reason


def test_raising_backend_is_an_error():
    result = check_backend(ctx_of("causal_bf16"), fakes.RaisingBackend())
    assert result.status is Status.ERROR
    assert result.reason == "RuntimeError: planted failure: fake kernel raised"


def test_refused_feature_is_unsupported():
    result = check_backend(ctx_of("sinks_bf16"), fakes.RefusesSinksBackend())
    assert result.status is Status.UNSUPPORTED and result.reason.startswith("sinks: planted refusal")

    class CudaOnly(fakes.ExactBackend):
        name = "fake-cuda-only"
        devices = ("cuda",)

    result = check_backend(ctx_of("causal_bf16"), CudaOnly())
    assert result.status is Status.UNSUPPORTED and "not cpu" in result.reason


def test_backends_cannot_corrupt_each_others_inputs():
    ctx = ctx_of("paged_append_bf16")
    cache_before = ctx.inputs.k_cache.clone()

    class Vandal(fakes.ExactBackend):
        name = "fake-vandal"

        def prepare(self, case, inputs):
            run = super().prepare(case, inputs)  # appends into (its copy of) the cache

            def vandalise():
                result = run()
                inputs.q.zero_()
                inputs.k_cache.zero_()
                return result

            return vandalise

    assert check_backend(ctx, Vandal()).status is Status.PASS
    assert torch.equal(ctx.inputs.k_cache, cache_before)
    assert check_backend(ctx, fakes.ExactBackend()).status is Status.PASS


@pytest.mark.parametrize("target", ["ref.out", "inputs.cu_seqlens_q", "base[1]", "inputs.k_cache"])
def test_a_kernel_writing_memory_it_was_not_given_fails_and_spoils_no_later_verdict(target):
    """FA2's keyless paged rows wrote into the case's reference and inputs on an H100
    (scripts/investigate_fa2_keyless_writes.py); the next backend was then judged against garbage.  The guard
    fingerprints the context before the first call and after each: the writer fails by name, the context is marked
    corrupted, and the worker builds it again for the next backend."""
    ctx = prepare_context(CASES["paged_append_bf16"], seed=0)  # its own: this test spoils it
    victim = {
        "ref.out": lambda: ctx.ref.out,
        "inputs.cu_seqlens_q": lambda: ctx.inputs.cu_seqlens_q,
        "base[1]": lambda: ctx.base[1],
        "inputs.k_cache": lambda: ctx.inputs.k_cache,
    }[target]

    class Stray(fakes.ExactBackend):
        name = "fake-stray-writes"

        def prepare(self, case, inputs):
            run = super().prepare(case, inputs)

            def stray():
                result = run()
                flat = victim().view(-1)
                flat[-1] = flat[-1] + 1  # one element of memory the kernel was not given
                return result

            return stray

    assert check_backend(ctx, fakes.ExactBackend()).status is Status.PASS  # takes the fingerprint first
    result = check_backend(ctx, Stray())
    assert result.status is Status.FAIL and result.reason.startswith(f"wrote outside its outputs: {target} ")
    assert result.extra["wrote_outside"] == [target] and ctx.corrupted


def test_the_context_guard_sees_every_tensor_and_a_clean_kernel_passes():
    from conformance.verdict.fingerprint import context_tensors, context_fingerprint

    ctx = ctx_of("paged_append_bf16")
    names = set(context_tensors(ctx))
    assert {"inputs.q", "inputs.k_cache", "inputs.block_table", "ref.out", "ref.lse", "base[0]", "base[1]"} <= names
    before = context_fingerprint(ctx)
    assert check_backend(ctx, fakes.ExactBackend()).status is Status.PASS
    assert context_fingerprint(ctx) == before == ctx.fingerprint and not ctx.corrupted


def test_the_worker_builds_a_corrupted_context_again():
    from conformance.running.worker import _Worker

    case = CASES["causal_bf16"]
    worker = _Worker()
    req = {"case": case.to_json(), "backend": "sdpa-cpu", "device": "cpu", "seed": 0}
    worker.check(req)
    first = worker.ctx
    worker.ctx.corrupted = True  # as check_backend's guard leaves it
    worker.check(req)
    assert worker.ctx is None or worker.ctx is not first
    worker.check(req)
    assert worker.ctx is not None and worker.ctx is not first and not worker.ctx.corrupted


def test_adapter_contract_violations():
    class WrongShape(fakes.ExactBackend):
        name = "fake-wrong-shape"

        def finish(self, case, out, lse):
            return KernelOutput(out[:-1].to(case.torch_dtype), lse)

    class WrongType(fakes.ExactBackend):
        name = "fake-wrong-type"

        def finish(self, case, out, lse):
            return out, lse

    result = check_backend(ctx_of("causal_bf16"), WrongShape())
    assert result.status is Status.FAIL and result.reason.startswith("shape: out")
    result = check_backend(ctx_of("causal_bf16"), WrongType())
    assert result.status is Status.ERROR and "KernelOutput" in result.reason


def test_timer_runs_only_on_pass_and_its_failure_keeps_the_verdict():
    calls = []

    def timer(fn):
        calls.append(fn)
        return Timing(median_ms=1.0, p20_ms=0.9, p80_ms=1.1, reps=3, method="fake")

    ctx = prepare_context(CASES["causal_bf16"])
    result = check_backend(ctx, fakes.ExactBackend(), timer=timer)
    assert result.timing is not None and result.timing.median_ms == 1.0 and len(calls) == 1
    assert result.harness_s >= ctx.ref_s  # the first record carries the reference's cost
    assert check_backend(ctx, fakes.NoisyBackend(), timer=timer).timing is None and len(calls) == 1

    def broken(fn):
        raise RuntimeError("no events")

    result = check_backend(ctx, fakes.ExactBackend(), timer=broken)
    assert result.status is Status.PASS and result.extra["timing_error"] == "RuntimeError: no events"


def test_overrides_reach_the_verdict():
    ctx = ctx_of("window_fp16")
    lenient = [{"factor": 1e6, "mean_factor": 1e6, "min_cosine": -1, "lse_factor": 1e6}]
    assert check_backend(ctx, fakes.WindowOffByOneBackend(), overrides=lenient).status is Status.PASS


def test_repro_command_round_trips():
    case = CASES["window_sym_bf16"]
    argv = shlex.split(repro_command(case, "fa2", "cuda:0", 7))
    assert argv[:8] == ["attnconf", "run", "--backend", "fa2", "--device", "cuda:0", "--seed", "7"]
    assert argv[8] == "--case-json" and AttentionCase.from_json(json.loads(argv[9])) == case
    assert check_backend(ctx_of("causal_bf16"), fakes.ExactBackend()).repro.startswith(
        "attnconf run --backend fake-exact"
    )


def _start_fake_kernel(fake: str) -> subprocess.Popen:
    """A child process that builds a tiny case, prints 'ready', then runs the fake's kernel."""
    script = (
        f"import sys; sys.path[:0] = [{str(Path(__file__).parents[3])!r}]\n"
        "from tests.conformance import fakes\nfrom conformance.cases.case import AttentionCase\n"
        "from conformance.cases.inputs import make_inputs\n"
        "c = AttentionCase(requests=((2, 2),), num_heads=1, num_kv_heads=1, head_dim=8)\n"
        f"fn = fakes.{fake}().prepare(c, make_inputs(c))\nprint('ready', flush=True)\nfn()\n"
    )
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_crashing_and_hanging_fakes_do_what_they_say():
    """They exist for the runner's process isolation; here only that they really abort / hang."""
    crash, hang = _start_fake_kernel("CrashingBackend"), _start_fake_kernel("HangingBackend")
    try:
        assert crash.stdout.readline().strip() == "ready", crash.stderr.read()[-500:]
        assert crash.wait(timeout=30) == -signal.SIGABRT
        assert hang.stdout.readline().strip() == "ready", hang.stderr.read()[-500:]
        with pytest.raises(subprocess.TimeoutExpired):
            hang.wait(timeout=1.0)
    finally:
        for proc in (crash, hang):
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            proc.stdout.close()
            proc.stderr.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_context_matches_cpu_and_exact_passes():
    case = CASES["paged_append_bf16"]
    gpu = prepare_context(case, device="cuda")
    cpu = ctx_of("paged_append_bf16")
    torch.testing.assert_close(gpu.ref.out.cpu(), cpu.ref.out, atol=1e-5, rtol=1e-5)
    assert check_backend(gpu, fakes.ExactBackend()).status is Status.PASS
    assert check_backend(gpu, fakes.NoisyBackend()).status is Status.FAIL
