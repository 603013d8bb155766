"""What is run: the case model (:mod:`.case`), its tensors (:mod:`.inputs`), sweep axes and grids
(:mod:`.sweep`) and the named suites (:mod:`.suites`, their sweeps by family in ``suite_*.py``; their one-line
descriptions in :mod:`.suite_descriptions`).

A new case field goes into :class:`~.case.AttentionCase` (with a default, so old records keep their
ids) and, if it changes the tensors, into :func:`~.inputs.make_inputs`; a new axis value is one
table entry in :mod:`.sweep`; a new sweep is one entry in its family's
``suite_*.py`` (a new suite one entry in :data:`.suites.SUITES` and its line in
:data:`.suite_descriptions.SUITE_DESCRIPTIONS`).

The names below are imported on first use (PEP 562), not with the package: importing a torch-free submodule
(:mod:`.case_tables`' feature names, :mod:`.suite_descriptions`) does not import torch, so ``attnconf --help``
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
