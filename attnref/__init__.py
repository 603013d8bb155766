"""attnref: a pure-PyTorch, memory-bounded reference of attention as the kernels define it.

Entry points (each validates its metadata and raises ``ValueError`` naming the argument):

* :func:`attention_varlen`: packed sequences with ``cu_seqlens`` (and/or ``seqused_k``)
* :func:`attention_padded`: ``(b, s, h, d)`` batches, keys limited by ``seqlens_k``
* :func:`attention_paged`: keys read from a paged cache (NHD/HND) through a block table
* :func:`write_kv_cache`, :func:`gather_kv`: the engines' slot-mapping write and its inverse
* :func:`merge_states`, :func:`merge_many`: LSE merging of partial results

Conventions: :mod:`attnref.options` (window spelling), :mod:`attnref.core` (order of
operations, LSE of fully masked rows).
"""

from .core import attend_sequence
from .mask import row_bounds, visible_mask, window_from_fa2, window_to_fa2, window_to_fa4
from .merge import merge_many, merge_states
from .options import AttnOptions, Numerics, Window
from .padded import attention_padded
from .paged import attention_paged, cache_geometry, gather_kv, to_layout, unstack_kv, write_kv_cache
from .result import AttnResult
from .varlen import attention_varlen

__all__ = [
    "AttnOptions",
    "AttnResult",
    "Numerics",
    "Window",
    "attend_sequence",
    "attention_padded",
    "attention_paged",
    "attention_varlen",
    "cache_geometry",
    "gather_kv",
    "merge_many",
    "merge_states",
    "row_bounds",
    "to_layout",
    "unstack_kv",
    "visible_mask",
    "window_from_fa2",
    "window_to_fa2",
    "window_to_fa4",
    "write_kv_cache",
]
