"""The case model: what is run (:mod:`.case`, its tables, its field table :mod:`.fields` and JSON), its tensors
(:mod:`.inputs`, :mod:`.quant_inputs`, :mod:`.data_inputs`; an engine's paged cache, :mod:`.paged_kv`), sweep axes
and grids (:mod:`.sweep`), the case space as data (:mod:`.space`) and covering arrays over it (:mod:`.covering`).
The named suites built from them are :mod:`conformance.suites`, a layer above (``docs/reference/layout.md``).

A new case field is a field of :class:`~.case.AttentionCase` and one row of :mod:`.fields`, whose docstring says
what else it may need (the one place that says it); a new axis, level or constraint of the case space goes where
:mod:`.space`'s docstring says (the one place that says it); a new request list or mask is one table entry in
:mod:`.sweep`; a new sweep is one entry in its family's module of :mod:`conformance.suites`.

The names below are imported on first use (PEP 562), not with the package: importing a torch-free submodule
(:mod:`.case_tables`' feature names) does not import torch, so ``attnconf --help``
stays fast.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["DTYPES", "FEATURES", "LAYOUTS", "AttentionCase", "CaseInputs", "make_inputs"]

_HOME = {
    "DTYPES": "case",
    "FEATURES": "case",
    "LAYOUTS": "case",
    "AttentionCase": "case",
    "CaseInputs": "inputs",
    "make_inputs": "inputs",
}


def __getattr__(name: str) -> Any:
    if name in _HOME:
        return getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
