"""What composes the kernel calls of a case: the table of compositions the verdict reads.

A case that sets one of :data:`COMPOSITIONS`' fields is not one kernel call but several, composed by something
above the verdict: an engine replay (``case.engine``), a CUDA-graph capture and its replays (``case.graph``), an
invariance run (``case.invariance``), a training call with its gradients (``case.backward``).  Each entry names a
``"module:function"`` that takes the case and returns its composition; the first field the case sets picks the
entry (an engine case with ``invariance`` is the engine's invariance run, not the kernel-level one).  The modules
are imported on first use, as :data:`attnfast.registry.BUILTIN` names the adapters and
:data:`conformance.engines.ENGINES` the engines: the compositions judge through the verdict, a layer below them
(``docs/reference/layout.md``), so the verdict imports none of them.  A new composition: one entry here, in the
place its precedence asks for.

A composition has ``refuses(case)`` (its own declaration: why it cannot compose the case on any backend, ``""``
when it can; :func:`conformance.verdict.check.refusal` reads it first), ``supports(case, backend, device)``,
``prepare(case, inputs, backend, device)``, ``reference`` and ``baseline``; the callable ``prepare`` returns may
carry ``notes``, ``extra`` (record fields) and ``problems`` (failures beyond the numerical verdict, e.g. a replay
that differs bitwise from its eager call).
"""

from __future__ import annotations

import importlib
from typing import Any

from conformance.cases.case import AttentionCase

__all__ = ["COMPOSITIONS", "composition_of"]

#: case field -> ``"module:function"`` returning the composition of a case that sets it, in precedence order
COMPOSITIONS: dict[str, str] = {
    # the engine's replay (conformance.engines.ENGINES), or with case.invariance its invariance run
    "engine": "conformance.engines:composition_for",
    "graph": "conformance.graphs.replay:composition_for",  # CUDA-graph capture and replays
    "invariance": "conformance.graphs.invariance:composition_for",  # run / batch / splits / neighbour
    "backward": "conformance.backward.composition:composition_for",  # forward judged as usual, then the gradients
}


def composition_of(case: AttentionCase) -> Any:
    """The composition of ``case``'s kernel calls (the entry of :data:`COMPOSITIONS` of the first field it sets),
    or None for a single call."""
    for field, target in COMPOSITIONS.items():
        if getattr(case, field):
            module, function = target.split(":")  # "module:function": neither part holds a colon
            return getattr(importlib.import_module(module), function)(case)
    return None
