"""The callable a composition's ``prepare`` returns (graph replays, invariance runs): what the verdict calls.

:func:`conformance.verdict.check.composition_of` documents the contract: the call returns the composition's output
(``KernelOutput``) and leaves ``notes`` (the record's ``extra["notes"]``), ``problems`` (failures beyond the
numerical verdict) and ``extra`` (record fields) on the object, each call starting afresh.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from attnfast.base import Backend, KernelOutput
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import CaseInputs

__all__ = ["ComposedRun"]


@dataclass
class ComposedRun:
    """Base of a composition's callable: subclasses implement :meth:`run`."""

    case: AttentionCase
    inputs: CaseInputs
    backend: Backend
    device: str
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def __call__(self) -> KernelOutput:
        self.notes.clear()
        self.problems.clear()
        return self.run()

    def run(self) -> KernelOutput:
        raise NotImplementedError
