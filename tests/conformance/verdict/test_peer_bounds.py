"""The verdict as strict as flash-attention's own test rule on long bf16 decode (issue 31 item 8).

Before, a fixed ``atol`` (2^-8 for bf16) was added to every element's bound; on a 16k-key decode, whose outputs are
about 0.05, it was 6 times the baseline term and hid bugs flash-attention's ``test_flash_attn_kvcache`` rule
(``3 x max|out_pt - out_ref| + 1e-5``, v2.8.3) catches.  Now the constant term of an element is
``min(atol, atol_rel x |ref|)``: the element's own rounding in the case dtype (``atol_rel`` 2^-8 for bf16, 2^-11 for
fp16; ``inf`` for fp32, which keeps its fixed 1e-5).  Pinned here:

* planted bugs of the size of a 16k decode's rounding (the last key ignored, the P @ V accumulator kept in bf16;
  ``tests/conformance/fakes.py``) fail the max-error check, and passed the verdict with the fixed atol;
* the bug-free controls (the fp32 answer rounded once; a flash-style kernel's rounding, with and without key
  splits) pass the same case with a margin;
* on hand-built tensors: an exactly rounded output passes even with a baseline error of 0; a few roundings past it
  fail where the fixed atol let them pass; a fully masked row keeps ``atol`` (judged by ``masked_rows``); an
  infinite ``atol`` still switches the bound off; the record's ``allowed_max_abs`` and the failure text name the
  element's scaled term.

Measured margins and the grid: ``scripts/peer_bounds.py`` (``reports/detection-power/peer-bounds.md``).
"""

from __future__ import annotations

import dataclasses
import math
from functools import lru_cache

import pytest
import torch

from attnfast.base import KernelOutput
from attnref import AttnResult
from conformance.cases.case import AttentionCase
from conformance.records import Status
from conformance.verdict.check import CaseContext, check_backend, prepare_context
from conformance.verdict.compare import compare_details
from conformance.verdict.tolerance import DTYPE_DEFAULTS, parse_override, resolve
from tests.conformance import fakes

#: The fixed atol of every element: the verdict before issue 31 item 8.
FIXED_ATOL = ({"atol_rel": math.inf},)
DECODE_16K = AttentionCase(((1, 16384),), num_heads=8, num_kv_heads=1, head_dim=128, causal=True)


@lru_cache(maxsize=1)
def decode_16k() -> CaseContext:
    return prepare_context(DECODE_16K, seed=0)


def test_the_bf16_and_fp16_constant_term_is_the_elements_rounding():
    assert DTYPE_DEFAULTS["bf16"].atol_rel == DTYPE_DEFAULTS["bf16"].atol == 2**-8
    assert DTYPE_DEFAULTS["fp16"].atol_rel == DTYPE_DEFAULTS["fp16"].atol == 2**-11
    assert DTYPE_DEFAULTS["fp32"].atol_rel == math.inf


@pytest.mark.parametrize("bug", [fakes.LastKeyIgnoredBackend, fakes.PvAccumRoundedBackend])
def test_a_bug_of_a_long_decodes_rounding_size_fails(bug):
    ctx = decode_16k()
    result = check_backend(ctx, bug())
    assert result.status is Status.FAIL and "max_error" in result.stats.failed_checks, result.reason
    assert result.stats.error_ratio > 1.3
    assert "atol_rel 0.00391 x |ref|" in result.reason
    # the fixed atol passed it: this test fails if the verdict is loosened back
    before = check_backend(ctx, bug(), overrides=FIXED_ATOL)
    assert before.status is Status.PASS and before.stats.error_ratio < 0.3


@pytest.mark.parametrize("control", [fakes.ExactBackend, fakes.FlashStyleBackend, fakes.FlashSplitsBackend])
def test_the_bug_free_controls_pass_the_same_case(control):
    result = check_backend(decode_16k(), control())
    assert result.status is Status.PASS, result.reason
    assert result.stats.error_ratio < 0.4
    assert result.stats.allowed_max_abs < 1e-3 < 2**-8  # the bound is the baseline's scale, not the fixed atol


