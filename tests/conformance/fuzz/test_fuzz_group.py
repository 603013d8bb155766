"""Grouping fuzz failures by the axis values their minimal cases share."""

from __future__ import annotations

from conformance.cases.case import AttentionCase
from conformance.fuzz.group import FLOOR_CASE, group_failures, label, signature
from conformance.records import CheckResult, ErrorStats, Status


def minimal(case: AttentionCase, backend: str, original: str, status=Status.FAIL, path=("a", "b")) -> CheckResult:
    stats = ErrorStats(1.0, 1.0, 1.0, (0, 0, 0), 1.0, 9.0, 0.0, 0.0, 0.1, 0.5, failed_checks=("max_error",))
    return CheckResult(
        case.id,
        backend,
        "fam",
        status,
        case.to_json(),
        reason="max_error: x" if status is Status.FAIL else "worker killed by SIGSEGV (exit status -11)",
        stats=stats if status is Status.FAIL else None,
        repro=f"attnconf run --case-json {case.id}",
        extra={"fuzz": {"role": "minimal", "original_id": original, "path": list(path)}},
    )


def test_the_floor_case_has_an_empty_signature_and_levels_that_differ_are_kept():
    assert signature(FLOOR_CASE) == {}
    assert label({}) == "the simplest case"
    case = AttentionCase(requests=((1, 2),), num_heads=1, num_kv_heads=1, head_dim=80, kv_layout="NHD", block_size=16)
    sig = signature(case)
    assert sig == {"batch": "decode", "dims": (80, 80), "layout": "NHD", "block_size": 16}
    assert label(sig) == "batch=decode x dims=80/80 x layout=NHD x block_size=16"


def test_failures_group_by_backend_kind_and_signature_largest_first():
    paged80 = [
        AttentionCase(requests=((1, n),), num_heads=1, num_kv_heads=1, head_dim=80, kv_layout="NHD", block_size=16)
        for n in (2, 3, 5)
    ]
    window = AttentionCase(requests=((1, 2),), num_heads=1, num_kv_heads=1, head_dim=8, window=(0, None))
    records = [minimal(c, "fa4", f"orig{i}") for i, c in enumerate(paged80)]
    records += [minimal(window, "fa4", "orig9"), minimal(window, "fa2", "orig10")]
    records.append(minimal(paged80[0], "fa4", "orig11", status=Status.CRASH))
    records.append(minimal(paged80[1], "fa4", "orig1", path=("a",)))  # a resumed shrink of orig1: replaces it
    records.append(
        CheckResult("x", "fa4", "fam", Status.FAIL, paged80[0].to_json(), extra={"fuzz": {"role": "original"}})
    )
    groups = group_failures(records)
    assert [(g.backend, g.kind, g.count) for g in groups] == [
        ("fa4", "fail", 3),
        ("fa2", "fail", 1),
        ("fa4", "crash:SIGSEGV", 1),
        ("fa4", "fail", 1),
    ]
    top = groups[0]
    assert top.label == "batch=decode x dims=80/80 x layout=NHD x block_size=16"
    assert top.representative.case_id == paged80[0].id  # the simplest member
    assert "fa4: batch=decode x dims=80/80 x layout=NHD x block_size=16 (3 failures, fail)" in top.text()
    assert groups[3].label == "batch=decode x mask=w64-inf"
