"""Seed ``003``: SGLang's FlashAttention backend, replayed (the engine ``sglang_fa``).

One module per concern; each imports only modules listed before it (no cycle, ``tests/conformance/engines/
test_layout.py``):

* :mod:`~conformance.engines.sglang.scenarios`: the :data:`SCENARIOS` and :data:`FINDINGS` tables;
* :mod:`~conformance.engines.sglang.local`: chunked local attention's virtual batches and the paged calls' metadata
  checks;
* :mod:`~conformance.engines.sglang.metadata`: the memory pool and ``init_forward_metadata``,
  :class:`SGLangMetadataBuilder`;
* :mod:`~conformance.engines.sglang.runner`: ``forward_extend`` / ``forward_decode``, :class:`SGLangForwardRunner`;
* :mod:`~conformance.engines.sglang.graph_state`: the CUDA-graph buffers, capture and replay metadata
  (``init_cuda_graph_state`` and the two ``init_forward_metadata_*_cuda_graph``), :class:`CudaGraphState`;
* :mod:`~conformance.engines.sglang.graph_cross`: the encoder buffers of encoder-decoder models' graph path,
  :class:`EncoderDecoderGraphState` (the engine's graph state);
* :mod:`~conformance.engines.sglang.graph_cases`: the graph scenarios as cases, their checks and kernel calls;
* :mod:`~conformance.engines.sglang.graph`: the engine-level CUDA-graph replay, :class:`SGLangGraphRun`;
* :mod:`~conformance.engines.sglang.fa`: the engine, :class:`SGLangFlashAttention`.
"""

from __future__ import annotations

from .fa import SGLangFlashAttention
from .local import VirtualBatches, check_call_metadata, effective_chunk_size, make_local_attention_virtual_batches
from .metadata import KCall, SGLangMetadataBuilder, SGLMetadata, Step
from .graph import SGLangGraphRun
from .graph_state import FILL_VALUE, CudaGraphState, RunnerBuffers
from .graph_cross import EncoderDecoderGraphState
from .runner import SGLangForwardRunner
from .scenarios import FINDINGS, GRAPH_FINDINGS, GRAPH_SCENARIOS, SCENARIOS, GraphScenario, Scenario, tree_paths

__all__ = [
    "FILL_VALUE",
    "FINDINGS",
    "GRAPH_FINDINGS",
    "GRAPH_SCENARIOS",
    "CudaGraphState",
    "EncoderDecoderGraphState",
    "GraphScenario",
    "RunnerBuffers",
    "SGLangGraphRun",
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
