"""attnref: a pure-PyTorch, memory-bounded reference of attention as the kernels define it.

Entry points (each validates its metadata and raises ``ValueError`` naming the argument):

* :func:`attention_varlen`: packed sequences with ``cu_seqlens`` (and/or ``seqused_k``)
* :func:`attention_padded`: ``(b, s, h, d)`` batches, keys limited by ``seqlens_k``
* :func:`attention_paged`: keys read from a paged cache (NHD/HND) through a block table
* :func:`write_kv_cache`, :func:`gather_kv`: the engines' slot-mapping write and its inverse
* :func:`merge_states`, :func:`merge_many`: LSE merging of partial results
* :func:`attention_varlen_backward`, :func:`attention_padded_backward`, :func:`attend_sequence_backward`:
  reference gradients (:mod:`attnref.backward`)

Conventions: :mod:`attnref.options` (window spelling, context-parallel shards), :mod:`attnref.core` (order of
operations, LSE of fully masked rows).
"""

from .backward import attend_sequence_backward, attention_padded_backward, attention_varlen_backward
from .core import attend_sequence
from .mask import row_bounds, visible_mask, window_from_fa2, window_to_fa2, window_to_fa4
from .merge import merge_many, merge_states
from .mla import attention_mla_paged, attention_mla_varlen, join_latent, split_latent
from .options import AttnOptions, ContextParallel, Numerics, Window
from .padded import attention_padded
from .paged import attention_paged, cache_geometry, gather_kv, to_layout, unstack_kv, write_kv_cache
from .quant import (
    QUANT_FORMATS,
    QuantFormat,
    amax_scale,
    dequantize,
    dequantize_cache,
    expand_descale,
    quant_format,
    quantize,
    quantize_int8_per_token_head,
    write_kv_cache_fp8,
    write_kv_cache_int8,
)
from .result import AttnGrads, AttnResult
from .varlen import attention_varlen

__all__ = [
    "AttnOptions",
    "AttnGrads",
    "AttnResult",
    "ContextParallel",
    "Numerics",
    "QUANT_FORMATS",
    "QuantFormat",
    "Window",
    "amax_scale",
    "attend_sequence",
    "attend_sequence_backward",
    "attention_mla_paged",
    "attention_mla_varlen",
    "attention_padded",
    "attention_padded_backward",
    "attention_paged",
    "attention_varlen",
    "attention_varlen_backward",
    "cache_geometry",
    "dequantize",
    "dequantize_cache",
    "expand_descale",
    "gather_kv",
    "join_latent",
    "merge_many",
    "merge_states",
    "quant_format",
    "quantize",
    "quantize_int8_per_token_head",
    "row_bounds",
    "split_latent",
    "to_layout",
    "unstack_kv",
    "visible_mask",
    "window_from_fa2",
    "window_to_fa2",
    "window_to_fa4",
    "write_kv_cache",
    "write_kv_cache_fp8",
    "write_kv_cache_int8",
]
