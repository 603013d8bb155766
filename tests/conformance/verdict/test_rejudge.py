"""A record judged again from its own statistics (:func:`conformance.verdict.compare.failed_by_statistics`): the
rule the comparison applies, and every committed GPU run's records judged again on CPU (issue 27's done-when:
the verdicts are the same after the code moved)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from conformance.records import ErrorStats
from conformance.results_file import load_results
from conformance.verdict.compare import STATISTICS_CHECKS, failed_by_statistics
from conformance.verdict.tolerance import FIELDS, Tolerance

TOL = Tolerance(max_mismatch_frac=0.0, mean_factor=2.0, mean_atol=1e-4, min_cosine=0.999)
OK = ErrorStats(
    max_abs=1e-3,
    max_rel=1e-2,
    mean_abs=1e-4,
    worst=(0, 0, 0),
    mismatch_frac=0.0,
    error_ratio=0.5,
    baseline_max_abs=1e-3,
    baseline_mean_abs=1e-4,
    allowed_max_abs=2e-3,
    cosine=0.9999,
)


def test_each_statistics_check_at_its_edge() -> None:
    assert failed_by_statistics(OK, TOL) == ()
    bound = 2.0 * 1e-4 + 1e-4  # mean_factor x the baseline's mean + mean_atol
    assert failed_by_statistics(dataclasses.replace(OK, mean_abs=bound), TOL) == ()  # exactly the bound: passes
    assert failed_by_statistics(dataclasses.replace(OK, mean_abs=math.nextafter(bound, 1)), TOL) == ("mean_error",)
    assert failed_by_statistics(dataclasses.replace(OK, mean_abs=math.nan), TOL) == ("mean_error",)
    assert failed_by_statistics(dataclasses.replace(OK, mismatch_frac=1e-6), TOL) == ("max_error",)
    assert failed_by_statistics(dataclasses.replace(OK, cosine=0.999), TOL) == ()
    assert failed_by_statistics(dataclasses.replace(OK, cosine=0.998), TOL) == ("cosine",)
    assert failed_by_statistics(dataclasses.replace(OK, cosine=math.nan), TOL) == ()  # judged by nonfinite
    every = dataclasses.replace(OK, nonfinite=3, mismatch_frac=0.5, mean_abs=1.0, cosine=0.5)
    assert failed_by_statistics(every, TOL) == STATISTICS_CHECKS  # in CHECKS' order
    with pytest.raises(ValueError, match="mean_atol, min_cosine"):
        failed_by_statistics(OK, Tolerance(max_mismatch_frac=0.0, mean_factor=2.0))


@pytest.mark.slow
def test_every_committed_gpu_record_judged_again_on_cpu() -> None:
    """Every record of the committed GPU runs and fuzz campaigns that has statistics (53,102 on 2026-11-28, 2,308 of
    them failing a statistics check) gets back, from its statistics and the tolerance it names, exactly the
    statistics checks it failed; no record marked pass failed any check (5 s on 2 cores)."""
    files = sorted((Path(__file__).resolve().parents[3] / "reports").rglob("*.jsonl.gz"))
    if len(files) < 56:
        pytest.skip("the committed GPU runs are not in this checkout")
    judged = failing = 0
    wrong = []
    for path in files:
        for r in load_results(path, allow_skipped=True, need_header=False, drop_duplicates=True).results:
            if r.stats is None:
                continue
            tol = r.extra["tolerance"]  # every record with statistics names its tolerance
            got = failed_by_statistics(r.stats, Tolerance(**{k: tol[k] for k in FIELDS if k in tol}))
            recorded = tuple(c for c in r.stats.failed_checks if c in STATISTICS_CHECKS)
            judged += 1
            failing += bool(got)
            if got != recorded or (r.status.value == "pass" and r.stats.failed_checks):
                wrong.append((path.name, r.case_id, r.backend, r.status.value, got, r.stats.failed_checks))
    assert wrong == []
    assert judged >= 53_102 and failing >= 2_308  # nothing left unread: a file or record skipped fails here
