"""Planted gradient bugs fail through check_backend; the exact fakes pass (issue 20's "done when").

Each bug backend (:mod:`tests.conformance.backward.grad_fakes`) differs from the passing flash-style fake by one
mistake; the case carries the feature that exposes it, and the failure text must name the gradient it broke.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from conformance.cases.case import AttentionCase
from conformance.records import Status
from conformance.verdict.check import check_backend, prepare_context
from tests.conformance.backward.grad_fakes import (
    AutogradBackend,
    CausalDsUnmaskedBackend,
    FlashStyleBackend,
    GqaDkFirstHeadBackend,
    NanGradBackend,
    NondeterministicBackend,
    SoftcapDerivativeMissingBackend,
    WrongRowLseBackend,
)
from tests.conformance.fakes import ExactBackend

REQUESTS = ((33, 33), (1, 1), (20, 40))


def bwd_case(**changes) -> AttentionCase:
    fields = dict(requests=REQUESTS, num_heads=4, num_kv_heads=2, head_dim=32, causal=True, backward=True)
    fields.update(changes)
    return AttentionCase(**fields)


CASES = {
    "plain": bwd_case(),
    "softcap": bwd_case(softcap=30.0),
    "sinks_alibi_fp16": bwd_case(sinks=True, alibi=True, dtype="fp16", causal=False, window=(8, 4)),
    "mqa_dv": bwd_case(num_kv_heads=1, head_dim_v=16, data="outliers"),
    "deterministic": bwd_case(deterministic=True),
}


@pytest.fixture(scope="module")
def contexts():
    return {name: prepare_context(case, seed=0, device="cpu") for name, case in CASES.items()}


@pytest.mark.parametrize("backend", [FlashStyleBackend, AutogradBackend])
@pytest.mark.parametrize("name", list(CASES))
def test_exact_fakes_pass(contexts, name, backend) -> None:
    r = check_backend(contexts[name], backend())
    assert r.status is Status.PASS, r.reason
    bw = r.extra["backward"]
    want = {"dq", "dk", "dv"} | ({"dsinks"} if CASES[name].sinks else set())
    assert set(bw["tensors"]) == want
    assert all(0 <= s["error_ratio"] <= 1 and not s["failed"] for s in bw["tensors"].values())
    assert bw["deterministic"] == {"requested": CASES[name].deterministic, "equal": True, "differs": []}


@pytest.mark.parametrize(
    "backend, name, tensor",
    [
        (GqaDkFirstHeadBackend, "plain", "dk"),
        (GqaDkFirstHeadBackend, "mqa_dv", "dk"),
        (SoftcapDerivativeMissingBackend, "softcap", "dq"),
        (CausalDsUnmaskedBackend, "plain", "dq"),
        (WrongRowLseBackend, "plain", "dq"),
        (WrongRowLseBackend, "sinks_alibi_fp16", "dq"),
        (NanGradBackend, "plain", "dv"),
    ],
)
def test_planted_gradient_bug_fails(contexts, backend, name, tensor) -> None:
    r = check_backend(contexts[name], backend())
    assert r.status is Status.FAIL
    assert f"backward {tensor}: " in r.reason
    assert r.extra["backward"]["tensors"][tensor]["failed"]
    assert r.stats is not None and not r.stats.failed_checks, "the forward is right: only the gradients fail"


def test_nan_gradient_is_counted_and_fails_closed(contexts) -> None:
    r = check_backend(contexts["plain"], NanGradBackend())
    dv = r.extra["backward"]["tensors"]["dv"]
    assert dv["nonfinite"] == 1 and "nonfinite" in dv["failed"] and math.isinf(dv["error_ratio"])
    assert "NaN/Inf gradients where the reference is finite, first at (key 0, kv head 0, dim 0)" in r.reason


def test_bug_invisible_without_its_feature(contexts) -> None:
    """The soft-cap derivative bug needs a soft-cap: on a plain case the same backend passes."""
    assert check_backend(contexts["plain"], SoftcapDerivativeMissingBackend()).status is Status.PASS


def test_nondeterministic_backward_fails_only_when_deterministic_is_asked(contexts) -> None:
    r = check_backend(contexts["deterministic"], NondeterministicBackend())
    assert r.status is Status.FAIL
    assert "backward deterministic: two runs of the deterministic backward differ bitwise in dq" in r.reason
    plain = check_backend(contexts["plain"], NondeterministicBackend())
    assert plain.status is Status.PASS
    assert plain.extra["backward"]["deterministic"] == {"requested": False, "equal": False, "differs": ["dq"]}


class NoDeterministic(FlashStyleBackend):
    name = "fake-bwd-no-det"
    accepts = frozenset({"backward"})


def test_refusals_name_the_feature(contexts) -> None:
    r = check_backend(contexts["plain"], ExactBackend())
    assert r.status is Status.UNSUPPORTED and r.reason.startswith("backward: ")
    r = check_backend(contexts["deterministic"], NoDeterministic())
    assert r.status is Status.UNSUPPORTED and r.reason.startswith("bwd_deterministic: ")
    assert check_backend(contexts["plain"], NoDeterministic()).status is Status.PASS


class WrongType(FlashStyleBackend):
    name = "fake-bwd-wrong-type"

    def prepare_backward(self, case, inputs):
        return lambda: self.grads(case, inputs).dq


def test_a_callable_returning_no_gradoutput_is_an_error(contexts) -> None:
    r = check_backend(contexts["plain"], WrongType())
    assert r.status is Status.ERROR and "must return GradOutput" in r.reason


class SinksAsList(FlashStyleBackend):
    name = "fake-bwd-sinks-list"

    def grads(self, case, inputs):
        g = super().grads(case, inputs)
        return dataclasses.replace(g, dsinks=g.dsinks.tolist())


class NoDq(FlashStyleBackend):
    name = "fake-bwd-no-dq"

    def grads(self, case, inputs):
        return dataclasses.replace(super().grads(case, inputs), dq=None)


def test_gradients_that_cannot_be_judged_fail_or_error(contexts, monkeypatch) -> None:
    r = check_backend(contexts["sinks_alibi_fp16"], SinksAsList())
    assert r.status is Status.ERROR and "GradOutput.dsinks must be a torch.Tensor or None, got list" in r.reason
    r = check_backend(contexts["plain"], NoDq())
    assert r.status is Status.ERROR and "GradOutput.dq must be a torch.Tensor, got NoneType" in r.reason

    def broken(*args, **kwargs):
        raise RuntimeError("reference out of memory\nsecond line")

    monkeypatch.setattr("conformance.backward.composition.gradients", broken)
    r = check_backend(contexts["plain"], FlashStyleBackend())
    assert r.status is Status.FAIL
    assert r.reason == "backward: the gradients could not be judged: RuntimeError: reference out of memory"


class AliasingNondeterministic(NondeterministicBackend):
    """Writes every run's dQ into one buffer, as an adapter reusing its gradient buffers would."""

    name = "fake-bwd-aliasing"

    def grads(self, case, inputs):
        g = super().grads(case, inputs)
        if not hasattr(self, "buf"):
            self.buf = g.dq.clone()
        self.buf.copy_(g.dq)
        return dataclasses.replace(g, dq=self.buf)


def test_a_reused_gradient_buffer_does_not_hide_nondeterminism(contexts) -> None:
    r = check_backend(contexts["deterministic"], AliasingNondeterministic())
    assert r.status is Status.FAIL and "differ bitwise in dq" in r.reason
