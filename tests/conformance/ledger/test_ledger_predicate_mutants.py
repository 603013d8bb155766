"""Ledger predicates at the edges the mutation runs found unpinned: ordered ops on float fields, a bool that never
equals a number, one feature given as a string, the refusal of a feature list that is empty or holds a non-string
(naming ``features`` or ``no_features``), the float type check, the order conditions are tested in (cheap fields
first, so an expensive one is computed only when the rest held) and the pre-releases of a ``versions`` set.

Each test names the mutants of ``conformance.ledger.predicate`` it kills (``mutmut show NAME`` prints one)."""

from __future__ import annotations

import re

import pytest
from packaging.version import Version

from conformance.cases.case import AttentionCase
from conformance.ledger.fields import FIELDS, CaseView, Field
from conformance.ledger.predicate import Condition, parse_predicate, parse_versions


def case(**kw) -> AttentionCase:
    kw.setdefault("requests", ((4, 4),))
    kw.setdefault("num_heads", 2)
    kw.setdefault("num_kv_heads", 2)
    kw.setdefault("head_dim", 64)
    return AttentionCase(**kw)


def holds(when: dict, c: AttentionCase) -> bool:
    return parse_predicate("w", when).holds(CaseView(c))


def test_ordered_ops_take_float_fields():
    """``lt`` / ``le`` / ``gt`` / ``ge`` need a numeric field: int or float, so a float field (``scale``,
    ``softcap``) takes them, with an int or a float bound; a None value fails them."""
    # kills x__condition__mutmut_9 and _10 ("float" misspelt: the float fields refused)
    assert holds({"scale": {"lt": 0.5}}, case(scale=0.25)) is True
    assert holds({"scale": {"lt": 0.5}}, case(scale=0.5)) is False
    assert holds({"scale": {"lt": 0.5}}, case()) is False  # None: the kernel's default
    assert holds({"softcap": {"ge": 30, "le": 30.0}}, case(softcap=30.0)) is True
    assert holds({"softcap": {"gt": 30}}, case(softcap=30.0)) is False


@pytest.mark.parametrize(
    ("op", "expected", "actual"),
    [("eq", 1, True), ("eq", 0, False), ("eq", True, 1), ("eq", 1.0, True), ("any", (0, 1), True), ("in", (1,), True)],
)
def test_a_bool_never_equals_a_number(op, expected, actual):
    """``True == 1`` in Python, not in a predicate: a bool value equals only a bool, a number only a number, so a
    ``not`` / ``not_in`` of the other kind holds."""
    # kills x__equal__mutmut_1 (`and` for `or`: a bool compared with a number by ==)
    assert Condition("f", op, expected).holds(actual) is False
    negated = {"eq": "not", "any": "not_in", "in": "not_in"}[op]
    assert Condition("f", negated, expected).holds(actual) is True
    assert Condition("f", op, expected).holds(None) is False
    assert Condition("f", "eq", actual).holds(actual) is True  # a value of the same kind equals


def test_one_feature_may_be_given_as_a_string():
    """``features = "paged"`` is the list ``["paged"]``, for ``no_features`` too."""
    # kills x__features__mutmut_2 (the string refused as not a list)
    (when,) = parse_predicate("w", {"features": "paged", "no_features": "causal"}).whens
    assert when.features == ("paged",) and when.no_features == ("causal",)
    paged = case(kv_layout="NHD", block_size=16)
    assert holds({"features": "paged"}, paged) is True and holds({"features": "paged"}, case()) is False
    assert holds({"no_features": "causal"}, paged) is True
    assert holds({"no_features": "causal"}, paged.replace(causal=True)) is False


@pytest.mark.parametrize("key", ["features", "no_features"])
@pytest.mark.parametrize("raw", [[], ["paged", 3], [None], 3, {"paged": True}, None])
def test_a_feature_list_that_is_empty_or_holds_a_non_string_is_refused_by_its_key(key, raw):
    """An empty list, a list with a non-string, or neither a string nor a list: one line naming the key (``features``
    or ``no_features``) and the value, before any feature name is looked up."""
    # kills x__features__mutmut_4 and _5 (`and` for an `or`: [] accepted, ["paged", 3] read as an unknown feature,
    # 3 iterated), x__when__mutmut_13 and _23 (the key named None)
    message = f"w.when: {key!r} must be a non-empty list of feature names, got {raw!r}"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        parse_predicate("w", {key: raw})


