"""Engine replays (issue: the five seed engine backends in ``../shared/seeds/``, end to end).

One sub-package per engine backend (its scenarios, metadata builder, runner and engine module, one concern per
module), each engine an :class:`~conformance.engines.base.Engine` (the protocol and how a replay is judged:
:mod:`conformance.engines.base`); the framework the engines share stays here: :mod:`~conformance.engines.base`,
:mod:`~conformance.engines.calls` (call cases; paged caches and block managers are
:mod:`conformance.cases.paged_kv`'s), :mod:`~conformance.engines.graph_call`
(the support rule of an engine's captured CUDA-graph call; the capture and replays are
:class:`conformance.graphs.captured.CapturedCall`'s), :mod:`~conformance.engines.invariance` (an engine case's
invariance: its step per variant, request 0 compared bitwise) and :mod:`~conformance.engines.merge`
(``merge_attn_states``, also an engine of its own).  ``attnconf run --suite engines`` runs every engine's scenarios
on the backends named with ``--backend``; a case's ``engine`` field names the entry of :data:`ENGINES`.

=====================  ======  ==========================================================
sub-package            seed    engine (``ENGINES`` name)
=====================  ======  ==========================================================
``vllm_diff/``         000     vLLM V0 differential attention (``vllm_diff``)
``vllm_v1/``           001     vLLM V1 FlashAttention, vendor fork, with DCP (``vllm_v1_fa``)
``vllm_v0/``           002     vLLM V0 FlashAttention (``vllm_v0_fa``)
``sglang/``            003     SGLang FlashAttention (``sglang_fa``)
``vllm_mla/``          004     vLLM MLA prefill (``vllm_mla_prefill``)
=====================  ======  ==========================================================

Imports go one way: an engine's modules import the shared framework and modules of their own sub-package, never
another engine's, and none imports this package's ``__init__`` (``tests/conformance/engines/test_layout.py``
finds any cycle).  To add an engine: a sub-package with an ``Engine`` subclass (its ``cases``, ``plan``,
``forward``, and a ``reference`` if the layer is not plain attention over the full KV) and one line in
:data:`ENGINES`.
"""

from __future__ import annotations

import importlib
import importlib.util
from functools import cache
from typing import TYPE_CHECKING

from conformance.cases.case import AttentionCase

from .base import Engine

if TYPE_CHECKING:
    from .invariance import EngineInvariance

__all__ = ["ENGINES", "Engine", "composition_for", "engine_cases", "get_engine"]

#: registry name -> "module:class", the seed each replays in the comment.
ENGINES: dict[str, str] = {
    "vllm_diff": "conformance.engines.vllm_diff.attention:VllmDifferentialAttention",  # seed 000
    "vllm_v1_fa": "conformance.engines.vllm_v1.fa:VllmV1FlashAttention",  # seed 001
    "vllm_v0_fa": "conformance.engines.vllm_v0.fa:VllmV0FlashAttention",  # seed 002
    "sglang_fa": "conformance.engines.sglang.fa:SGLangFlashAttention",  # seed 003
    "vllm_mla_prefill": "conformance.engines.vllm_mla.prefill:VllmMLAPrefill",  # seed 004
    "merge": "conformance.engines.merge:MergeStates",  # merge_attn_states / merge_state as a mode of its own
}


def _available(name: str) -> bool:
    return importlib.util.find_spec(ENGINES[name].split(":")[0]) is not None


@cache
def get_engine(name: str) -> Engine:
    """The engine registered as ``name``; ``ValueError`` lists the names."""
    if name not in ENGINES or not _available(name):
        raise ValueError(f"engine must be one of {sorted(n for n in ENGINES if _available(n))}, got {name!r}")
    module, _, attr = ENGINES[name].partition(":")
    return getattr(importlib.import_module(module), attr)()


def engine_cases() -> list[AttentionCase]:
    """Every scenario of every registered engine (the ``engines`` suite), in registry order."""
    return [case for name in ENGINES if _available(name) for case in get_engine(name).cases()]


def composition_for(case: AttentionCase) -> Engine | EngineInvariance:
    """The composition of an engine case (:data:`conformance.verdict.composition.COMPOSITIONS`): its engine
    (:func:`get_engine`), or with ``case.invariance`` the engine's invariance run
    (:class:`~conformance.engines.invariance.EngineInvariance`: its forward per variant)."""
    engine = get_engine(case.engine)
    if case.invariance:
        from .invariance import EngineInvariance  # the invariance machinery, only for the cases that need it

        return EngineInvariance(engine)
    return engine
