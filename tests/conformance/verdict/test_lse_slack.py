"""A kernel output's ``lse_slack`` (``attnfast.base``): added to its own rows' LSE bound and to nothing else, named in
the failure text, carried from a training call's forward to the verdict, and refused (``ValueError``, a harness
error) when it could do more than widen a bound by a finite amount.

Hand-built tensors with bounds exact in binary floating point (reference LSE 10, ``lse_atol`` 0.5, no baseline
error); the FA2 case that needs the slack is ``tests/attnfast/test_fa2_alibi_lse.py``.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from attnfast.base import GradOutput, KernelOutput
from attnref import AttnResult
from conformance.cases.case import AttentionCase
from conformance.records import Status
from conformance.verdict.check import check_backend, prepare_context
from conformance.verdict.compare import compare_details
from tests.conformance.backward.grad_fakes import FlashStyleBackend
from tests.conformance.verdict.test_compare_mutants import TOL


def lse_case(diffs: list[float], slack: list[float] | None):
    """One head, one token per diff: reference LSE 10 (baseline equal), kernel LSE 10 + diff, the given slack."""
    n = len(diffs)
    ref = AttnResult(torch.ones(n, 1, 2), torch.full((1, n), 10.0))
    kernel = KernelOutput(
        ref.out.clone(), ref.lse + torch.tensor([diffs]), None if slack is None else torch.tensor([slack])
    )
    return ref, (ref.out.clone(), ref.lse.clone()), kernel


def test_the_slack_widens_its_own_rows_only_and_inclusively() -> None:
    ref, base, kernel = lse_case([0.75, 0.75, 0.5], [0.25, 0.0, 0.0])  # 0.75 <= 0.5 + 0.25; 0.75 > 0.5 + 0
    stats, details, _ = compare_details(ref, base, kernel, TOL)
    assert stats.failed_checks == ("lse",)
    assert details == [
        "lse: |lse-ref| 7.5e-01 at (token 1, head 0) > allowed 5.0e-01 (2 x baseline 0.0e+00 + lse_atol 5.0e-01 "
        "+ lse_rtol 0 x |lse| 1.0e+01 + kernel lse_slack 0.0e+00); kernel 10.75 vs reference 10; 1 of 3 rows over"
    ]
    ref, base, kernel = lse_case([0.75, 0.5], [0.25, 0.0])
    stats, details, _ = compare_details(ref, base, kernel, TOL)
    assert details == [] and stats.lse_allowed == 0.75  # the worst row's bound, its slack included


def test_without_slack_the_text_and_bound_are_unchanged() -> None:
    ref, base, kernel = lse_case([0.75], None)
    _, details, _ = compare_details(ref, base, kernel, TOL)
    assert details[0].endswith("+ lse_rtol 0 x |lse| 1.0e+01); kernel 10.75 vs reference 10; 1 of 1 rows over")


def test_a_masked_row_still_needs_minus_inf_whatever_its_slack() -> None:
    ref, base, kernel = lse_case([0.0, 0.0], [100.0, 100.0])
    ref.out[0, 0] = 0.0
    ref.lse[0, 0] = -math.inf
    base = (ref.out.clone(), ref.lse.clone())
    lse = ref.lse.clone()
    lse[0, 0] = 10.0
    stats, details, _ = compare_details(ref, base, dataclasses.replace(kernel, out=ref.out.clone(), lse=lse), TOL)
    assert stats.failed_checks == ("masked_rows",) and "1 rows with reference LSE -inf" in details[0]


@pytest.mark.parametrize(
    ("slack", "message"),
    [
        (torch.zeros(1, 3), "kernel lse_slack must have the reference LSE's shape (1, 2), got (1, 3)"),
        (0.5, "kernel lse_slack must have the reference LSE's shape (1, 2), got float"),
        (torch.tensor([[0.0, math.nan]]), "kernel lse_slack must be finite and >= 0 on every row, 1 rows are not"),
        (torch.tensor([[math.inf, 0.0]]), "kernel lse_slack must be finite and >= 0 on every row, 1 rows are not"),
        (torch.tensor([[-0.25, -0.25]]), "kernel lse_slack must be finite and >= 0 on every row, 2 rows are not"),
    ],
)
def test_a_slack_that_could_hide_an_error_is_refused(slack, message) -> None:
    """A NaN slack would make the comparison with the bound false (a pass), an infinite one switch the bound off."""
    ref, base, kernel = lse_case([5.0, 0.0], None)
    with pytest.raises(ValueError) as exc:
        compare_details(ref, base, dataclasses.replace(kernel, lse_slack=slack), TOL)
    assert str(exc.value) == message


class SlackedForwardBackend(FlashStyleBackend):
    """The passing flash-style backward whose forward LSE is off by 0.25 on one row, declared as that row's slack."""

    name = "fake-bwd-slack"

    def grads(self, case, inputs) -> GradOutput:
        g = super().grads(case, inputs)
        slack = torch.zeros_like(g.lse)
        slack[1, 3] = 0.25
        return dataclasses.replace(g, lse=g.lse + slack, lse_slack=slack)


def test_a_training_calls_forward_carries_its_slack_to_the_verdict() -> None:
    case = AttentionCase(
        requests=((8, 8), (5, 9)), num_heads=2, num_kv_heads=1, head_dim=32, causal=True, backward=True
    )
    ctx = prepare_context(case, seed=0, device="cpu")
    r = check_backend(ctx, SlackedForwardBackend())
    assert r.status is Status.PASS, r.reason
    assert r.stats.lse_max_abs == pytest.approx(0.25, abs=1e-5)

    class Unslacked(SlackedForwardBackend):
        def grads(self, case, inputs) -> GradOutput:
            return dataclasses.replace(super().grads(case, inputs), lse_slack=None)

    r = check_backend(prepare_context(case, seed=0, device="cpu"), Unslacked())
    assert r.status is Status.FAIL and r.reason.startswith("lse: |lse-ref| 2.5e-01 at (token 3, head 1)")
