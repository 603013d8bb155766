"""Seed ``001``'s builder, its CUDA-graph part: the preallocated AOT ``scheduler_metadata`` buffer and the split
counts, as the seed's ``FlashAttentionMetadataBuilder`` writes them (:class:`V1GraphBuilder`; what it does and what
the fork changes: :mod:`conformance.engines.vllm_v1.graph`), and the AOT scheduler it calls: FA3's
``get_scheduler_metadata`` on CUDA (:func:`graph_scheduler`), else :func:`host_scheduler_metadata`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from conformance.cases.case import AttentionCase

from .metadata import cdiv

__all__ = [
    "MAX_NUM_SPLITS_FOR_CUDA_GRAPH",
    "GraphMetadata",
    "V1GraphBuilder",
    "graph_scheduler",
    "host_scheduler_metadata",
    "round_up",
    "scheduler_metadata_size",
]

#: ``AttentionConfig.flash_attn_max_num_splits_for_cuda_graph`` (vLLM ``vllm/config/attention.py``, default 32).
MAX_NUM_SPLITS_FOR_CUDA_GRAPH = 32


def round_up(x: int, m: int) -> int:
    return cdiv(x, m) * m


def scheduler_metadata_size(batch: int) -> int:
    """The seed's ``1 + round_up(batch_size, 4) * 4``."""
    return 1 + round_up(batch, 4) * 4


def host_scheduler_metadata(
    batch_size: int, max_seqlen_q: int, max_seqlen_k: int, seqlens: torch.Tensor, num_splits: int, **_: Any
) -> torch.Tensor:
    """A host model of ``get_scheduler_metadata`` with the seed's size, ``1 + round_up(batch_size, 4) * 4``: the
    semaphore (0) and four vectors of ``round_up(batch_size, 4)``: key blocks of 128 per request, splits per
    request (``min(blocks, num_splits)``, 1 for 0), the requests by descending blocks, the live key counts.  Not
    FA3's values: it depends on what FA3's does (the live key counts, the split bound), which is what the checks
    need."""
    b4 = round_up(batch_size, 4)
    lens = seqlens[:batch_size].to("cpu", torch.int64)
    blocks = (lens + 127) // 128
    splits = blocks.clamp(min=1, max=max(num_splits, 1))
    order = torch.argsort(-blocks, stable=True)
    out = torch.zeros(1 + 4 * b4, dtype=torch.int32)
    for j, vec in enumerate((blocks, splits, order, lens)):
        out[1 + j * b4 : 1 + j * b4 + batch_size] = vec.to(torch.int32)
    return out.to(seqlens.device)


@dataclass
class GraphMetadata:
    """What one ``build`` leaves for the call: the split count the metadata was scheduled with (None without AOT),
    the call's ``max_num_splits``, the metadata (a view of the preallocated buffer) and ``decode.use_graph``."""

    scheduled_splits: int | None
    max_num_splits: int
    scheduler_metadata: torch.Tensor | None
    use_graph: bool


