"""The table of compositions the verdict reads (:mod:`conformance.verdict.composition`): every entry names a field of
the case model and a function that exists, and the first field a case sets picks its composition."""

from __future__ import annotations

import dataclasses
import importlib
import sys
import types

import pytest

from conformance.cases.case import AttentionCase
from conformance.verdict.composition import COMPOSITIONS, composition_of


@pytest.mark.parametrize("field", sorted(COMPOSITIONS))
def test_each_entry_names_a_case_field_and_a_function(field: str) -> None:
    assert field in {f.name for f in dataclasses.fields(AttentionCase)}
    module, _, function = COMPOSITIONS[field].partition(":")
    assert callable(getattr(importlib.import_module(module), function))


def test_the_first_field_a_case_sets_picks_the_entry(monkeypatch) -> None:
    """Precedence is the table's order: an engine's invariance case is the engine's, not the kernel-level run."""
    assert list(COMPOSITIONS)[:3] == ["engine", "graph", "invariance"]
    fake = types.ModuleType("fake_compositions")
    fake.engine = lambda case: ("engine", case.engine)  # type: ignore[attr-defined]
    fake.invariance = lambda case: ("invariance", case.invariance)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, fake.__name__, fake)
    monkeypatch.setitem(COMPOSITIONS, "engine", f"{fake.__name__}:engine")
    monkeypatch.setitem(COMPOSITIONS, "invariance", f"{fake.__name__}:invariance")
    case = AttentionCase(num_heads=2, num_kv_heads=1, head_dim=16, requests=((1, 2),))
    assert composition_of(case) is None
    assert composition_of(dataclasses.replace(case, invariance="run")) == ("invariance", "run")
    from conformance.suites.registry import get_suite

    engine_case = next(c for c in get_suite("engines") if c.engine and c.invariance)
    assert composition_of(engine_case) == ("engine", engine_case.engine)
