"""The tolerance tables, their layering, and the --tol / TOML override spellings."""

from __future__ import annotations


import pytest

from conformance.verdict import tolerance
from conformance.cases.case import DTYPES, AttentionCase
from conformance.verdict.tolerance import DTYPE_DEFAULTS, Tolerance, layers, load_toml, parse_override, resolve

PLAIN = AttentionCase(requests=((8, 8),), num_heads=2, num_kv_heads=2, head_dim=16, causal=True)
SOFTCAP = PLAIN.replace(softcap=30.0)
PAGED_FP16 = PLAIN.replace(dtype="fp16", kv_layout="NHD", block_size=4)


def test_every_dtype_has_complete_defaults():
    assert set(DTYPE_DEFAULTS) == set(DTYPES)
    for dtype, tol in DTYPE_DEFAULTS.items():
        assert tol.missing() == [], dtype
        # the dtype's rounding noise orders the defaults: coarser dtypes allow more
    assert DTYPE_DEFAULTS["bf16"].atol > DTYPE_DEFAULTS["fp16"].atol > DTYPE_DEFAULTS["fp32"].atol


def test_plain_case_resolves_to_dtype_default():
    assert resolve(PLAIN, "fa2") == DTYPE_DEFAULTS["bf16"]
    assert [label for label, _ in layers(PLAIN, "fa2")] == ["dtype bf16"]


def test_feature_layers_apply_and_inherit():
    tol = resolve(SOFTCAP, "fa2")
    assert tol.factor == 3 and tol.lse_factor == 3
    assert tol.atol == DTYPE_DEFAULTS["bf16"].atol  # None in the feature layer inherits
    paged = resolve(PAGED_FP16, "fa2")
    assert paged.mean_factor == 1.5 and paged.factor == DTYPE_DEFAULTS["fp16"].factor
    assert paged.atol == DTYPE_DEFAULTS["fp16"].atol


def test_later_layers_win_and_none_inherits(monkeypatch):
    monkeypatch.setitem(tolerance.BACKEND_RULES, "fa2", Tolerance(factor=7, atol=0.5))
    monkeypatch.setattr(tolerance, "CASE_RULES", [("*_cap30*", Tolerance(factor=9)), ("mqa_*", Tolerance(factor=11))])
    assert resolve(PLAIN, "fa2").factor == 7  # backend over default
    tol = resolve(SOFTCAP, "fa2")
    assert (tol.factor, tol.atol) == (9, 0.5)  # case glob over backend over feature; atol inherited
    assert resolve(SOFTCAP, "fa4").factor == 9  # case layer applies to every backend
    tol = resolve(SOFTCAP, "fa2", [{"factor": 4}, {"factor": 5, "rtol": 0.01}, {"atol": 0.25}])
    assert (tol.factor, tol.rtol, tol.atol) == (5, 0.01, 0.25)
    labels = [label for label, _ in layers(SOFTCAP, "fa2", [{"backend": "fa2", "factor": 4}])]
    assert labels == ["dtype bf16", "feature softcap", "backend fa2", "case *_cap30*", "override 0 (backend=fa2)"]


@pytest.mark.parametrize(
    "scope, applies",
    [
        ({"dtype": "bf16"}, True),
        ({"dtype": "fp16"}, False),
        ({"feature": "softcap"}, True),
        ({"feature": "paged"}, False),
        ({"backend": "fa2"}, True),
        ({"backend": "fa4"}, False),
        ({"case": "*_cap30*"}, True),
        ({"case": "*_alibi*"}, False),
        ({"dtype": "bf16", "backend": "fa4"}, False),  # every scope key must match
    ],
)
def test_scoped_overrides(scope, applies):
    tol = resolve(SOFTCAP, "fa2", [{**scope, "factor": 42}])
    assert (tol.factor == 42) is applies


