"""Promises of conformance/verdict/tolerance.py that test_tolerance.py left unchecked (mutmut found them:
docs "Mutation testing"): a tolerance file holds any subset of its layers, adds no empty layer, and names
the table at fault; ``--tol`` splits at the first ``=``; the built-in tables are checked at import."""

from __future__ import annotations

from pathlib import Path

import pytest

from conformance.cases.case import AttentionCase
from conformance.verdict import tolerance
from conformance.verdict.tolerance import DTYPE_DEFAULTS, Tolerance, layers, load_toml, parse_override


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "tol.toml"
    path.write_text(text)
    return path


def test_a_file_of_scoped_tables_only_adds_no_empty_everywhere_layer(tmp_path: Path) -> None:
    path = _write(tmp_path, "[dtype.bf16]\natol = 0.01\n")
    assert load_toml(path) == [{"dtype": "bf16", "atol": 0.01}]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("factor = 3\n", [{"factor": 3}]),  # no table at all
        ("[feature.softcap]\nfactor = 4\n", [{"feature": "softcap", "factor": 4}]),  # no dtype table
        ('[case."*cap30*"]\nfactor = 5\n', [{"case": "*cap30*", "factor": 5}]),  # only the last scope
    ],
)
def test_any_subset_of_the_scope_tables_loads(tmp_path: Path, text: str, expected: list[dict]) -> None:
    assert load_toml(_write(tmp_path, text)) == expected


def test_a_scope_entry_that_is_not_a_table_is_named(tmp_path: Path) -> None:
    path = _write(tmp_path, "[dtype]\nbf16 = 3\n")
    with pytest.raises(ValueError, match=r"tol\.toml: \[dtype\.bf16\] must be a table of tolerance fields, got 3"):
        load_toml(path)


def test_a_second_equals_sign_belongs_to_the_value(tmp_path: Path) -> None:
    """``--tol KEY=VALUE`` splits at the first ``=``: the error names the value that is not a number."""
    with pytest.raises(ValueError, match=r"--tol value must be a number, got '1=2' in 'factor=1=2'"):
        parse_override("factor=1=2")


def test_the_built_in_tables_pass_their_import_check() -> None:
    tolerance._check_tables()  # raises on an inconsistent table; the shipped ones are consistent


def test_a_dtype_without_defaults_fails_the_table_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tolerance, "DTYPE_DEFAULTS", {k: v for k, v in DTYPE_DEFAULTS.items() if k != "fp32"})
    with pytest.raises(RuntimeError, match=r"DTYPE_DEFAULTS must cover every case dtype \['bf16', 'fp16', 'fp32'\]"):
        tolerance._check_tables()


def test_incomplete_dtype_defaults_fail_the_table_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(tolerance.DTYPE_DEFAULTS, "fp32", Tolerance(factor=2))
    with pytest.raises(RuntimeError, match=r"DTYPE_DEFAULTS\[fp32\] leaves \['atol', 'rtol', .*\] unset"):
        tolerance._check_tables()


def test_a_feature_rule_for_an_unknown_feature_fails_the_table_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(tolerance.FEATURE_RULES, "no-such-feature", Tolerance(factor=3))
    with pytest.raises(RuntimeError, match=r"FEATURE_RULES names unknown features \{'no-such-feature'\}"):
        tolerance._check_tables()


def test_a_bad_tol_scope_lists_the_scope_spellings() -> None:
    with pytest.raises(
        ValueError,
        match=r"--tol scope must be a dtype or one of \['dtype:NAME', 'feature:NAME', 'backend:NAME', 'case:NAME'\], "
        r"got 'colour:red'",
    ):
        parse_override("colour:red.factor=2")


def test_override_layers_are_labelled_with_their_scope() -> None:
    """The labels say where each layer came from: an unscoped override by its index alone, a scoped one with
    every scope key, space-separated in SCOPES order."""
    case = AttentionCase(requests=((3, 5),), num_heads=2, num_kv_heads=1, head_dim=16, kv_layout="NHD", block_size=16)
    overrides = [{"factor": 3}, {"feature": "paged", "dtype": "bf16", "atol": 0.01}]
    labels = [label for label, _ in layers(case, "sdpa-cpu", overrides)]
    assert labels[-2:] == ["override 0", "override 1 (dtype=bf16 feature=paged)"]


@pytest.mark.parametrize(("field", "edge"), [("min_cosine", -1.0), ("min_cosine", 1.0), ("max_mismatch_frac", 1.0)])
def test_range_ends_are_accepted(field: str, edge: float) -> None:
    """The ranges are closed: min_cosine=1 asks for an exact direction, max_mismatch_frac=1 switches the check off."""
    assert getattr(Tolerance(**{field: edge}), field) == edge


def test_cosine_below_minus_one_is_refused() -> None:
    with pytest.raises(ValueError, match=r"tolerance min_cosine must be in \[-1, 1\], got -1\.5"):
        Tolerance(min_cosine=-1.5)
