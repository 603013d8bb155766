"""Seed ``000``: vLLM V0's differential attention backend, replayed (the engine ``vllm_diff``).

One module per concern; each imports only modules listed before it (no cycle, ``tests/conformance/engines/
test_layout.py``):

* :mod:`~conformance.engines.vllm_diff.scenarios`: the :data:`SCENARIOS` table;
* :mod:`~conformance.engines.vllm_diff.metadata`: the builder's :class:`DiffMetadata` and its checks;
* :mod:`~conformance.engines.vllm_diff.graph`: the CUDA-graph decode, :class:`DiffGraphRun` (both graph block
  tables, padded slots, the four calls and the combination captured at a bucket, replayed for every batch size);
* :mod:`~conformance.engines.vllm_diff.attention`: the engine, :class:`VllmDifferentialAttention` (the layer's
  parameters, the builder, the four calls, the combination, the two-softmax oracle).
"""

from __future__ import annotations

from .attention import RMS_EPS, DiffParams, VllmDifferentialAttention, layer_params
from .metadata import DiffMetadata, validate_metadata
from .scenarios import SCENARIOS

__all__ = [
    "RMS_EPS",
    "SCENARIOS",
    "DiffMetadata",
    "DiffParams",
    "VllmDifferentialAttention",
    "layer_params",
    "validate_metadata",
]
