"""Reading a case from JSON, and the limits every case's values stay within.

:meth:`conformance.cases.case.AttentionCase.from_json` reads every case that comes as JSON (``--case-json``,
results records, fuzz campaigns and their example database, the shard merge) through :func:`json_problems`:

* the value is a JSON object; every field :func:`required_fields` names is there;
* each field has its JSON type (:data:`_KINDS`): an integer is a JSON integer (``2``, not ``2.0`` nor ``true``), a
  number an integer or a float, a flag ``true`` or ``false``, text a string, ``requests`` a list of ``[q_len,
  kv_len]`` integer pairs, ``window`` ``[left, right]`` of integers or nulls, ``graph`` a list of integers;
* with ``strict`` (input a user typed) an unknown field is refused too; otherwise it is ignored (a record written
  by a newer version stays readable).

:func:`value_problems` holds what the case model checks of the values themselves, whichever way a case is built
(:meth:`AttentionCase._problems` calls it): every integer fits in 64 bits (:data:`INT64_MIN`..:data:`INT64_MAX`:
tensor sizes and seeds derived from them are ``torch.int64``), every float is finite, every tensor of the case
holds at most :data:`INT64_MAX` elements, and text is printable (no control characters, no lone surrogates: a
case's strings end up in its id, a one-line token written to UTF-8 files).

Each problem is one line naming the field and the constraint (``softcap must be a finite number > 0, got NaN``),
values shown as JSON and cut to :data:`SHOWN_CHARS` characters.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "SHOWN_CHARS",
    "CaseError",
    "finite_problem",
    "json_problems",
    "required_fields",
    "show",
    "value_problems",
]

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
#: At most this many characters of a value are quoted in a message (a message is one line, never a dump).
SHOWN_CHARS = 60


class CaseError(ValueError):
    """A case refused by the case model: :attr:`problems` are one line each, naming the field and the
    constraint; ``str()`` is ``invalid AttentionCase: `` and the problems joined by ``; ``."""

    def __init__(self, problems: list[str] | tuple[str, ...]) -> None:
        self.problems = tuple(problems)
        super().__init__("invalid AttentionCase: " + "; ".join(self.problems))

    @property
    def line(self) -> str:
        """The problems on one line, without the ``invalid AttentionCase`` prefix."""
        return "; ".join(self.problems)


def show(value: Any) -> str:
    """``value`` as JSON spells it (``NaN``, ``null``, ``true``), escaped to ASCII and cut to :data:`SHOWN_CHARS`."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"an integer of {value.bit_length()} bits"
    try:
        text = json.dumps(value, ensure_ascii=True)
    except (TypeError, ValueError, RecursionError):
        text = ascii(value) if not isinstance(value, (list, dict, tuple)) else type(value).__name__
    return _cut(text)


def _cut(text: str) -> str:
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _pair(x: Any) -> bool:
    return isinstance(x, list) and len(x) == 2 and all(_is_int(v) for v in x)


#: JSON kind of each field annotation of ``AttentionCase``: (accepts, what the message says it must be).
_KINDS: dict[str, tuple[Any, str]] = {
    "int": (_is_int, "an integer"),
    "int | None": (lambda x: x is None or _is_int(x), "an integer or null"),
    "float | None": (lambda x: x is None or _is_number(x), "a number or null"),
    "bool": (lambda x: isinstance(x, bool), "true or false"),
    "str": (lambda x: isinstance(x, str), "a string"),
    "str | None": (lambda x: x is None or isinstance(x, str), "a string or null"),
    "tuple[tuple[int, int], ...]": (
        lambda x: isinstance(x, list) and all(_pair(r) for r in x),
        "a list of [q_len, kv_len] integer pairs",
    ),
    "tuple[int | None, int | None]": (
        lambda x: isinstance(x, list) and len(x) == 2 and all(v is None or _is_int(v) for v in x),
        "[left, right] with integers or nulls",
    ),
    "tuple[int, ...]": (lambda x: isinstance(x, list) and all(_is_int(v) for v in x), "a list of integers"),
}


def required_fields(fields: tuple[dataclasses.Field, ...]) -> list[str]:
    """The fields a case cannot do without (no default)."""
    return [f.name for f in fields if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]


