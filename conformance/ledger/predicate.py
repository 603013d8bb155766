"""Ledger predicates: which cases a known failure is about, as data (no eval).

An entry's ``when`` is one table, or an array of tables OR'd together (``[[failure.when]]``).  In one table every
condition must hold:

* ``name = value``: the field equals the value (``head_dim = 80``, ``causal = false``, ``fa2_entry = "varlen"``);
* ``name = [a, b]``: the field equals one of them;
* ``name = { op = value, ... }``: every op holds; ops ``not`` (differs), ``in`` / ``not_in`` (lists), ``lt``, ``le``,
  ``gt``, ``ge`` (numbers), ``set`` (true: the value is not None; false: it is None);
* ``features = [...]``: the case has all of these :data:`~conformance.cases.case.FEATURES`;
  ``no_features = [...]``: it has none of them.

Field names are those of :data:`conformance.ledger.fields.FIELDS`; an unknown name or feature, a value of
the wrong type, an unknown op or an empty table is a ``ValueError`` at load time.  A field whose value is None
(``block_size`` of a contiguous case) equals nothing, is ``not`` / ``not_in`` anything and fails every comparison.

``versions`` is a PEP 440 specifier set (``packaging.specifiers.SpecifierSet``, pre-releases included:
``">=4.0.0b36"``) tested against the record's ``version``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from conformance.cases.case import FEATURES
from conformance.ledger.fields import FIELDS, CaseView

__all__ = ["Condition", "Predicate", "When", "parse_predicate", "parse_versions", "parse_version", "version_side"]

_OPS = ("not", "in", "not_in", "lt", "le", "gt", "ge", "set")
_ORDERED = ("lt", "le", "gt", "ge")


def _type_ok(kind: str, value: Any) -> bool:
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, str)


def _equal(actual: Any, expected: Any) -> bool:
    if actual is None or isinstance(actual, bool) != isinstance(expected, bool):
        return False
    return actual == expected


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_fmt(v) for v in value) + "]"
    return str(value)


@dataclass(frozen=True)
class Condition:
    """One field test: ``op`` is ``eq``, ``any`` (a list) or one of the table ops."""

    field: str
    op: str
    value: Any

    def holds(self, actual: Any) -> bool:
        op, v = self.op, self.value
        if op == "set":
            return (actual is not None) == v
        if op == "eq":
            return _equal(actual, v)
        if op in ("any", "in"):
            return any(_equal(actual, x) for x in v)
        if op == "not_in":
            return not any(_equal(actual, x) for x in v)
        if op == "not":
            return not _equal(actual, v)
        if actual is None:
            return False
        return {"lt": actual < v, "le": actual <= v, "gt": actual > v, "ge": actual >= v}[op]

    def text(self) -> str:
        symbol = {
            "eq": "=",
            "any": "in",
            "in": "in",
            "not_in": "not in",
            "not": "!=",
            "lt": "<",
            "le": "<=",
            "gt": ">",
            "ge": ">=",
            "set": "set =",
        }[self.op]
        return f"{self.field} {symbol} {_fmt(self.value)}"


@dataclass(frozen=True)
class When:
    """One table of a predicate: every condition holds, every feature present, none of the excluded ones."""

    conditions: tuple[Condition, ...] = ()
    features: tuple[str, ...] = ()
    no_features: tuple[str, ...] = ()

    def holds(self, view: CaseView) -> bool:
        feats = view.features
        if any(f not in feats for f in self.features) or any(f in feats for f in self.no_features):
            return False
        return all(c.holds(view.value(c.field)) for c in self.conditions)

    def text(self) -> str:
        parts = [c.text() for c in self.conditions]
        if self.features:
            parts.append("features " + "+".join(self.features))
        if self.no_features:
            parts.append("no " + "/".join(self.no_features))
        return " and ".join(parts)


@dataclass(frozen=True)
class Predicate:
    """Whens OR'd: the case matches when one of them holds."""

    whens: tuple[When, ...]

    def holds(self, view: CaseView) -> bool:
        return any(w.holds(view) for w in self.whens)

    def text(self) -> str:
        return " or ".join(f"({w.text()})" if len(self.whens) > 1 else w.text() for w in self.whens)


#: Cheap conditions first: a derived value that walks every query row is computed only when the rest held, the
#: fork's window schedule (every query tile's key tiles) last.
_COST = {"fa3_window_unmasked_rows": 2} | dict.fromkeys(
    (
        "rows_with_keys",
        "rows_without_keys",
        "keys_left_of_window",
        "fa2_window_misread",
        "fa2_varlen_window_misread",
        "fa3_keyless_m_block",
        "fa3_one_mma_wg_switch",
        "fa3_group_rows_switch",
        "invariance_max_q_len_varies",
        "keyless_query_tile",
    ),
    1,
)