@pytest.mark.parametrize("value", ["0.5", True, False, [0.5, "x"]])
def test_a_float_field_takes_numbers_only(value):
    """A float field takes an int or a float, not a string or a bool (a bool is an int in Python)."""
    # kills x__type_ok__mutmut_12 (`or` for `and`: any non-bool value, and every bool, accepted)
    bad = value[1] if isinstance(value, list) else value
    with pytest.raises(ValueError, match=f"^{re.escape(f'w.when: scale: expected a float value, got {bad!r}')}$"):
        parse_predicate("w", {"scale": value})
    assert parse_predicate("w", {"scale": [1, 0.5]}).holds(CaseView(case(scale=1.0)))


EXPENSIVE = ("fa3_window_unmasked_rows", "rows_with_keys")


def test_cheap_conditions_are_tested_first_and_the_window_schedule_last(monkeypatch):
    """Conditions are tested cheapest first, whatever the table's order: the case's own fields, then the values
    derived per query row, the fork's window schedule last; a derived value is not computed when a cheaper condition
    failed."""
    # kills x__when__mutmut_43 (every cost the same: the table's order) and _47 (the case's own fields at the cost of
    # the per-row values: a tie, kept in the table's order)
    when = {"fa3_window_unmasked_rows": 0, "rows_with_keys": 4, "head_dim": 80}
    (w,) = parse_predicate("w", when).whens
    assert [c.field for c in w.conditions] == ["head_dim", "rows_with_keys", "fa3_window_unmasked_rows"]
    assert w.text() == "head_dim = 80 and rows_with_keys = 4 and fa3_window_unmasked_rows = 0"
    computed = []

    def counted(name):
        get = FIELDS[name].get
        return lambda c: computed.append(name) or get(c)

    for name in EXPENSIVE:
        f = FIELDS[name]
        monkeypatch.setitem(FIELDS, name, Field(f.kind, f.help, counted(name), f.nullable))
    assert w.holds(CaseView(case())) is False and computed == []  # head_dim 64: nothing derived
    assert w.holds(CaseView(case(head_dim=80, requests=((4, 2),), causal=True))) is False
    assert computed == ["rows_with_keys"]  # 2 rows see keys: the window schedule not computed
    assert w.holds(CaseView(case(head_dim=80))) is True
    assert computed == ["rows_with_keys", "rows_with_keys", "fa3_window_unmasked_rows"]


def test_a_versions_set_includes_pre_releases_whatever_packaging_defaults_to():
    """``versions`` is a specifier set that includes pre-releases itself (``prereleases`` True), so ``in`` and
    ``contains`` take them on every packaging version (packaging before 26 leaves them out by default)."""
    # kills x_parse_versions__mutmut_6, _8 (prereleases None: packaging's default) and _9 (False)
    spec = parse_versions("w", ">=2.8")
    assert spec.prereleases is True
    assert Version("2.9.0b1") in spec and spec.contains("2.9.0rc1") and "2.8.0a1" not in spec
    assert list(spec.filter(["2.7", "2.9.0b1", "2.9"])) == ["2.9.0b1", "2.9"]


@pytest.mark.parametrize(
    ("when", "message"),
    [
        ({"head_dim": {}}, "w.when: head_dim: an empty table of ops"),
        (3, "w.when: 'when' must be a table or an array of tables, got 3"),
        ([{"head_dim": 8}, "x"], "w.when[1]: 'when' must be a table or an array of tables, got 'x'"),
    ],
)
def test_an_empty_table_of_ops_or_a_when_that_is_no_table_is_refused_in_one_line(when, message):
    """The exact refusal, naming the entry, its ``when`` (by index when there are several) and the field: these lines
    were pinned only by test_bad_input's fuzzing of whole ledger entries ("kern.toml" in the message)."""
    # kills x__condition__mutmut_23 and x__when__mutmut_2 (the message None) on every run, not by chance
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        parse_predicate("w", when)
