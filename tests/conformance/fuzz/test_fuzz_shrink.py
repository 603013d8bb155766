"""The shrinker: every move is valid and simpler, planted bugs shrink to tiny cases that still fail the same way,
and the budget, deadline and admissibility bounds hold (evaluated in-process: no worker needed)."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.cases.case import AttentionCase
from conformance.fuzz.draw import DrawLimits, draw
from conformance.fuzz.shrink import _smaller, candidates, complexity, failure_kind, same_failure, shrink
from conformance.records import CheckResult, ErrorStats, Status
from conformance.verdict.check import check_backend, prepare_context
from tests.conformance.fakes import (
    ExactBackend,
    GqaHeadMappingBackend,
    PagedBlockBoundaryBackend,
    WindowOffByOneBackend,
)


def evaluator(backend_cls):
    backend = backend_cls()
    calls: list[AttentionCase] = []

    def evaluate(case: AttentionCase) -> CheckResult:
        calls.append(case)
        return check_backend(prepare_context(case, seed=0), backend)

    evaluate.calls = calls  # type: ignore[attr-defined]
    return evaluate


def record(status: Status, reason: str = "", failed: tuple[str, ...] = ()) -> CheckResult:
    stats = None
    if failed:
        stats = ErrorStats(1.0, 1.0, 1.0, (0, 0, 0), 1.0, 9.0, 0.0, 0.0, 0.1, 0.5, failed_checks=failed)
    return CheckResult("c", "b", "f", status, {"requests": [[1, 1]]}, reason=reason, stats=stats)


drawn_cases = st.builds(
    lambda seed, index: draw(seed, index, DrawLimits(max_tokens=256)).case,
    st.integers(0, 2**32),
    st.integers(0, 10**6),
).filter(lambda c: c is not None)


@settings(max_examples=60)
@given(case=drawn_cases)
def test_every_candidate_is_a_valid_strictly_simpler_case(case):
    size = complexity(case)
    labels = set()
    for label, cand in candidates(case):
        assert isinstance(cand, AttentionCase) and cand != case
        assert complexity(cand) < size, label
        assert cand.batch <= case.batch and cand.num_heads <= case.num_heads
        labels.add(label)
    assert labels  # every drawn case can be simplified somehow (the floor case is never drawn)


def test_smaller_values_lead_with_the_floor_and_end_next_to_x():
    assert _smaller(100, 0) == [0, 50, 75, 88, 94, 97, 99]
    assert _smaller(80, 8, 8) == [8, 48, 64, 72]
    assert _smaller(5, 5) == [] and _smaller(1, 0) == [0]


def test_failure_kinds():
    assert failure_kind(record(Status.PASS)) == "" and failure_kind(record(Status.UNSUPPORTED, "x")) == ""
    assert failure_kind(record(Status.FAIL, "max_error: ...", ("max_error",))) == "fail"
    assert failure_kind(record(Status.FAIL, "shape: out (1, 2) != reference")) == "fail:shape"
    assert failure_kind(record(Status.ERROR, "RuntimeError: boom")) == "error:RuntimeError"
    assert (
        failure_kind(record(Status.ERROR, "harness error (inputs or reference), not the kernel: x")) == "error:harness"
    )
    assert failure_kind(record(Status.CRASH, "worker killed by SIGABRT (exit status -6)\ntail")) == "crash:SIGABRT"
    assert failure_kind(record(Status.TIMEOUT, "no reply within 3 s")) == "timeout"
    lse = record(Status.FAIL, "lse: ...", ("lse",))
    both = record(Status.FAIL, "max_error | lse", ("max_error", "lse"))
    assert same_failure(both, lse) and not same_failure(lse, record(Status.FAIL, "x", ("max_error",)))
    assert not same_failure(record(Status.ERROR, "RuntimeError: a"), record(Status.ERROR, "ValueError: a"))
    assert not same_failure(both, record(Status.PASS))


def test_window_off_by_one_shrinks_to_one_request_one_head_and_still_fails():
    case = AttentionCase(
        requests=((37, 120), (1, 97), (64, 64), (5, 0)),
        num_heads=8,
        num_kv_heads=4,
        head_dim=96,
        dtype="fp16",
        kv_layout="HND",
        block_size=16,
        causal=True,
        window=(45, None),
        softcap=20.0,
        sinks=True,
    )
    evaluate = evaluator(WindowOffByOneBackend)
    first = evaluate(case)
    assert first.status is Status.FAIL
    res = shrink(case, first, evaluate, max_steps=300)
    m = res.case
    assert res.complete and res.result.status is Status.FAIL and same_failure(first, res.result)
    assert m.batch == 1 and m.num_heads == 1 and not m.paged and m.softcap is None and not m.sinks
    assert m.has_window and m.head_dim <= 8 and m.total_kv <= 3 and m.total_q == 1
    assert res.steps and res.tried == len(evaluate.calls) - 1
    assert evaluate(m).status is Status.FAIL  # the minimal case fails on its own


def test_gqa_mapping_bug_keeps_gqa_while_everything_else_goes():
    case = AttentionCase(
        requests=((20, 20), (1, 50)), num_heads=24, num_kv_heads=6, head_dim=64, causal=True, alibi=True
    )
    evaluate = evaluator(GqaHeadMappingBackend)
    res = shrink(case, evaluate(case), evaluate, max_steps=300)
    m = res.case
    assert res.complete and (m.num_heads, m.num_kv_heads) in ((4, 2), (6, 2), (6, 3)) and m.batch == 1
    assert not m.alibi and not m.causal and m.total_q == 1
    again = evaluator(GqaHeadMappingBackend)
    assert shrink(case, again(case), again, max_steps=300).steps == res.steps  # deterministic


def test_paged_block_boundary_keeps_paging_and_one_block_boundary():
    case = AttentionCase(
        requests=((3, 90),), num_heads=4, num_kv_heads=2, head_dim=64, kv_layout="HND", block_size=32, causal=True
    )
    evaluate = evaluator(PagedBlockBoundaryBackend)
    res = shrink(case, evaluate(case), evaluate, max_steps=300)
    m = res.case
    assert m.kv_layout == "NHD" and m.block_size is not None and m.total_kv == m.block_size + 1
    assert m.num_heads == 1 and m.total_q == 1


def test_budget_deadline_and_admissibility_bound_the_search():
    case = AttentionCase(requests=((9, 40), (1, 30)), num_heads=4, num_kv_heads=2, head_dim=64, window=(5, 0))
    evaluate = evaluator(WindowOffByOneBackend)
    first = evaluate(case)
    cut = shrink(case, first, evaluate, max_steps=3)
    assert not cut.complete and cut.tried == 3
    late = shrink(case, first, evaluate, deadline=time.monotonic() - 1)
    assert not late.complete and late.tried == 0 and late.case == case
    ev2 = evaluator(WindowOffByOneBackend)
    res = shrink(case, first, ev2, admissible=lambda c: c.num_heads >= 4)
    assert res.case.num_heads >= 4 and all(c.num_heads >= 4 for c in ev2.calls)
    with pytest.raises(ValueError, match="must be a failure"):
        shrink(case, evaluator(ExactBackend)(case), evaluate)
