"""Evidence for the FA2 ledger entry (flash-attention issue 895), recomputed on CPU from the committed
H200 run: every FA2-family failure of the ``sqgtsk`` batch is what FA2's own window normalisation
(:func:`attnfast._fa_common.fa2_kernel_window`) predicts, and every case it predicts right passed.

The third computation is the fp64 numpy oracle of ``tests/attnref/oracle.py`` (it imports nothing
from attnref) run once with the case's window and once with the window FA2 really applies:

* the oracle with the case's window agrees with the reference (the reference is right);
* the oracle with FA2's window is as far from the reference as the kernel was (the recorded
  ``max_abs`` and ``lse_max_abs``, to within the check's own allowance), exactly for the records
  that failed; for the records that passed, FA2's window changes nothing.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from attnfast._fa_common import fa2_kernel_window, fa2_window
from attnref import AttnOptions, window_from_fa2
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import make_inputs
from conformance.results_file import read_records
from conformance.verdict.reference import case_options, reference
from tests.attnref.oracle import options_kwargs, oracle_batch

RUN = Path(__file__).resolve().parents[2] / "reports" / "h200-2026-11-21" / "default-h200.jsonl.gz"
FA2_FAMILY = ("fa2", "torch-flash")


def _sqgtsk_records():
    if not RUN.exists():
        pytest.skip(f"{RUN} is not in this checkout")
    _, results = read_records(RUN)
    picked = [
        r for r in results if r.backend in FA2_FAMILY and "_sqgtsk_" in r.case_id and r.status.value in ("pass", "fail")
    ]
    assert picked, f"no sqgtsk records of {FA2_FAMILY} in {RUN}"
    return picked


def _oracle(case: AttentionCase, inputs, options: AttnOptions):
    """The fp64 oracle of every request of ``case`` under ``options`` (varlen layout)."""
    qs = inputs.q.split(case.q_lens)
    ks = [inputs.k_of(b) for b in range(case.batch)]
    vs = [inputs.v_of(b) for b in range(case.batch)]
    return oracle_batch(qs, ks, vs, **options_kwargs(options))


def _fa2_options(case: AttentionCase) -> AttnOptions:
    """The case's options with the window FA2 really applies (its normalisation against max_seqlen_k)."""
    window = window_from_fa2(*fa2_kernel_window(case.causal, fa2_window(case), max(case.kv_lens)))
    return dataclasses.replace(case_options(case), window=window)


def _gap(a, b) -> float:
    """max |a - b| in fp64, with equal infinities (rows that see no key: LSE -inf) counted as 0."""
    a, b = a.double(), b.double()
    same = a == b
    return float(torch.where(same, torch.zeros_like(a), (a - b).abs()).max())


def test_fa2_family_sqgtsk_failures_are_the_window_clamp():
    records = _sqgtsk_records()
    failed = 0
    for rec in records:
        case = AttentionCase.from_json(rec.case)
        inputs = make_inputs(case, seed=rec.seed, device="cpu")
        ref = reference(case, inputs)
        out_ok, lse_ok = _oracle(case, inputs, case_options(case))
        assert _gap(out_ok, ref.out) < 1e-5, rec.case_id
        assert _gap(lse_ok, ref.lse) < 1e-5, rec.case_id

        out_fa2, lse_fa2 = _oracle(case, inputs, _fa2_options(case))
        out_gap, lse_gap = _gap(out_fa2, ref.out), _gap(lse_fa2, ref.lse)
        stats = rec.stats
        if rec.status.value == "fail":
            failed += 1
            assert abs(out_gap - stats.max_abs) <= stats.allowed_max_abs, (rec.case_id, out_gap, stats)
            assert abs(lse_gap - stats.lse_max_abs) <= stats.lse_allowed, (rec.case_id, lse_gap, stats)
        else:
            assert out_gap < 1e-5 and lse_gap < 1e-5, (rec.case_id, rec.backend, out_gap, lse_gap)
    assert failed == 4, f"the committed run has 4 such failures (2 cases x fa2, torch-flash), found {failed}"