def json_problems(data: Any, fields: tuple[dataclasses.Field, ...], strict: bool) -> list[str]:
    """What keeps ``data`` (parsed JSON) from being read as a case of ``fields``: not an object, an unknown field
    (``strict`` only), a missing one, a value of the wrong JSON type; empty when it can be built (the values
    themselves are then checked by the case)."""
    if not isinstance(data, Mapping):
        return [f"a case must be a JSON object, got {_json_type(data)}"]
    by_name = {f.name: f for f in fields}
    problems = []
    if strict:
        unknown = [k for k in data if k not in by_name]
        if unknown:
            more = f" and {len(unknown) - 3} more" if len(unknown) > 3 else ""
            listed = ", ".join(_cut(ascii(k)) for k in unknown[:3]) + more
            problems.append(f"unknown field {listed} (fields: {', '.join(by_name)})")
    missing = [n for n in required_fields(fields) if n not in data]
    if missing:
        problems.append(f"missing field {', '.join(map(repr, missing))}")
    for name, value in data.items():
        if name not in by_name:
            continue
        kind = str(by_name[name].type)
        accepts, what = _KINDS[kind]
        if not accepts(value):
            problems.append(f"{name} must be {what}, got {show(value)}")
    return problems


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "a list"
    return type(value).__name__


def _ints(case: Any) -> Iterator[tuple[str, int]]:
    """Every integer a case holds, with the name a message gives it."""
    for f in dataclasses.fields(case):
        value = getattr(case, f.name)
        if f.name == "requests":
            for i, (q, k) in enumerate(value):
                yield f"requests[{i}] q_len", q
                yield f"requests[{i}] kv_len", k
        elif isinstance(value, tuple):
            for i, v in enumerate(value):
                if _is_int(v):
                    yield f"{f.name}[{i}]", v
        elif _is_int(value):
            yield f.name, value


@functools.cache
def _field_defaults(cls: type) -> tuple[tuple[str, Any], ...]:
    """(name, default) of each field of a dataclass, in order (``dataclasses.MISSING`` where it has none)."""
    return tuple((f.name, f.default) for f in dataclasses.fields(cls))


def _fit(values: Iterable[Any]) -> bool:
    """Whether every integer among ``values``, in their tuples and in those tuples' tuples, fits in 64 bits: a
    superset of what :func:`_ints` yields, checked without naming each (a case builds in a fraction of the time)."""
    for value in values:
        if isinstance(value, int):
            if not INT64_MIN <= value <= INT64_MAX:
                return False
        elif isinstance(value, tuple) and not _fit(value):
            return False
    return True


def value_problems(case: Any) -> Iterator[str]:
    """The limits of :mod:`this module <conformance.cases.case_json>`'s docstring, checked on a built case; a
    problem here stops the case's other checks (they would compute sizes from values beyond the limits)."""
    cls: type = type(case)
    # a field holding its own default (the object itself) fits and is printable: most fields of most cases
    changed = [(name, v) for name, default in _field_defaults(cls) if (v := getattr(case, name)) is not default]
    fit = _fit(v for _, v in changed)
    wide = [] if fit else [(name, v) for name, v in _ints(case) if not INT64_MIN <= v <= INT64_MAX]
    for name, v in wide[:3]:
        yield f"{name} must fit in a 64-bit integer (|x| < 2**63), got {show(v)}"
    for name, value in changed:
        if isinstance(value, str) and not value.isprintable():
            yield f"{name} must be printable text (no control characters), got {show(value)}"
    if wide:
        return
    rows = _cache_rows(case)
    sizes = {
        "q": case.total_q * case.num_heads * case.qk_dim,
        "k": rows * case.num_kv_heads * case.head_dim,
        "v": rows * case.num_kv_heads * case.dv,
    }
    big = [name for name, n in sizes.items() if n > INT64_MAX]
    if big:
        yield f"the case's {big[0]} tensor would hold {show(sizes[big[0]])} elements, more than 2**63 - 1"


def _cache_rows(case: Any) -> int:
    """Key rows a case's k and v hold: every key, or every slot of every block of a paged cache."""
    if case.block_size is None or case.block_size <= 0:
        return case.total_kv
    bs = case.block_size
    return sum(-(-max(k, 0) // bs) * bs for k in case.kv_lens)


def finite_problem(name: str, value: float | None, positive: bool) -> str | None:
    """``name`` must be finite (and > 0 with ``positive``) when set; the message, or None."""
    if value is None:
        return None
    if not math.isfinite(value) or (positive and value <= 0):
        return f"{name} must be a finite number{' > 0' if positive else ''} (or unset), got {show(value)}"
    return None
