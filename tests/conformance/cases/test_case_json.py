"""The case model's reading of JSON and its value limits (conformance.cases.case_json): every JSON value either
builds a case that survives its own round trip or is refused with one line naming the field and the constraint."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conformance.cases.case import AttentionCase, CaseError
from conformance.cases.case_json import INT64_MAX, SHOWN_CHARS, show

BASE = {"requests": [[3, 7], [1, 9]], "num_heads": 4, "num_kv_heads": 2, "head_dim": 16}


def refused(data, strict: bool = True) -> CaseError:
    with pytest.raises(CaseError) as info:
        AttentionCase.from_json(data, strict=strict)
    return info.value


# Each: the JSON a user might type, and what the one-line refusal must say.
BAD = [
    ({**BASE, "softcap": math.nan}, "softcap must be a finite number > 0 (or unset), got NaN"),
    ({**BASE, "softcap": math.inf}, "softcap must be a finite number > 0 (or unset), got Infinity"),
    ({**BASE, "softcap": 0}, "softcap must be a finite number > 0 (or unset), got 0.0"),
    ({**BASE, "scale": math.inf}, "scale must be a finite number (or unset), got Infinity"),
    ({**BASE, "scale": -math.inf}, "scale must be a finite number (or unset), got -Infinity"),
    ({**BASE, "scale": math.nan}, "scale must be a finite number (or unset), got NaN"),
    ({**BASE, "softcap": 10**400}, "softcap must be a finite number > 0 (or unset), got an integer of 1329 bits"),
    ({**BASE, "requests": [[2**63, 1]]}, "requests[0] q_len must fit in a 64-bit integer (|x| < 2**63), got 9223"),
    ({**BASE, "requests": [[1, -(2**63) - 1]]}, "requests[0] kv_len must fit in a 64-bit integer"),
    ({**BASE, "requests": [[1, 10**1000]]}, "got an integer of 3322 bits"),
    ({**BASE, "num_heads": 2**64, "num_kv_heads": 2**64}, "num_heads must fit in a 64-bit integer"),
    ({**BASE, "window": [2**70, 0]}, "window[0] must fit in a 64-bit integer"),
    ({**BASE, "graph": [2**64]}, "graph[0] must fit in a 64-bit integer"),
    ({**BASE, "requests": [[2**40, 2**40]], "head_dim": 2**30}, "q tensor would hold"),
    ({**BASE, "kv_layout": "NHD", "block_size": 2**62, "requests": [[1, 1], [1, 1]]}, "k tensor would hold"),
    ({**BASE, "batch_name": "a\nb"}, 'batch_name must be printable text (no control characters), got "a\\nb"'),
    ({**BASE, "batch_name": "x\ud800"}, "batch_name must be printable text"),
    ({**BASE, "engine": "\x00", "scenario": "s"}, "engine must be printable text"),
    ({**BASE, "num_heads": True}, "num_heads must be an integer, got true"),
    ({**BASE, "num_heads": 4.0}, "num_heads must be an integer, got 4.0"),
    ({**BASE, "num_heads": None}, "num_heads must be an integer, got null"),
    ({**BASE, "head_dim_v": "64"}, 'head_dim_v must be an integer or null, got "64"'),
    ({**BASE, "softcap": "30"}, 'softcap must be a number or null, got "30"'),
    ({**BASE, "softcap": True}, "softcap must be a number or null, got true"),
    ({**BASE, "causal": 1}, "causal must be true or false, got 1"),
    ({**BASE, "dtype": None}, "dtype must be a string, got null"),
    ({**BASE, "dtype": "int4"}, "dtype must be one of"),
    ({**BASE, "descale": 3}, "descale must be a string or null, got 3"),
    ({**BASE, "requests": [[1]]}, "requests must be a list of [q_len, kv_len] integer pairs, got [[1]]"),
    ({**BASE, "requests": [[1, 1.5]]}, "requests must be a list of [q_len, kv_len] integer pairs"),
    ({**BASE, "requests": [[1, True]]}, "requests must be a list of [q_len, kv_len] integer pairs"),
    ({**BASE, "requests": "1,1"}, "requests must be a list of [q_len, kv_len] integer pairs"),
    ({**BASE, "requests": []}, "requests must hold at least one"),
    ({**BASE, "window": [1]}, "window must be [left, right] with integers or nulls, got [1]"),
    ({**BASE, "window": [1, "a"]}, "window must be [left, right] with integers or nulls"),
    ({**BASE, "window": [-1, 0]}, "window must be (left, right) with None or ints >= 0"),
    ({**BASE, "graph": [1.5]}, "graph must be a list of integers, got [1.5]"),
    ({**BASE, "data": {"a": 1}}, 'data must be a string, got {"a": 1}'),
    ({**BASE, "num_head": 4}, "unknown field 'num_head' (fields: requests, num_heads"),
    ({**BASE, **{f"k{i}": 0 for i in range(5)}}, "unknown field 'k0', 'k1', 'k2' and 2 more"),
    ({"requests": [[1, 1]]}, "missing field 'num_heads', 'num_kv_heads', 'head_dim'"),
    ([BASE], "a case must be a JSON object, got a list"),
    ("case", "a case must be a JSON object, got a string"),
    (None, "a case must be a JSON object, got null"),
    (3.5, "a case must be a JSON object, got a number"),
]


@pytest.mark.parametrize(("data", "says"), BAD)
def test_bad_json_is_refused_naming_the_field_and_the_constraint(data, says: str) -> None:
    exc = refused(data)
    assert says in exc.line, exc.line
    assert "\n" not in str(exc) and len(str(exc)) < 600
    assert str(exc) == "invalid AttentionCase: " + exc.line and isinstance(exc, ValueError)


def test_a_long_string_is_valid_text_but_messages_quote_a_bounded_part() -> None:
    case = AttentionCase.from_json({**BASE, "batch_name": "x" * 10_000}, strict=True)
    assert case.batch_name == "x" * 10_000
    exc = refused({**BASE, "dtype": "y" * 10_000})
    assert len(exc.line) < 300 and exc.line.count("y") < SHOWN_CHARS + 10


def test_every_problem_of_a_case_is_named_at_once() -> None:
    exc = refused({**BASE, "softcap": math.nan, "scale": math.inf, "num_heads": 3})
    assert len(exc.problems) == 3 and "softcap" in exc.line and "scale" in exc.line and "num_heads (3)" in exc.line


def test_records_are_read_leniently_but_not_blindly() -> None:
    """Without ``strict`` (records, campaigns) an unknown field is ignored, but the types and limits hold."""
    assert AttentionCase.from_json({**BASE, "from_the_future": 1}) == AttentionCase.from_json(BASE)
    assert "softcap must be a finite number" in refused({**BASE, "softcap": math.nan}, strict=False).line
    assert "num_heads must be an integer" in refused({**BASE, "num_heads": "4"}, strict=False).line


@pytest.mark.parametrize(
    ("kw", "says"),
    [
        (dict(softcap=math.nan), "softcap must be a finite number > 0"),
        (dict(scale=math.inf), "scale must be a finite number"),
        (dict(requests=((2**63, 1),)), "requests[0] q_len must fit in a 64-bit integer"),
        (dict(requests=((math.inf, 1),)), "requests must be (q_len, kv_len) integer pairs"),
        (dict(requests=((math.nan, 1),)), "requests must be (q_len, kv_len) integer pairs"),
        (dict(requests=((1,),)), "requests must be (q_len, kv_len) integer pairs"),
        (dict(softcap="soft"), 'softcap must be a finite number > 0 (or unset), got "soft"'),
        (dict(window=3), "window must be (left, right) with None or ints >= 0, got 3"),
        (dict(graph=("a",)), 'graph must be a sequence of integers, got ["a"]'),
        (dict(batch_name="tab\there"), "batch_name must be printable text"),
    ],
)
def test_a_case_built_in_python_keeps_the_same_limits(kw, says: str) -> None:
    with pytest.raises(CaseError) as info:
        AttentionCase(**{"requests": ((3, 7),), "num_heads": 4, "num_kv_heads": 2, "head_dim": 16, **kw})
    assert says in info.value.line


def test_the_limits_are_at_the_edge_of_int64() -> None:
    one = {**BASE, "num_heads": 1, "num_kv_heads": 1, "head_dim": 1}
    edge = AttentionCase.from_json({**one, "requests": [[0, INT64_MAX]]})  # k and v: 2**63 - 1 elements each
    assert edge.requests == ((0, INT64_MAX),) and edge.id
    assert "kv_len must fit in a 64-bit integer" in refused({**one, "requests": [[0, INT64_MAX + 1]]}).line
    assert (
        "k tensor would hold" in refused({**one, "requests": [[0, INT64_MAX]], "num_heads": 2, "num_kv_heads": 2}).line
    )


def test_show_spells_json_and_bounds_its_length() -> None:
    assert show(math.nan) == "NaN" and show(None) == "null" and show(True) == "true" and show("é") == '"\\u00e9"'
    assert len(show(list(range(1000)))) == SHOWN_CHARS and show(2**200) == "an integer of 201 bits"


# ----------------------------------------------------------------------------- properties

#: Any JSON value Python's json module reads: NaN and infinities included, integers of any size, any text.
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)
FIELDS = [
    "requests",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "head_dim_v",
    "dtype",
    "kv_layout",
    "block_size",
    "causal",
    "window",
    "softcap",
    "scale",
    "chunk",
    "num_splits",
    "quant",
    "descale",
    "cp_world",
    "cp_rank",
    "graph",
    "graph_fill",
    "invariance",
    "data",
    "batch_name",
    "engine",
]


def built_or_refused(data) -> AttentionCase | None:
    """Build ``data`` strictly: a case that survives its round trip, or None after a one-line refusal.  Any
    other exception fails the property (a traceback a user would see)."""
    try:
        case = AttentionCase.from_json(data, strict=True)
    except CaseError as exc:
        assert exc.problems and all(p and "\n" not in p and len(p) < 1000 for p in exc.problems), exc.problems
        exc.line.encode("utf-8")  # printable on any stderr
        return None
    text = json.dumps(case.to_json(), allow_nan=False)  # a record's line: no NaN, no Infinity
    again = AttentionCase.from_json(json.loads(text), strict=True)
    assert again == case and again.id == case.id
    case.id.encode("utf-8")
    assert "\n" not in case.id and case.summary() and case.features()
    return case


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(JSON)
def test_any_json_value_builds_a_case_or_is_refused_in_one_line(data) -> None:
    built_or_refused(data)


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(FIELDS), JSON, min_size=1, max_size=3), st.booleans())
def test_any_field_set_to_any_json_value_builds_or_is_refused_in_one_line(changes, paged: bool) -> None:
    base = {**BASE, **({"kv_layout": "NHD", "block_size": 16} if paged else {})}
    built_or_refused({**base, **changes})


@settings(max_examples=200)
@given(
    st.lists(
        st.tuples(st.integers(min_value=0, max_value=2**64), st.integers(min_value=0, max_value=2**64)),
        min_size=1,
        max_size=3,
    ),
    st.integers(min_value=1, max_value=2**64),
)
def test_large_sizes_build_exactly_when_every_tensor_fits_int64(requests, head_dim: int) -> None:
    data = {**BASE, "requests": [list(r) for r in requests], "head_dim": head_dim}
    case = built_or_refused(data)
    ints_fit = all(v <= INT64_MAX for r in requests for v in r) and head_dim <= INT64_MAX
    q, kv = sum(q for q, _ in requests), sum(k for _, k in requests)
    sizes_fit = q * 4 * head_dim <= INT64_MAX and kv * 2 * head_dim <= INT64_MAX
    assert (case is not None) == (ints_fit and sizes_fit)
