"""``attnconf compare``'s gradient diffs: the error ratio of each gradient of a backward case, old run vs new run.

For every joined pair of records of a backward case (``case["backward"]``) where both runs compared outputs (both
have ``stats``) and the pair is not already a new failure, each gradient's error ratio
(``extra["backward"]["tensors"][name]["error_ratio"]``, :mod:`conformance.backward.composition`) is diffed with the
forward's rule (:mod:`conformance.reporting.compare`): a gradient whose new ratio exceeds ``ratio_threshold`` times
the old one and ``ratio_floor`` is a regression (:class:`GradChange`).

Fail closed: when one run has a gradient's numbers and the other has not (no ``extra["backward"]`` at all, a
tensor missing, or a ratio that is not a number), the pair cannot be compared and is a :class:`GradMissing`, which
makes the comparison regress as a regression does (a gate must not pass on what it could not compare).  A d sinks
gradient that neither run returned (``"dsinks": "not returned"``) is not missing.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TypeGuard

from conformance.records import CheckResult

from .verdict import GRADS

__all__ = ["GradChange", "GradMissing", "gradient_diffs"]


@dataclass(frozen=True)
class GradChange:
    """A gradient whose error ratio grew beyond the rule."""

    old: CheckResult
    new: CheckResult
    tensor: str
    old_ratio: float
    new_ratio: float


@dataclass(frozen=True)
class GradMissing:
    """A gradient one run has numbers for and the other has not (``side``: the run that lacks them)."""

    old: CheckResult
    new: CheckResult
    tensor: str
    side: str
    why: str


def _ratios(r: CheckResult) -> dict[str, Any] | None:
    """tensor -> error ratio (or the bad value) of a record; None without ``extra["backward"]["tensors"]``."""
    bw = r.extra.get("backward") if isinstance(r.extra, dict) else None
    tensors = bw.get("tensors") if isinstance(bw, dict) else None
    if not isinstance(tensors, dict):
        return None
    return {n: s.get("error_ratio") if isinstance(s, dict) else None for n, s in tensors.items()}


def _number(x: Any) -> TypeGuard[float]:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and not math.isnan(x)


def gradient_diffs(
    pairs: Iterable[tuple[CheckResult, CheckResult]], *, ratio_threshold: float = 2.0, ratio_floor: float = 0.5
) -> tuple[list[GradChange], list[GradMissing]]:
    """(regressions, missing) over the (old, new) record pairs (see the module docstring)."""
    changes: list[GradChange] = []
    missing: list[GradMissing] = []
    for old, new in pairs:
        case = new.case if isinstance(new.case, dict) else {}
        if not case.get("backward") or old.stats is None or new.stats is None:
            continue
        if new.status.is_problem and not old.status.is_problem:
            continue  # a new failure: reported as such
        ro, rn = _ratios(old), _ratios(new)
        if ro is None or rn is None:
            side = "old" if ro is None else "new"
            if ro is not None or rn is not None:
                missing.append(GradMissing(old, new, "all", side, 'no extra["backward"] gradient numbers'))
            else:
                missing.append(GradMissing(old, new, "all", "both", 'no extra["backward"] in either record'))
            continue
        for name in [g for g in GRADS if g in ro or g in rn] + sorted((set(ro) | set(rn)) - set(GRADS)):
            a, b = ro.get(name), rn.get(name)
            if not _number(a) and not _number(b):
                continue  # neither run has a number (both failed before judging it): nothing to diff
            if not (_number(a) and _number(b)):
                side = "old" if not _number(a) else "new"
                what = "absent" if (ro if side == "old" else rn).get(name) is None else "not a number"
                missing.append(GradMissing(old, new, name, side, f"{name} error ratio {what}"))
                continue
            if b > ratio_floor and b > ratio_threshold * a:
                changes.append(GradChange(old, new, name, float(a), float(b)))
    return changes, missing
