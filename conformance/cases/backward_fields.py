"""Validation of a case's backward-pass and input-distribution fields (``backward``, ``deterministic``, ``data``).

Kept apart from :mod:`conformance.cases.case` so the case module stays about the forward call; how a backward case
is run and judged is :mod:`conformance.backward`, how ``data`` shapes the inputs :mod:`conformance.cases.data_inputs`.

A backward case is a training call: q, k and v in the activation dtype, keys contiguous (packed varlen or one
sequence), no cache.  So it cannot be combined with what only inference calls take (a paged cache, a kvcache
append, quantized or MLA-absorbed inputs, scheduler metadata, a pinned split count, context-parallel shards) nor
with another composition (a graph replay, an invariance run, an engine replay).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from conformance.cases.case_json import show

from conformance.cases.case_tables import DATA

__all__ = ["backward_problems"]

#: Fields a backward case leaves at their defaults (the dataclass's), with the reason given when one is set.
_FORWARD_ONLY: tuple[tuple[str, str], ...] = (
    ("kv_layout", "a paged cache (training keys are contiguous)"),
    ("append", "a kvcache append"),
    ("quant", "quantized inputs"),
    ("qv", "an MLA-absorbed qv"),
    ("v_padded", "V padding"),
    ("scheduler_metadata", "FA3 scheduler metadata"),
    ("num_splits", "a pinned num_splits (split-KV is a decode path)"),
    ("cp_world", "context-parallel shards"),
    ("graph", "a CUDA-graph replay"),
    ("invariance", "an invariance run"),
    ("engine", "an engine replay"),
)


def backward_problems(case: Any) -> Iterator[str]:
    """One message per violated constraint of the backward and data fields (naming the field)."""
    if case.data not in DATA:
        yield f"data must be one of {sorted(DATA)}, got {show(case.data)}"
    if case.deterministic and not case.backward:
        yield "deterministic applies only to a backward case (backward=True): it is the backward kernel's option"
    if not case.backward:
        return
    defaults = {f.name: f.default for f in dataclasses.fields(case)}
    for name, what in _FORWARD_ONLY:
        if getattr(case, name) != defaults[name]:
            yield f"backward cannot be combined with {name} ({what})"