# ---------------------------------------------------------------- hand-built tensors
TOL = resolve(AttentionCase(((1, 4),), num_heads=2, num_kv_heads=2, head_dim=8), "fake")  # bf16 defaults


def small_outputs() -> AttnResult:
    """2 tokens, 2 heads, dim 8; outputs of magnitude 0.01-0.1 (a long decode's), row (1, 1) fully masked."""
    gen = torch.Generator().manual_seed(3)
    out = (torch.rand(2, 2, 8, generator=gen) * 0.09 + 0.01) * torch.sign(torch.randn(2, 2, 8, generator=gen))
    out[1, 1] = 0
    lse = torch.full((2, 2), 5.0)
    lse[1, 1] = -math.inf
    return AttnResult(out, lse)


def judge(ref: AttnResult, out: torch.Tensor, tol=TOL):
    """The verdict of ``out`` with a baseline equal to the reference (baseline error 0)."""
    return compare_details(ref, (ref.out.clone(), ref.lse.clone()), KernelOutput(out, ref.lse.clone()), tol)


def test_an_exactly_rounded_output_passes_with_an_exact_baseline():
    ref = small_outputs()
    stats, details, _ = judge(ref, ref.out.to(torch.bfloat16))
    assert stats.baseline_max_abs == 0 and stats.max_abs > 0 and details == []
    assert stats.error_ratio <= 1


def test_a_few_roundings_past_the_element_fail_where_the_fixed_atol_passed():
    ref = small_outputs()
    out = ref.out.clone()
    out[0, 1, 3] *= 1 + 4 * 2**-8  # 4 roundings of one element, under 2^-8
    stats, details, _ = judge(ref, out)
    assert stats.failed_checks == ("max_error",) and stats.worst == (0, 1, 3) and stats.error_ratio > 3
    assert stats.allowed_max_abs == pytest.approx(2**-8 * float(ref.out[0, 1, 3].abs()))
    assert "+ atol_rel 0.00391 x |ref| " in details[0]
    fixed = dataclasses.replace(TOL, atol_rel=math.inf)
    stats, details, _ = judge(ref, out, fixed)
    assert details == [] and stats.allowed_max_abs == 2**-8


def test_a_fully_masked_row_keeps_atol():
    ref = small_outputs()
    out = ref.out.clone()
    out[1, 1] = 0.5 * 2**-8  # under atol: neither max_error nor masked_rows fails
    assert judge(ref, out)[0].failed_checks == ()
    out[1, 1] = 2 * 2**-8
    assert {"max_error", "masked_rows"} <= set(judge(ref, out)[0].failed_checks)


def test_an_infinite_atol_still_switches_the_max_error_bound_off():
    ref = small_outputs()
    off = dataclasses.replace(TOL, atol=math.inf, mean_atol=math.inf, min_cosine=-1.0)
    stats, _, _ = judge(ref, ref.out + 1.0, off)
    assert "max_error" not in stats.failed_checks and stats.allowed_max_abs == math.inf


def test_an_atol_given_alone_is_fixed_on_every_element():
    case = AttentionCase(((1, 4),), num_heads=2, num_kv_heads=2, head_dim=8)
    assert resolve(case, "fake").atol_rel == 2**-8
    loose = resolve(case, "fake", [parse_override("bf16.atol=0.01")])  # loosens every element, as it did before
    assert (loose.atol, loose.atol_rel) == (0.01, math.inf)
    both = resolve(case, "fake", [{"atol": 0.01, "atol_rel": 2**-6}])
    assert (both.atol, both.atol_rel) == (0.01, 2**-6)
    fixed = resolve(case, "fake", [parse_override("atol_rel=inf")])
    assert (fixed.atol, fixed.atol_rel) == (2**-8, math.inf)
    later = resolve(case, "fake", [{"atol": 0.01}, {"atol_rel": 2**-8}])  # a later layer may scale it again
    assert (later.atol, later.atol_rel) == (0.01, 2**-8)