class V1GraphBuilder:
    """The seed builder's CUDA-graph fields and the graph part of ``build`` (see the module docstring)."""

    #: True: the fork's re-assignment of ``max_num_splits`` after scheduling; False: upstream's single assignment.
    splits_as_fork: ClassVar[bool] = True

    def __init__(
        self,
        *,
        max_num_seqs: int,
        max_cudagraph_size: int | None,
        aot_schedule: bool,
        scheduler: Callable[..., torch.Tensor],
        device: torch.device | str,
        max_num_splits_for_cuda_graph: int = MAX_NUM_SPLITS_FOR_CUDA_GRAPH,
        use_full_cuda_graph: bool = True,
        decode_use_graph: bool = True,
    ) -> None:
        self.use_full_cuda_graph = use_full_cuda_graph
        self.max_cudagraph_size = max_cudagraph_size
        self.aot_schedule = aot_schedule
        self.decode_use_graph = decode_use_graph
        self.scheduler = scheduler
        self.max_num_splits = 0  # no upper bound on the number of splits
        self.scheduler_metadata: torch.Tensor | None = None
        if use_full_cuda_graph and aot_schedule:
            self.max_batch_size = max(max_num_seqs, max_cudagraph_size or 0)
            self.scheduler_metadata = torch.zeros(
                scheduler_metadata_size(self.max_batch_size), dtype=torch.int32, device=device
            )
            self.max_num_splits = max_num_splits_for_cuda_graph

    def schedule(self, num_reqs: int, max_query_len: int, seq_lens: torch.Tensor, num_splits: int) -> torch.Tensor:
        """``schedule(batch_size, cu_query_lens, max_query_len, seqlens, max_seq_len, causal)`` with AOT on."""
        return self.scheduler(
            batch_size=num_reqs,
            max_seqlen_q=max_query_len,
            max_seqlen_k=int(seq_lens[:num_reqs].max()),
            seqlens=seq_lens[:num_reqs],
            num_splits=num_splits,
        )

    def build(
        self, num_reqs: int, num_actual_tokens: int, max_query_len: int, seq_lens: torch.Tensor, batch_invariant: bool
    ) -> GraphMetadata:
        max_num_splits = 0  # FA3's heuristics, not CG compatible
        if (
            self.use_full_cuda_graph
            and self.max_cudagraph_size is not None
            and num_actual_tokens <= self.max_cudagraph_size
        ):
            max_num_splits = self.max_num_splits
        if batch_invariant:
            max_num_splits = 1
        scheduled = max_num_splits if self.aot_schedule else None
        metadata = self.schedule(num_reqs, max_query_len, seq_lens, max_num_splits) if self.aot_schedule else None
        if self.splits_as_fork:
            max_num_splits = 0
        if self.use_full_cuda_graph and metadata is not None:
            metadata = self._copy_into_buffer(metadata, num_reqs)
            if self.splits_as_fork and self.max_cudagraph_size is not None:
                if num_actual_tokens <= self.max_cudagraph_size:
                    max_num_splits = self.max_num_splits
        return GraphMetadata(scheduled, max_num_splits, metadata, self.decode_use_graph)

    def _copy_into_buffer(self, metadata: torch.Tensor, num_reqs: int) -> torch.Tensor:
        buf = self.scheduler_metadata
        assert buf is not None
        n = metadata.shape[0]
        if n > buf.numel():
            raise ValueError(
                f"scheduler_metadata: {n} entries (batch of {num_reqs}) do not fit the preallocated buffer of "
                f"{buf.numel()} = 1 + round_up(max_batch_size {self.max_batch_size}, 4) * 4"
            )
        buf[:n] = metadata
        buf[n:] = 0  # the seed: thread blocks reading stale entries would overwrite the output
        return buf[:n]


def graph_scheduler(case: AttentionCase, cu_seqlens_q: torch.Tensor, device: str) -> Callable[..., torch.Tensor]:
    """FA3's ``get_scheduler_metadata`` with the layer's fields (as the seed's ``schedule`` passes them) on CUDA when
    vLLM's FA3 imports (:func:`attnfast._vllm.import_vllm_fa3`, as the ``fa3-vllm`` adapter decides it), else
    :func:`host_scheduler_metadata`."""
    if not device.startswith("cuda"):
        return host_scheduler_metadata
    from attnfast._fa_common import fa2_window
    from attnfast._vllm import import_vllm_fa3

    try:
        mod = import_vllm_fa3()
    except Exception:  # no vLLM's FA3: the host model keeps the buffer logic checked
        return host_scheduler_metadata

    def fa3(batch_size: int, max_seqlen_q: int, max_seqlen_k: int, seqlens: torch.Tensor, num_splits: int):
        return mod.get_scheduler_metadata(
            batch_size,
            max_seqlen_q,
            max_seqlen_k,
            case.num_heads,
            case.num_kv_heads,
            case.head_dim,
            seqlens,
            qkv_dtype=case.torch_dtype,
            headdim_v=case.dv,
            cu_seqlens_q=cu_seqlens_q[: batch_size + 1],
            page_size=case.block_size,
            causal=case.causal,
            window_size=fa2_window(case),
            num_splits=num_splits,
        )

    return fa3
