"""Engine replays (issue: the five seed engine backends in ``../shared/seeds/``, end to end).

One module per engine backend, each an :class:`~conformance.engines.base.Engine` (the protocol and how a
replay is judged: :mod:`conformance.engines.base`).  ``attnconf run --suite engines`` runs every engine's
scenarios on the backends named with ``--backend``; a case's ``engine`` field names the module here.

To add an engine: one module with an ``Engine`` subclass (its ``cases``, ``plan``, ``forward``, and a
``reference`` if the layer is not plain attention over the full KV) and one line in :data:`ENGINES`.
"""

from __future__ import annotations

import importlib
import importlib.util
from functools import cache

from conformance.cases.case import AttentionCase

from .base import Engine

__all__ = ["ENGINES", "Engine", "engine_cases", "get_engine"]

#: registry name -> "module:class", the seed each replays in the comment.
ENGINES: dict[str, str] = {
    "vllm_diff": "conformance.engines.vllm_diff:VllmDifferentialAttention",  # seed 000
    "vllm_v1_fa": "conformance.engines.vllm_v1_fa:VllmV1FlashAttention",  # seed 001
    "vllm_v0_fa": "conformance.engines.vllm_v0_fa:VllmV0FlashAttention",  # seed 002
    "sglang_fa": "conformance.engines.sglang_fa:SGLangFlashAttention",  # seed 003
    "vllm_mla_prefill": "conformance.engines.vllm_mla_prefill:VllmMLAPrefill",  # seed 004
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