def _condition(where: str, name: str, raw: Any) -> list[Condition]:
    if name not in FIELDS:
        raise ValueError(f"{where}: unknown field {name!r} (attnconf ledger fields lists them)")
    kind = FIELDS[name].kind

    def typed(value: Any) -> Any:
        if not _type_ok(kind, value):
            raise ValueError(f"{where}: {name}: expected a {kind} value, got {value!r}")
        return value

    if isinstance(raw, list):
        if not raw:
            raise ValueError(f"{where}: {name}: an empty list matches nothing")
        return [Condition(name, "any", tuple(typed(v) for v in raw))]
    if isinstance(raw, Mapping):
        if not raw:
            raise ValueError(f"{where}: {name}: an empty table of ops")
        out = []
        for op, value in raw.items():
            if op not in _OPS:
                raise ValueError(f"{where}: {name}: unknown op {op!r} (allowed: {list(_OPS)})")
            if op == "set":
                if not isinstance(value, bool):
                    raise ValueError(f"{where}: {name}: 'set' takes true or false, got {value!r}")
                out.append(Condition(name, op, value))
            elif op in ("in", "not_in"):
                if not isinstance(value, list) or not value:
                    raise ValueError(f"{where}: {name}: {op!r} takes a non-empty list, got {value!r}")
                out.append(Condition(name, op, tuple(typed(v) for v in value)))
            elif op in _ORDERED and kind not in ("int", "float"):
                raise ValueError(f"{where}: {name}: {op!r} needs a numeric field, {name} is {kind}")
            else:
                out.append(Condition(name, op, typed(value)))
        return out
    return [Condition(name, "eq", typed(raw))]


def _features(where: str, key: str, raw: Any) -> tuple[str, ...]:
    values = [raw] if isinstance(raw, str) else raw
    if not isinstance(values, list) or not values or not all(isinstance(f, str) for f in values):
        raise ValueError(f"{where}: {key!r} must be a non-empty list of feature names, got {raw!r}")
    unknown = [f for f in values if f not in FEATURES]
    if unknown:
        raise ValueError(f"{where}: {key}: unknown features {unknown} (conformance.cases.case.FEATURES)")
    return tuple(values)


def _when(where: str, raw: Any) -> When:
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where}: 'when' must be a table or an array of tables, got {raw!r}")
    if not raw:
        raise ValueError(f"{where}: an empty 'when' table would match every case")
    conditions: list[Condition] = []
    features: tuple[str, ...] = ()
    no_features: tuple[str, ...] = ()
    for key, value in raw.items():
        if key == "features":
            features = _features(where, key, value)
        elif key == "no_features":
            no_features = _features(where, key, value)
        else:
            conditions.extend(_condition(where, key, value))
    both = set(features) & set(no_features)
    if both:
        raise ValueError(f"{where}: features {sorted(both)} both required and excluded")
    conditions.sort(key=lambda c: _COST.get(c.field, 0))
    return When(tuple(conditions), features, no_features)


def parse_predicate(where: str, raw: Any) -> Predicate:
    """The predicate of an entry's ``when`` value (a table, or a list of tables OR'd)."""
    tables = raw if isinstance(raw, list) else [raw]
    if not tables:
        raise ValueError(f"{where}: 'when' is an empty list")
    return Predicate(
        tuple(_when(f"{where}.when[{i}]" if len(tables) > 1 else f"{where}.when", t) for i, t in enumerate(tables))
    )


def parse_versions(where: str, raw: Any) -> SpecifierSet:
    """``versions = "<PEP 440 specifiers>"`` (pre-releases included)."""
    if not isinstance(raw, str) or not raw.strip():
        raise ValueError(f"{where}: 'versions' must be a PEP 440 specifier string such as '>=2.8.3', got {raw!r}")
    try:
        return SpecifierSet(raw, prereleases=True)
    except InvalidSpecifier as exc:
        raise ValueError(f"{where}: 'versions' {raw!r} is not a PEP 440 specifier set ({exc})") from None


def parse_version(text: str) -> Version | None:
    """A record's ``version``, or None when it is not a PEP 440 version ('not installed', '')."""
    try:
        return Version(text)
    except (InvalidVersion, TypeError):
        return None


def version_side(spec: SpecifierSet, version: Version) -> str:
    """``"in"`` when ``version`` is in ``spec``; else ``"after"`` when an upper bound excludes it (``<``, ``<=``, or
    ``==`` / ``~=`` below it: the version is newer than the range), ``"before"`` otherwise."""
    # no mutate: the set was built with prereleases=True (the argument repeats it); each of its specifiers includes
    # pre-releases by default in packaging 26, the argument is for packaging 22-25 (pyproject: packaging>=22)
    if spec.contains(version, prereleases=True):  # pragma: no mutate
        return "in"
    for s in spec:
        if s.contains(version, prereleases=True):  # pragma: no mutate
            continue
        if s.operator in ("<", "<="):
            return "after"
        if s.operator in ("==", "~=", "==="):
            bound = parse_version(s.version.removesuffix(".*"))
            if bound is not None and version > bound:
                return "after"
    return "before"
