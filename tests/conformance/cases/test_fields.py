"""The field table (conformance.cases.fields): one row per AttentionCase field, and what is generated from it equal
to what the hand-written code gave before the table (issue 27): the features, the id's parts, the shrinker's handled
fields and the ledger's own fields.  The pinned values below were computed from the code before the table."""

from __future__ import annotations

import dataclasses
import hashlib
import json

from conformance.cases.case import DTYPES, FEATURES, AttentionCase
from conformance.cases.fields import FIELD_SPECS, HEAD, SPEC, FieldSpec
from conformance.cases.space import AXES, FIELD_AXES
from conformance.fuzz.shrink import _HANDLED
from conformance.ledger.fields import FIELDS
from conformance.suites.registry import get_suite

#: The fuzzer's shrink passes' handled fields before the table (conformance/fuzz/shrink.py's literal list).
HANDLED_BEFORE = frozenset(
    "requests num_heads num_kv_heads head_dim head_dim_v dtype kv_layout block_size causal window softcap alibi sinks "
    "scale chunk append append_len append_lens num_splits quant quant_q descale qv v_padded scheduler_metadata engine "
    "scenario batch_name".split()
)
#: The ledger's names before the table, through the case's own fields and the scalars beside them: (name, kind,
#: nullable), in ``attnconf ledger fields`` order; then the SHA-256 of every name's (name, help), all 70 of them.
LEDGER_OWN_BEFORE = [
    ("num_heads", "int", False),
    ("num_kv_heads", "int", False),
    ("head_dim", "int", False),
    ("head_dim_v", "int", True),
    ("dtype", "str", False),
    ("kv_layout", "str", False),
    ("block_size", "int", True),
    ("causal", "bool", False),
    ("softcap", "float", True),
    ("alibi", "bool", False),
    ("sinks", "bool", False),
    ("scale", "float", True),
    ("chunk", "int", True),
    ("append", "bool", False),
    ("append_len", "int", True),
    ("append_uneven", "bool", False),
    ("min_new_kv_len", "int", False),
    ("max_new_kv_len", "int", False),
    ("num_splits", "int", True),
    ("quant", "str", False),
    ("quant_q", "bool", False),
    ("descale", "str", True),
    ("qv", "bool", False),
    ("v_padded", "bool", False),
    ("scheduler_metadata", "bool", False),
    ("cp_world", "int", False),
    ("cp_rank", "int", False),
    ("engine", "str", False),
    ("scenario", "str", False),
    ("graph_fill", "int", False),
    ("invariance", "str", False),
    ("backward", "bool", False),
    ("deterministic", "bool", False),
    ("data", "str", False),
    ("batch_name", "str", False),
    ("graph_replays", "int", False),
]
#: (2026-11-27, eleventh session: the two keyless-tile fields' help says they read every call of an invariance case)
LEDGER_HELP_BEFORE = (70, "e4892c1f3344047e86fae2c1ae2f418e96244b7c7f8f2f4782e590617d0f3031")
#: The fields with a part of their own in the id, in the order of the parts (after the id's head), before the table.
ID_PARTS_BEFORE = (
    "causal window chunk softcap alibi sinks scale append num_splits quant descale qv v_padded scheduler_metadata "
    "cp_world graph invariance backward data".split()
)
#: The case space's axes before the table: (name, levels, kernel axis) in order; the ones after a field are its row's.
AXES_BEFORE = [
    ("batch", 11, True),
    ("heads", 14, True),
    ("dims", 14, True),
    ("dtype", ("bf16", "fp16", "fp32"), True),
    ("layout", ("contiguous", "NHD", "HND"), True),
    ("block_size", (None, 1, 16, 32, 64, 128, 256), True),
    ("mask", ("none", "causal", "w0-0", "w16-0", "cw128", "w32-32", "w64-inf", "winf-16", "chunk64", "cchunk64"), True),
    ("quant", ("none", "fp8_e4m3", "fp8_e5m2", "int8_t1", "int8_t2"), True),
    ("softcap", (None, 30.0), False),
    ("alibi", (False, True), False),
    ("sinks", (False, True), False),
    ("append", (False, True, "short", "fp8"), False),
    ("num_splits", (None, 1, 3), False),
    ("scale", (None, 0.3), False),
    ("descale", (None, "tensor", "head", "token"), False),
    ("quant_q", (True, False), False),
    ("qv", (False, True), False),
    ("v_padded", (False, True), False),
    ("scheduler_metadata", (False, True), False),
    ("cp", ((1, 0), (2, 1)), False),
]
#: ``id features summary`` of every case of these suites and of UNEVEN, one a line: (lines, SHA-256) before the table.
FEATURES_SUITES = ("smoke", "default", "engines", "graphs", "training", "limits")
FEATURES_BEFORE = (6267, "6c79d242127d1b393dae218fa950dd99dc2776607a8f94fcb1c7bb87de85b222")
#: Uneven appends: no suite above has one (peer-fa3 does, ~25 s to walk).
UNEVEN = (
    AttentionCase(
        requests=((4, 10), (3, 3), (5, 9)), num_heads=4, num_kv_heads=2, head_dim=64, append=True, append_lens=(2, 0, 5)
    ),
    AttentionCase(
        requests=((4, 10), (3, 8)),
        num_heads=4,
        num_kv_heads=1,
        head_dim=64,
        append=True,
        append_lens=(4, 1),
        quant="fp8_e4m3",
        descale="head",
        kv_layout="HND",
        block_size=16,
    ),
    AttentionCase(
        requests=((4, 10), (3, 8)),
        num_heads=2,
        num_kv_heads=2,
        head_dim=64,
        append=True,
        append_len=2,
        quant="fp8_e5m2",
        quant_q=False,
    ),
)


