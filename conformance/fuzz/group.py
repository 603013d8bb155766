"""Failures grouped by the axis values their minimal cases share.

Every minimal case is classified into the case space's levels (:func:`conformance.cases.space.classify`).  Its
*signature* is the levels that differ from those of the simplest case (:data:`FLOOR_CASE`: one single-token
request, one head, small equal dims, bf16, contiguous, no mask, no mode): the shrinker removes every axis value
a failure does not need, so what is left is what the failure needs.  Failures of one backend with the same
failure kind (:func:`conformance.fuzz.shrink.failure_kind`) and the same signature form one group, reported as
``"fa4: layout=NHD x dims=80/80 (7 failures)"`` rather than seven records.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

from conformance.cases import space
from conformance.cases.case import AttentionCase
from conformance.fuzz.shrink import failure_kind
from conformance.records import CheckResult

__all__ = ["FLOOR_CASE", "FuzzGroup", "fuzz_role", "group_failures", "signature"]

#: The simplest case: the levels of a minimal case that equal this one's say nothing about the failure.
FLOOR_CASE = AttentionCase(requests=((1, 1),), num_heads=1, num_kv_heads=1, head_dim=8)


def _fmt(value: Hashable) -> str:
    return "/".join(str(x) for x in value) if isinstance(value, tuple) else str(value)


def signature(case: AttentionCase) -> dict[str, Hashable]:
    """The classified axis levels of ``case`` that differ from :data:`FLOOR_CASE`'s, in axis order."""
    floor = space.classify(FLOOR_CASE)
    return {a: v for a, v in space.classify(case).items() if v != floor.get(a)}


def label(sig: dict[str, Hashable]) -> str:
    """``"layout=NHD x dims=80/80"``; ``"the simplest case"`` for an empty signature."""
    return " x ".join(f"{a}={_fmt(v)}" for a, v in sig.items()) or "the simplest case"


def fuzz_role(record: CheckResult) -> dict[str, Any]:
    """A record's ``extra["fuzz"]`` (empty for a record that ``attnconf fuzz`` did not write)."""
    info = record.extra.get("fuzz") if isinstance(record.extra, dict) else None
    return info if isinstance(info, dict) else {}


@dataclass
class FuzzGroup:
    """Failures of one backend with one failure kind and one signature.  ``members``: the minimal records
    (one per original failure), in file order; ``statuses`` counts the original statuses."""

    backend: str
    kind: str
    signature: dict[str, Hashable]
    members: list[CheckResult] = field(default_factory=list)

    @property
    def label(self) -> str:
        return label(self.signature)

    @property
    def count(self) -> int:
        return len(self.members)

    @property
    def representative(self) -> CheckResult:
        """The simplest minimal case of the group (the shortest shrink result)."""
        from conformance.fuzz.shrink import complexity

        def size(r: CheckResult) -> tuple[int, str]:
            try:
                return complexity(AttentionCase.from_json(r.case)), r.case_id
            except (KeyError, TypeError, ValueError):
                return 1 << 62, r.case_id

        return min(self.members, key=size)

    def text(self) -> str:
        rep = self.representative
        n = self.count
        return (
            f"{self.backend}: {self.label} ({n} failure{'s' if n != 1 else ''}, {self.kind}); "
            f"minimal {rep.case_id} after {len(fuzz_role(rep).get('path', []))} shrink steps"
        )


def group_failures(records: Iterable[CheckResult]) -> list[FuzzGroup]:
    """Groups of the minimal records among ``records`` (``extra["fuzz"]["role"] == "minimal"``), largest first.

    One group per (backend, failure kind, signature); a failure shrunk twice (a resumed campaign finishing an
    interrupted shrink) counts once, by its last minimal record."""
    latest: dict[tuple[str, str], CheckResult] = {}
    for r in records:
        info = fuzz_role(r)
        if info.get("role") == "minimal":
            latest[(r.backend, str(info.get("original_id", r.case_id)))] = r
    groups: dict[tuple[str, str, tuple], FuzzGroup] = {}
    for r in latest.values():
        try:
            sig = signature(AttentionCase.from_json(r.case))
        except (KeyError, TypeError, ValueError):
            sig = {"case": "not readable by this version"}
        kind = failure_kind(r) or r.status.value
        key = (r.backend, kind, tuple(sig.items()))
        groups.setdefault(key, FuzzGroup(r.backend, kind, sig)).members.append(r)
    return sorted(groups.values(), key=lambda g: (-g.count, g.backend, g.kind, g.label))


def kinds_by_backend(groups: Iterable[FuzzGroup]) -> dict[str, Counter]:
    """backend -> failure kind -> failures, over the groups."""
    out: dict[str, Counter] = defaultdict(Counter)
    for g in groups:
        out[g.backend][g.kind] += g.count
    return dict(out)
