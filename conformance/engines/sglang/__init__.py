"""Seed ``003``: SGLang's FlashAttention backend, replayed (the engine ``sglang_fa``).

One module per concern; each imports only modules listed before it (no cycle, ``tests/conformance/engines/
test_layout.py``):

* :mod:`~conformance.engines.sglang.scenarios`: the :data:`SCENARIOS` and :data:`FINDINGS` tables;
* :mod:`~conformance.engines.sglang.local`: chunked local attention's virtual batches and the paged calls' metadata
  checks;
* :mod:`~conformance.engines.sglang.metadata`: the memory pool and ``init_forward_metadata``,
  :class:`SGLangMetadataBuilder`;
* :mod:`~conformance.engines.sglang.runner`: ``forward_extend`` / ``forward_decode``, :class:`SGLangForwardRunner`;
* :mod:`~conformance.engines.sglang.fa`: the engine, :class:`SGLangFlashAttention`.
"""

from __future__ import annotations

from .fa import SGLangFlashAttention
from .local import VirtualBatches, check_call_metadata, effective_chunk_size, make_local_attention_virtual_batches
from .metadata import KCall, SGLangMetadataBuilder, SGLMetadata, Step
from .runner import SGLangForwardRunner
from .scenarios import FINDINGS, SCENARIOS, Scenario, tree_paths

__all__ = [
    "FINDINGS",
    "SCENARIOS",
    "KCall",
    "SGLMetadata",
    "SGLangFlashAttention",
    "SGLangForwardRunner",
    "SGLangMetadataBuilder",
    "Scenario",
    "Step",
    "VirtualBatches",
    "check_call_metadata",
    "effective_chunk_size",
    "make_local_attention_virtual_batches",
    "tree_paths",
]