def test_one_row_per_field_and_no_other() -> None:
    fields = [f.name for f in dataclasses.fields(AttentionCase)]
    rows = [s.name for s in FIELD_SPECS]
    assert len(rows) == len(set(rows)) == len(SPEC), "a field has two rows"
    assert set(fields) - set(rows) == set(), "a field of AttentionCase has no row in conformance/cases/fields.py"
    assert set(rows) - set(fields) == set(), "a row of conformance/cases/fields.py names no field of AttentionCase"


def test_every_feature_is_owned_by_one_row() -> None:
    owned = [f for s in FIELD_SPECS for f in s.features]
    assert len(owned) == len(set(owned)), "a feature is owned by two rows"
    assert set(owned) == set(FEATURES)
    for s in FIELD_SPECS:  # the default rule turns on one feature
        assert s.exercised is not None or len(s.features) <= 1, s.name


def test_every_field_is_spelled_in_the_id() -> None:
    for s in FIELD_SPECS:
        assert (s.token is None) == bool(s.spelled_by), f"{s.name}: a token or the row that spells it, not both"
        if s.spelled_by and s.spelled_by != HEAD:
            assert SPEC[s.spelled_by].token is not None, f"{s.name}: {s.spelled_by} has no token"
    assert [s.name for s in FIELD_SPECS if s.token is not None] == ID_PARTS_BEFORE


def test_a_ledger_field_has_a_scalar_annotation() -> None:
    ledger = {f.name for f in dataclasses.fields(AttentionCase) if SPEC[f.name].ledger}
    assert ledger <= set(FIELDS)
    tuples = {f.name for f in dataclasses.fields(AttentionCase) if str(f.type).startswith("tuple")}
    assert tuples == {f.name for f in dataclasses.fields(AttentionCase) if not SPEC[f.name].ledger}


def test_the_shrinkers_handled_fields_are_the_ones_before() -> None:
    assert _HANDLED == HANDLED_BEFORE


def test_the_ledger_fields_are_the_ones_before() -> None:
    names = list(FIELDS)
    own = [(n, FIELDS[n].kind, FIELDS[n].nullable) for n in names[: len(LEDGER_OWN_BEFORE)]]
    assert own == LEDGER_OWN_BEFORE
    helps = json.dumps([(n, f.help) for n, f in FIELDS.items()])
    assert (len(FIELDS), hashlib.sha256(helps.encode()).hexdigest()) == LEDGER_HELP_BEFORE


def test_features_and_summaries_are_the_ones_before() -> None:
    cases = [c for name in FEATURES_SUITES for c in get_suite(name)] + list(UNEVEN)
    lines = [f"{c.id} {','.join(sorted(c.features()))} {c.summary()}" for c in cases]
    assert (len(lines), hashlib.sha256("\n".join(lines).encode()).hexdigest()) == FEATURES_BEFORE
    assert {f for c in cases for f in c.features()} == set(FEATURES)  # every row's features are reached


def test_a_new_row_default_rule() -> None:
    row = FieldSpec("v_padded", "help", ("v_pad",), token="vpad")
    plain = UNEVEN[0]
    padded = AttentionCase(requests=((3, 3),), num_heads=2, num_kv_heads=2, head_dim=64, head_dim_v=32, v_padded=True)
    assert (list(row.features_of(plain)), row.token_of(plain)) == ([], None)
    assert (list(row.features_of(padded)), row.token_of(padded)) == (["v_pad"], "vpad")


def test_the_axes_are_the_ones_before() -> None:
    got = [
        (a.name, len(a.values) if a.name in ("batch", "heads", "dims") else a.values, a.kernel) for a in AXES.values()
    ]
    assert got == AXES_BEFORE
    plain = "dtype quant softcap alibi sinks num_splits scale descale quant_q qv v_padded scheduler_metadata"
    assert FIELD_AXES == tuple(plain.split())  # build passed these levels through, classify read these fields
    assert SPEC["dtype"].levels == tuple(DTYPES)
    for name in FIELD_AXES:  # a level is a value of the field: its classifier gives the level back
        for level in SPEC[name].levels:
            assert SPEC[name].level_of(_with(name, level)) == level, (name, level)


def _with(name: str, value: object) -> AttentionCase:
    base = AttentionCase(requests=((3, 5),), num_heads=2, num_kv_heads=2, head_dim=64)
    extra: dict[str, object] = {}
    if name in ("descale", "quant_q") and value not in (None, True):
        extra["quant"] = "int8_t1" if value == "token" else "fp8_e4m3"
    if name == "qv" and value:
        extra["head_dim_v"] = 32
    if name == "v_padded" and value:
        extra["head_dim_v"] = 32
    return dataclasses.replace(base, **{name: value}, **extra)
