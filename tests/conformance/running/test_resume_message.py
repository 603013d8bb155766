"""How a refused ``--resume`` shows the option that differs (``outfile._show``): sorted-key JSON, at most 120
characters (mutmut survivors of the 2026-11-26 run)."""

from __future__ import annotations

import json

from conformance.running.outfile import _show


def test_a_differing_value_is_shown_as_sorted_json():
    assert _show({"tol_file": None, "tol": ["atol=1e-3"]}) == '{"tol": ["atol=1e-3"], "tol_file": null}'


def test_a_long_value_is_cut_to_120_characters_with_an_ellipsis():
    exact = "x" * 118  # json adds the two quotes: 120 characters, shown whole
    assert _show(exact) == json.dumps(exact) and len(_show(exact)) == 120
    long = "y" * 119  # 121 characters: the first 117 and "..."
    assert _show(long) == json.dumps(long)[:117] + "..." and len(_show(long)) == 120
