"""Tolerances as data: one dtype table, then feature, backend, case and user layers.

Pass rule (``../shared/SEMANTICS.md`` section 7, flash-attention's own tests).  With ``ref`` the fp32 reference,
``base`` the same-dtype baseline (:mod:`conformance.verdict.baseline`) and ``B = max|base - ref|``, the kernel
output passes when ``|out - ref| <= factor * B + min(atol, atol_rel * |ref|) + rtol * |ref|`` holds elementwise
everywhere (or on all but ``max_mismatch_frac`` of the elements), and

* ``mean|out - ref| <= mean_factor * mean|base - ref| + mean_atol``;
* no NaN/Inf where the reference is finite, in the output or in the LSE, whatever the tolerance
  (an infinite ``atol`` or ``lse_atol`` switches a bound off, never this);
* cosine similarity of the flattened outputs >= ``min_cosine`` (skipped when ``ref`` is all 0);
* LSE, on rows whose reference LSE is finite:
  ``|lse - lse_ref| <= lse_factor * max|lse_base - lse_ref| + lse_atol + lse_rtol * |lse_ref| [+ slack]``, with
  ``slack`` the row's ``lse_slack`` when the adapter declares one (``attnfast.base``; no override sets it);
* fully masked rows (reference LSE ``-inf``): kernel LSE exactly ``-inf``; rows whose reference
  output is exactly 0: ``|out| <= atol``.

The baseline's errors are taken over its finite elements only (a baseline that overflowed never widens a bound;
the record counts them: :mod:`conformance.verdict.compare`).  ``atol_rel`` is the case dtype's unit roundoff, so
the constant term is the element's own rounding capped at ``atol``; ``atol_rel = inf`` keeps ``atol`` (fp32).

Resolution, later layers winning and a field left ``None`` inheriting: :data:`DTYPE_DEFAULTS` -> feature
(:data:`FEATURE_RULES`, in table order: ``softcap`` factor and lse_factor 3; ``append``, ``paged``, ``splits``
mean_factor 1.5) -> backend (:data:`BACKEND_RULES`) -> case (:data:`CASE_RULES`, ``fnmatch`` globs on the case
id) -> user overrides, in the order given.  The backend and case layers stay empty until a measured need, with its
evidence, puts an entry there.  A layer that sets ``atol`` without ``atol_rel`` makes that atol fixed.

An override is a mapping of tolerance fields plus optional scope keys ``dtype``, ``feature``, ``backend``,
``case`` (a glob), applied only where every scope key matches.  Command line (:func:`parse_override`)::

    factor=4    bf16.atol=0.01    feature:paged.mean_factor=2    backend:fa2.factor=3    case:*cap30*.factor=5

A TOML file (:func:`load_toml`) holds the same layers: top-level keys for every case, then ``[dtype.bf16]``,
``[feature.softcap]``, ``[backend.fa2]``, ``[case."*_cap30*"]`` tables.  The default table, a TOML example and why
the bound scales with the baseline: ``docs/concepts/verdict.md`` (*Tolerance: the default table and the layers*).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeGuard

from conformance.cases.case import DTYPES, FEATURES, AttentionCase
from conformance._toml import load_toml_file

__all__ = [
    "BACKEND_RULES",
    "CASE_RULES",
    "DTYPE_DEFAULTS",
    "FEATURE_RULES",
    "FIELDS",
    "SCOPES",
    "ResolvedTolerance",
    "Tolerance",
    "is_resolved",
    "layers",
    "load_toml",
    "parse_override",
    "resolve",
]


@dataclass(frozen=True)
class Tolerance:
    """One layer of tolerance settings; ``None`` = inherit from the layer below.  See the module docstring."""

    factor: float | None = None
    atol: float | None = None
    rtol: float | None = None
    atol_rel: float | None = None
    mean_factor: float | None = None
    mean_atol: float | None = None
    lse_factor: float | None = None
    lse_atol: float | None = None
    lse_rtol: float | None = None
    min_cosine: float | None = None
    max_mismatch_frac: float | None = None

    def __post_init__(self) -> None:
        for name in FIELDS:
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
                raise ValueError(f"tolerance {name} must be a number or None (inherit), got {value!r}")
            object.__setattr__(self, name, float(value))
            if name == "min_cosine":
                if not -1.0 <= value <= 1.0:
                    raise ValueError(f"tolerance min_cosine must be in [-1, 1], got {value}")
            elif name == "max_mismatch_frac":
                if not 0.0 <= value <= 1.0:
                    raise ValueError(f"tolerance max_mismatch_frac must be in [0, 1], got {value}")
            elif value < 0:
                raise ValueError(f"tolerance {name} must be >= 0, got {value}")

    def over(self, base: Tolerance) -> Tolerance:
        """``base`` with every field this layer sets replaced; a layer that sets ``atol`` without ``atol_rel`` asks
        for that atol on every element (``atol_rel`` inf), as ``atol`` meant before ``atol_rel`` existed."""
        fields = {k: v for k, v in self.fields().items() if v is not None}
        if "atol" in fields and "atol_rel" not in fields:
            fields["atol_rel"] = math.inf
        return dataclasses.replace(base, **fields)

    def fields(self) -> dict[str, float | None]:
        return {name: getattr(self, name) for name in FIELDS}

    def missing(self) -> list[str]:
        """Fields still ``None`` (a resolved tolerance has none)."""
        return [name for name in FIELDS if getattr(self, name) is None]


FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Tolerance))


class ResolvedTolerance(Protocol):
    """A :class:`Tolerance` with every field set, as the comparison reads it (:func:`is_resolved`)."""

    @property
    def factor(self) -> float: ...
    @property
    def atol(self) -> float: ...
    @property
    def rtol(self) -> float: ...
    @property
    def atol_rel(self) -> float: ...
    @property
    def mean_factor(self) -> float: ...
    @property
    def mean_atol(self) -> float: ...
    @property
    def lse_factor(self) -> float: ...
    @property
    def lse_atol(self) -> float: ...
    @property
    def lse_rtol(self) -> float: ...
    @property
    def min_cosine(self) -> float: ...
    @property
    def max_mismatch_frac(self) -> float: ...


def is_resolved(tol: Tolerance) -> TypeGuard[ResolvedTolerance]:
    """Whether ``tol`` leaves no field unset (what :func:`resolve` returns)."""
    return not tol.missing()


SCOPES: tuple[str, ...] = ("dtype", "feature", "backend", "case")
#: The names a scope may take, for the scopes with a closed set (backends and cases are open).
_SCOPE_NAMES: dict[str, Any] = {"dtype": DTYPES, "feature": FEATURES}

#: Complete defaults per dtype (every field set); see the module docstring for the reasoning.
DTYPE_DEFAULTS: dict[str, Tolerance] = {
    "bf16": Tolerance(
        factor=2,
        atol=2**-8,
        rtol=0,
        atol_rel=2**-8,
        mean_factor=2,
        mean_atol=2**-11,
        lse_factor=2,
        lse_atol=1e-3,
        lse_rtol=1e-5,
        min_cosine=0.999,
        max_mismatch_frac=0,
    ),
    "fp16": Tolerance(
        factor=2,
        atol=2**-11,
        rtol=0,
        atol_rel=2**-11,
        mean_factor=2,
        mean_atol=2**-14,
        lse_factor=2,
        lse_atol=1e-4,
        lse_rtol=1e-5,
        min_cosine=0.99999,
        max_mismatch_frac=0,
    ),
    "fp32": Tolerance(
        factor=2,
        atol=1e-5,
        rtol=0,
        atol_rel=math.inf,
        mean_factor=2,
        mean_atol=1e-6,
        lse_factor=2,
        lse_atol=1e-5,
        lse_rtol=1e-6,
        min_cosine=0.999999,
        max_mismatch_frac=0,
    ),
}

#: Feature -> layer, applied in this order for every feature the case has.
FEATURE_RULES: dict[str, Tolerance] = {
    "softcap": Tolerance(factor=3, lse_factor=3),
    "append": Tolerance(mean_factor=1.5),
    "paged": Tolerance(mean_factor=1.5),
    "splits": Tolerance(mean_factor=1.5),
}

#: Backend name -> layer.  Empty: no built-in backend has shown a need; add entries with evidence.
BACKEND_RULES: dict[str, Tolerance] = {}

#: (case id glob, layer), applied in order when the glob matches.  Empty for the same reason.
CASE_RULES: list[tuple[str, Tolerance]] = []


def _check_tables() -> None:
    """Fail at import if the built-in tables are inconsistent (a typo here would silently inherit)."""
    if set(DTYPE_DEFAULTS) != set(DTYPES):
        raise RuntimeError(f"DTYPE_DEFAULTS must cover every case dtype {sorted(DTYPES)}")
    for dtype, tol in DTYPE_DEFAULTS.items():
        if tol.missing():
            raise RuntimeError(f"DTYPE_DEFAULTS[{dtype}] leaves {tol.missing()} unset")
    if set(FEATURE_RULES) - set(FEATURES):
        raise RuntimeError(f"FEATURE_RULES names unknown features {set(FEATURE_RULES) - set(FEATURES)}")


_check_tables()


def _scope_matches(scope: Mapping[str, Any], case: AttentionCase, backend_name: str) -> bool:
    if "dtype" in scope and scope["dtype"] != case.dtype:
        return False
    if "feature" in scope and scope["feature"] not in case.features():
        return False
    if "backend" in scope and scope["backend"] != backend_name:
        return False
    if "case" in scope and not fnmatch.fnmatchcase(case.id, str(scope["case"])):
        return False
    return True


def _override_layer(override: Mapping[str, Any]) -> Tolerance:
    unknown = set(override) - set(FIELDS) - set(SCOPES)
    if unknown:
        raise ValueError(
            f"tolerance override keys must be among {list(FIELDS)} or scopes {list(SCOPES)}, got {sorted(unknown)}"
        )
    return Tolerance(**{k: v for k, v in override.items() if k in FIELDS})


def layers(
    case: AttentionCase, backend_name: str, overrides: Sequence[Mapping[str, Any]] = ()
) -> list[tuple[str, Tolerance]]:
    """Every layer that applies to (case, backend), lowest first, each with a label saying where it came from."""
    out: list[tuple[str, Tolerance]] = [(f"dtype {case.dtype}", DTYPE_DEFAULTS[case.dtype])]
    feats = case.features()
    out += [(f"feature {name}", tol) for name, tol in FEATURE_RULES.items() if name in feats]
    if backend_name in BACKEND_RULES:
        out.append((f"backend {backend_name}", BACKEND_RULES[backend_name]))
    out += [(f"case {glob}", tol) for glob, tol in CASE_RULES if fnmatch.fnmatchcase(case.id, glob)]
    for i, override in enumerate(overrides):
        layer = _override_layer(override)  # validate even when the scope does not match
        if _scope_matches(override, case, backend_name):
            scope = " ".join(f"{k}={override[k]}" for k in SCOPES if k in override)
            out.append((f"override {i}" + (f" ({scope})" if scope else ""), layer))
    return out


def resolve(case: AttentionCase, backend_name: str, overrides: Sequence[Mapping[str, Any]] = ()) -> Tolerance:
    """The complete tolerance for (case, backend): default -> feature -> backend -> case -> overrides."""
    tol = Tolerance()
    for _, layer in layers(case, backend_name, overrides):
        tol = layer.over(tol)
    return tol


def parse_override(text: str) -> dict[str, Any]:
    """``[SCOPE.]KEY=VALUE`` (the ``--tol`` flag) to an override mapping.

    SCOPE is a dtype (``bf16``), or ``dtype:``/``feature:``/``backend:``/``case:`` followed by a
    value (a glob for ``case:``).  VALUE is a float (``inf`` allowed, e.g. to switch a check off).
    """
    lhs, eq, value = text.partition("=")
    if not eq:
        raise ValueError(f"--tol must look like KEY=VALUE or SCOPE.KEY=VALUE, got {text!r}")
    scope_text, _, key = lhs.strip().rpartition(".")
    if key not in FIELDS:
        raise ValueError(f"--tol key must be one of {list(FIELDS)}, got {key!r} in {text!r}")
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"--tol value must be a number, got {value!r} in {text!r}") from None
    out: dict[str, Any] = {}
    if scope_text:
        kind, colon, name = scope_text.partition(":")
        if not colon:
            kind, name = "dtype", scope_text
        if kind not in SCOPES or not name:
            raise ValueError(
                f"--tol scope must be a dtype or one of {[s + ':NAME' for s in SCOPES]}, got {scope_text!r}"
            )
        known = _SCOPE_NAMES.get(kind)
        if known is not None and name not in known:
            raise ValueError(f"--tol {kind} scope must be one of {sorted(known)}, got {name!r}")
        out[kind] = name
    Tolerance(**{key: number})  # range check now, with the flag still in view
    out[key] = number
    return out


def load_toml(path: str | Path) -> list[dict[str, Any]]:
    """Override mappings from a TOML file (format in the module docstring), lowest layer first."""
    data = load_toml_file(path)
    top = {k: v for k, v in data.items() if not isinstance(v, dict)}
    out: list[dict[str, Any]] = [top] if top else []
    tables = {k: v for k, v in data.items() if isinstance(v, dict)}
    unknown = set(tables) - set(SCOPES)
    if unknown:
        raise ValueError(f"{path}: tables must be among {list(SCOPES)}, got {sorted(unknown)}")
    for scope in SCOPES:
        for name, fields in tables.get(scope, {}).items():
            if not isinstance(fields, dict):
                raise ValueError(f"{path}: [{scope}.{name}] must be a table of tolerance fields, got {fields!r}")
            known = _SCOPE_NAMES.get(scope)
            if known is not None and name not in known:
                raise ValueError(f"{path}: [{scope}.{name}]: {scope} must be one of {sorted(known)}")
            out.append({scope: name, **fields})
    for override in out:
        try:
            _override_layer(override)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{path}: {exc}") from None
    return out