def test_override_keys_are_validated_even_out_of_scope():
    with pytest.raises(ValueError, match="fator"):
        resolve(PLAIN, "fa2", [{"backend": "other", "fator": 3}])


@pytest.mark.parametrize(
    "text, expected",
    [
        ("factor=4", {"factor": 4.0}),
        ("bf16.atol=0.01", {"dtype": "bf16", "atol": 0.01}),
        ("dtype:fp16.mean_factor=3", {"dtype": "fp16", "mean_factor": 3.0}),
        ("backend:fa2.factor=3", {"backend": "fa2", "factor": 3.0}),
        ("backend:my.pkg:Cls.factor=3", {"backend": "my.pkg:Cls", "factor": 3.0}),
        ("feature:paged.mean_factor=inf", {"feature": "paged", "mean_factor": float("inf")}),
        ("case:*cap30*.factor=5", {"case": "*cap30*", "factor": 5.0}),
        (" lse_atol = 1e-2", {"lse_atol": 0.01}),
    ],
)
def test_parse_override(text, expected):
    assert parse_override(text) == expected


@pytest.mark.parametrize(
    "text, message",
    [
        ("factor", "KEY=VALUE"),
        ("fator=4", "key must be one of"),
        ("factor=abc", "must be a number"),
        ("bf8.factor=2", "dtype scope"),
        ("feature:nope.factor=2", "feature scope"),
        ("gpu:x.factor=2", "scope must be"),
        ("factor=-1", "must be >= 0"),
        ("min_cosine=2", r"\[-1, 1\]"),
        ("max_mismatch_frac=1.5", r"\[0, 1\]"),
        ("factor=nan", "must be a number or None"),
    ],
)
def test_parse_override_rejects(text, message):
    with pytest.raises(ValueError, match=message):
        parse_override(text)


def test_tolerance_rejects_non_numbers():
    with pytest.raises(ValueError, match="factor"):
        Tolerance(factor=True)
    with pytest.raises(ValueError, match="atol"):
        Tolerance(atol="0.1")


def test_load_toml_layers_in_order(tmp_path):
    path = tmp_path / "tol.toml"
    path.write_text(
        '[case."*_cap30*"]\nfactor = 8\n'
        "[backend.fa2]\nfactor = 6\n"
        "[feature.softcap]\nfactor = 5\n"
        "[dtype.bf16]\nfactor = 4\natol = 0.02\n"
        "factor_note_is_not_a_key = 1\n"  # inside [dtype.bf16]: must be rejected below
    )
    with pytest.raises(ValueError, match="factor_note_is_not_a_key"):
        load_toml(path)
    path.write_text(
        "factor = 3\n"
        '[case."*_cap30*"]\nfactor = 8\n'
        "[backend.fa2]\nfactor = 6\n"
        "[feature.softcap]\nfactor = 5\n"
        "[dtype.bf16]\nfactor = 4\natol = 0.02\n"
    )
    overrides = load_toml(path)
    assert overrides == [
        {"factor": 3},
        {"dtype": "bf16", "factor": 4, "atol": 0.02},
        {"feature": "softcap", "factor": 5},
        {"backend": "fa2", "factor": 6},
        {"case": "*_cap30*", "factor": 8},
    ]
    assert resolve(SOFTCAP, "fa2", overrides).factor == 8  # the case table, written first, still wins
    assert resolve(PLAIN, "fa2", overrides).factor == 6
    assert resolve(PLAIN, "fa4", overrides).atol == 0.02
    assert resolve(PAGED_FP16, "fa4", overrides).factor == 3


def test_load_toml_rejects_unknown_tables(tmp_path):
    path = tmp_path / "tol.toml"
    path.write_text("[gpu.h100]\nfactor = 3\n")
    with pytest.raises(ValueError, match="tables must be among"):
        load_toml(path)
    path.write_text("[dtype.bf8]\nfactor = 3\n")
    with pytest.raises(ValueError, match="bf8"):
        load_toml(path)
