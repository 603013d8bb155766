"""Seed ``001``: vLLM V1's FlashAttention backend in a vendor fork, replayed (the engine ``vllm_v1_fa``).

One module per concern; each imports only modules listed before it (no cycle, ``tests/conformance/engines/
test_layout.py``):

* :mod:`~conformance.engines.vllm_v1.scenarios`: the :data:`SCENARIOS` table (case ids come from it);
* :mod:`~conformance.engines.vllm_v1.metadata`: the seed's functions and its ``FlashAttentionMetadataBuilder``;
* :mod:`~conformance.engines.vllm_v1.runner`: the model runner's side (cache layout, the step, block tables, slot
  mapping with DCP's, the cascade decision, cache writes), :class:`VllmV1Runner`;
* :mod:`~conformance.engines.vllm_v1.collectives`: DCP's LSE-corrected all-gather / reduce-scatter and its groups;
* :mod:`~conformance.engines.vllm_v1.dcp_kernel`: DCP through the kernel's own cp arguments (one call per rank);
* :mod:`~conformance.engines.vllm_v1.dcp`: the seed's DCP forward (two calls per rank), ranks as threads;
* :mod:`~conformance.engines.vllm_v1.graph_builder`: the builder's full-CUDA-graph part (AOT ``scheduler_metadata``
  in its preallocated buffer, ``max_num_splits``);
* :mod:`~conformance.engines.vllm_v1.graph`: the graph scenarios, captured at a bucket and replayed for every batch;
* :mod:`~conformance.engines.vllm_v1.fa`: the engine, :class:`VllmV1FlashAttention`;
* :mod:`~conformance.engines.vllm_v1.dcp_dist`: the DCP replay across processes and its script
  (``python -m conformance.engines.vllm_v1.dcp_dist``; not imported here).
"""

from __future__ import annotations

from .collectives import DistGroup, ThreadGroup, correct_attn_out, cp_lse_ag_out_rs
from .dcp import context_kv_lens, dcp_calls, dcp_forward, dcp_rank_forward
from .dcp_kernel import kernel_cp_calls, kernel_cp_rank_forward
from .fa import VllmV1FlashAttention
from .metadata import (
    NUM_SMS,
    CommonAttentionMetadata,
    DecodeMetadata,
    FlashAttentionMetadata,
    FlashAttentionMetadataBuilder,
    PrefillMetadata,
    cdiv,
    get_dcp_local_seq_lens,
    reorder_batch,
    split_decodes_and_prefills,
    use_cascade_attention,
)
from .runner import (
    KERNEL_BLOCK_SIZES,
    NUM_LAYERS,
    KVCache,
    Step,
    VllmV1Runner,
    allocate_kv_cache,
    get_kv_cache_shape,
    get_kv_cache_stride_order,
    kernel_block_size,
)
from .scenarios import SCENARIOS, Scenario

__all__ = [
    "KERNEL_BLOCK_SIZES",
    "NUM_LAYERS",
    "NUM_SMS",
    "SCENARIOS",
    "CommonAttentionMetadata",
    "DecodeMetadata",
    "DistGroup",
    "FlashAttentionMetadata",
    "FlashAttentionMetadataBuilder",
    "KVCache",
    "PrefillMetadata",
    "Scenario",
    "Step",
    "ThreadGroup",
    "VllmV1FlashAttention",
    "VllmV1Runner",
    "allocate_kv_cache",
    "cdiv",
    "context_kv_lens",
    "correct_attn_out",
    "cp_lse_ag_out_rs",
    "dcp_calls",
    "dcp_forward",
    "dcp_rank_forward",
    "get_dcp_local_seq_lens",
    "get_kv_cache_shape",
    "get_kv_cache_stride_order",
    "kernel_block_size",
    "kernel_cp_calls",
    "kernel_cp_rank_forward",
    "reorder_batch",
    "split_decodes_and_prefills",
    "use_cascade_attention",
]
