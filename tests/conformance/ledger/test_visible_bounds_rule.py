"""The ledger's numpy spelling of the visibility rule (``conformance.ledger.fields._visible_bounds``, behind
``rows_without_keys``, ``keyless_query_tile``, ``fa3_keyless_m_block`` and the FA2 window fields) is the reference's
rule (:func:`attnref.row_bounds` with the case's options and its inputs' cp totals), on every request of drawn cases
with windows, chunks and context parallelism (issue 27 item 3: the duplicate kept while fields.py is under mutation
testing; this pins it to the reference until it calls it)."""

from __future__ import annotations

import numpy as np
import torch

from attnref import ContextParallel, row_bounds
from conformance.cases.inputs import cp_case_totals
from conformance.fuzz.draw import DrawLimits, draw
from conformance.ledger.fields import _visible_bounds
from conformance.verdict.reference import case_options


def test_the_ledgers_visible_bounds_are_the_reference_rule() -> None:
    limits = DrawLimits(max_tokens=256, max_heads=8)
    cases = [d.case for d in (draw(5, i, limits) for i in range(200)) if d.case is not None]
    assert sum(c.cp_world > 1 for c in cases) >= 4 and sum(c.chunk is not None for c in cases) >= 10
    assert sum(c.has_window for c in cases) >= 20
    for case in cases:
        options = case_options(case)
        totals = cp_case_totals(case) if case.cp_world > 1 else None
        for b, (sq, sk) in enumerate(case.requests):
            if totals is not None:
                options = options.with_(cp=ContextParallel(case.cp_world, case.cp_rank, totals[b]))
            lo, hi = row_bounds(torch.arange(sq), sq, sk, options)
            got_lo, got_hi = _visible_bounds(case, b)
            assert np.array_equal(got_lo, lo.numpy()) and np.array_equal(got_hi, hi.numpy()), (case.id, b)
