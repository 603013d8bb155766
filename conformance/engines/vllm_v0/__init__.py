"""Seed ``002``: vLLM V0's FlashAttention backend, replayed (the engine ``vllm_v0_fa``).

One module per concern; each imports only modules listed before it (no cycle, ``tests/conformance/engines/
test_layout.py``):

* :mod:`~conformance.engines.vllm_v0.metadata`: V0's ``FlashAttentionMetadataBuilder`` (prefills first, slot
  mappings, block tables, encoder and cross fields) and its checks;
* :mod:`~conformance.engines.vllm_v0.scenarios`: the :data:`SCENARIOS` table and the layer configurations;
* :mod:`~conformance.engines.vllm_v0.graph`: the CUDA-graph decode (``graph_block_tables``, padded slots), its
  scenarios and run;
* :mod:`~conformance.engines.vllm_v0.fa`: the engine, :class:`VllmV0FlashAttention`.
"""

from __future__ import annotations

from .fa import VllmV0FlashAttention
from .metadata import PAD_SLOT_ID, Part, Seq, V0Metadata, build_metadata, check_metadata
from .scenarios import CONFIGS, SCENARIOS, Scenario

__all__ = [
    "CONFIGS",
    "PAD_SLOT_ID",
    "SCENARIOS",
    "Part",
    "Scenario",
    "Seq",
    "V0Metadata",
    "VllmV0FlashAttention",
    "build_metadata",
    "check_metadata",
]
