"""Ledger fields at the edges the mutation run found unpinned: FA3's one-MMA-warpgroup rule at exactly 64 packed
query rows, the invariance kinds each switch field looks at (and False for every other case), and ``_own``, which
builds the fields of the case's own attributes.

``_own`` runs while ``FIELDS`` is built, at import: mutmut imports the tests before it picks a mutant, so a test can
tell a mutant of ``_own`` apart only by calling it.  The fields are read through ``FIELDS[name].get`` (what
:meth:`CaseView.value` calls), not through the cached :func:`case_view`."""

from __future__ import annotations

import pytest

from conformance.cases.case import AttentionCase
from conformance.reporting.ledger_fields import FIELDS, _own


def case(**kw) -> AttentionCase:
    kw.setdefault("num_heads", 1)
    kw.setdefault("num_kv_heads", 1)
    kw.setdefault("head_dim", 128)
    return AttentionCase(**kw)


def field(name: str, c: AttentionCase):
    return FIELDS[name].get(c)


@pytest.mark.parametrize(("heads", "rows"), [((1, 1), (64, 65)), ((8, 1), (8, 9)), ((32, 4), (8, 9))])
def test_one_mma_warpgroup_takes_up_to_64_packed_query_rows_and_not_65(heads, rows):
    """FA3's one-warpgroup rule is ``max_seqlen_q x group <= 64``: a batch invariance whose request 0 alone packs
    exactly 64 rows and whose batch packs more switches kernels; one whose calls pack 63 and 64 rows does not."""
    # kills x__fa3_one_mma_wg__mutmut_7 (< 64) and _8 (<= 65)
    h, hk = heads
    at, over = rows
    switch = case(requests=((at, 100), (over, 100)), num_heads=h, num_kv_heads=hk, invariance="batch")
    assert field("fa3_one_mma_wg_switch", switch) is True
    same_side = switch.replace(requests=((at - 1, 100), (at, 100)))
    assert field("fa3_one_mma_wg_switch", same_side) is False
    assert field("fa3_group_rows_switch", switch) is True and field("fa3_group_rows_switch", same_side) is False


def test_one_mma_warpgroup_switch_covers_a_growing_neighbour():
    """A neighbour invariance is judged too: request 0 alone (1 row) takes one warpgroup, beside a neighbour of 65
    queries it does not."""
    # kills x__fa3_one_mma_wg_switch__mutmut_4, _5 ("neighbour" misspelt: the neighbour kind falls through to False)
    grow = case(requests=((1, 300), (65, 300)), invariance="neighbour")
    assert field("fa3_one_mma_wg_switch", grow) is True
    assert field("fa3_one_mma_wg_switch", grow.replace(head_dim=64)) is False  # the rule is d128 only


def test_group_rows_switch_covers_a_batch_invariance():
    """The rows rule at any head dim judges a batch invariance: request 0 alone packs 8 x 8 = 64 rows, its batch
    9 x 8."""
    # kills x__fa3_group_rows_switch__mutmut_2, _3 ("batch" misspelt: the batch kind falls through to False)
    batch = case(requests=((8, 300), (9, 300)), num_heads=8, head_dim=64, invariance="batch")
    assert field("fa3_group_rows_switch", batch) is True
    assert field("fa3_group_rows_switch", batch.replace(requests=((7, 300), (8, 300)))) is False


@pytest.mark.parametrize("invariance", ["", "run", "splits"])
def test_switch_fields_are_false_outside_batch_and_neighbour_invariance(invariance):
    """Calls that switch kernels across an invariance's variants exist only for batch and neighbour invariances:
    any other case (requests that would switch under a batch invariance) reads False."""
    # kills x__fa3_one_mma_wg_switch__mutmut_6 and x__fa3_group_rows_switch__mutmut_6 (return True for them)
    c = case(requests=((64, 100), (65, 100)), invariance=invariance)
    assert field("fa3_one_mma_wg_switch", c) is False
    assert field("fa3_group_rows_switch", c) is False


def test_a_run_invariance_or_no_invariance_has_one_longest_q_len():
    """``invariance_max_q_len_varies`` is False for a case without invariance and for a run invariance (two equal
    calls), True where request 0 alone is shorter than its batch's longest query."""
    # kills x__invariance_max_q_len_varies__mutmut_2 (True without invariance) and _3 (>= 1: any invariance)
    c = case(requests=((1, 100), (9, 100)))
    assert field("invariance_max_q_len_varies", c) is False
    assert field("invariance_max_q_len_varies", c.replace(invariance="run")) is False
    assert field("invariance_max_q_len_varies", c.replace(invariance="batch")) is True


@pytest.mark.parametrize(
    ("name", "kind", "value"),
    [("head_dim", "int", 128), ("causal", "bool", True), ("dtype", "str", "fp16"), ("block_size", "int", 16)],
)
def test_own_field_reads_the_case_attribute_with_its_kind_and_help(name, kind, value):
    """``_own(name, kind, help)`` is the field reading ``case.<name>``, of the kind and help given, not nullable
    unless asked; ``nullable=True`` is kept."""
    # kills x__own__mutmut_1 .. _14 (each changes the kind, help, getter or nullable the Field gets)
    c = case(requests=((4, 20),), causal=True, dtype="fp16", kv_layout="NHD", block_size=16)
    f = _own(name, kind, f"the {name}")
    assert (f.kind, f.help, f.nullable) == (kind, f"the {name}", False)
    assert f.get(c) == value
    g = _own(name, kind, "h", True)
    assert g.nullable is True and g.get(c) == value
    assert _own(name, kind, "h", nullable=True).nullable is True
