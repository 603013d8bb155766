"""Seed ``003``'s CUDA-graph path for encoder-decoder models: cross attention's encoder buffers, written from the
seed (no copied code) as :class:`EncoderDecoderGraphState`, the engine's graph state
(:data:`~conformance.engines.sglang.fa.SGLangFlashAttention.graph_state`).

What the seed does, and this module with it:

* ``init_cuda_graph_state(max_bs)`` allocates ``encoder_metadata``: ``encoder_page_table (max_bs,
  max_context_len)``, ``encoder_lens_int32 (max_bs,)``, ``encoder_cu_seqlens_k (max_bs + 1,)``;
* the capture (``encoder_lens`` given) makes the views ``encoder_lens_int32[:encoder_bs]``,
  ``encoder_cu_seqlens_k[:encoder_bs + 1]`` (``encoder_bs = encoder_lens.numel()``, the bucket's ``bs`` with the
  runner's buffer) and ``encoder_page_table[:bs, :]``;
* the replay, after the mode's own metadata ("Only support encoder size 1 for now"): ``encoder_max_seq_len_k =
  encoder_lens[0]``; ``encoder_lens_int32.copy_(encoder_lens[:1])``, which broadcasts request 0's encoder length to
  every row; ``encoder_cu_seqlens_k[1:]`` its cumsum; ``encoder_page_table[:, :encoder_max_seq_len_k]`` from
  ``req_to_token[req_pool_indices, :encoder_max_seq_len_k]`` (token slots, never strided to pages); and the
  decoder's ``page_table[:, :max_seq_len_k]`` rewritten from ``req_to_token[req_pool_indices, encoder_max_seq_len_k
  : encoder_max_seq_len_k + max_seq_len_k]`` (a request's row holds its encoder tokens, then its decoder tokens).
  Columns past those keep what earlier replays wrote.

The forward: a cross-attention layer (``layer.is_cross_attention``) reads ``encoder_page_table``,
``encoder_lens_int32`` and ``encoder_cu_seqlens_k``, non-causal, no window; the self-attention layer of the same
step reads the shifted decoder table, causal.  Both take page size 1 (the encoder table holds token slots: at larger
pages it is the eager path's ``cross_paged`` finding).

The runner's side (SGLang's ``CudaGraphRunner``, outside the seed; ``python/sglang/srt/model_executor/
cuda_graph_runner.py`` of the seed's era): an ``encoder_lens`` buffer of ``max_bs`` at ``encoder_len_fill_value =
0``, captured as ``encoder_lens[:bs]``, and ``replay_prepare`` copying the batch's lengths into ``[:raw_bs]``
(padded rows keep earlier values).

A batch whose requests have different encoder lengths is replayed as the seed does: request 1 on then reads request
0's encoder length (a finding, ``GRAPH_FINDINGS``; the tests show it).
"""

from __future__ import annotations

import torch

from conformance.cases.case import AttentionCase

from .graph_state import I32, CudaGraphState, GraphMetadata, RunnerBuffers
from .scenarios import GraphScenario

__all__ = ["ENCODER_LEN_FILL", "EncoderDecoderGraphState", "allocate_encoder_lens", "cross_lengths"]

#: ``CudaGraphRunner.encoder_len_fill_value`` of the seed's era: the runner's encoder lengths at capture.
ENCODER_LEN_FILL = 0


def cross_lengths(sc: GraphScenario) -> tuple[list[int], list[int]]:
    """Every request's encoder length and decoder ``seq_lens``, batch after batch (zeros without an encoder)."""
    seq = [s for batch in sc.batches for s in batch]
    if not sc.layer:
        return [0] * len(seq), seq
    enc = [e for batch in sc.encoder for e in batch]
    if [len(b) for b in sc.encoder] != [len(b) for b in sc.batches]:
        raise ValueError(f"encoder: one encoder length per request of each batch {sc.batches}, got {sc.encoder}")
    return enc, seq


def cross_kv_lens(sc: GraphScenario) -> list[int]:
    """The keys a request's query sees: its encoder tokens (cross layer) or its decoder tokens (self layer)."""
    enc, seq = cross_lengths(sc)
    return enc if sc.layer == "cross" else seq


def allocate_encoder_lens(runner: RunnerBuffers) -> None:
    """The runner's ``encoder_lens`` buffer for the bucket, at :data:`ENCODER_LEN_FILL`."""
    runner.encoder_lens = torch.full((runner.bs,), ENCODER_LEN_FILL, dtype=I32, device=runner.seq_lens.device)


def check_cross_case(case: AttentionCase, sc: GraphScenario, canon: AttentionCase) -> None:
    """An encoder-decoder scenario's batches are its own (the case holds one of the two lengths per request)."""
    for f in ("requests", "graph"):
        if getattr(case, f) != getattr(canon, f):
            raise ValueError(
                f"{f} must be {getattr(canon, f)!r} for scenario {case.scenario!r} (its encoder and decoder "
                f"lengths are the scenario's), got {getattr(case, f)!r}"
            )


class EncoderDecoderGraphState(CudaGraphState):
    """:class:`CudaGraphState` with the seed's encoder buffers (see the module docstring)."""

    encoder_metadata: dict

    def init_cuda_graph_state(self, max_bs: int) -> None:
        super().init_cuda_graph_state(max_bs)
        dev = self.device
        self.encoder_metadata = {
            "encoder_page_table": torch.zeros(max_bs, self.max_context_len, dtype=I32, device=dev),
            "encoder_lens_int32": torch.zeros(max_bs, dtype=I32, device=dev),
            "encoder_cu_seqlens_k": torch.zeros(max_bs + 1, dtype=I32, device=dev),
        }

    def capture(self, bs: int, seq_lens: torch.Tensor, encoder_lens: torch.Tensor | None = None):
        md, mde = super().capture(bs, seq_lens)
        if encoder_lens is not None:
            encoder_bs, buf = encoder_lens[:bs].numel(), self.encoder_metadata
            md.encoder_lens_int32 = buf["encoder_lens_int32"][:encoder_bs]
            md.encoder_cu_seqlens_k = buf["encoder_cu_seqlens_k"][: encoder_bs + 1]
            md.encoder_page_table = buf["encoder_page_table"][:bs, :]
        return md, mde

    def replay(self, bs: int, req_to_token: torch.Tensor, runner: RunnerBuffers, custom_mask=None):
        md, mde = super().replay(bs, req_to_token, runner, custom_mask)
        if runner.encoder_lens is not None:
            self.replay_encoder(md, req_to_token, runner.req_pool_indices[:bs], runner.encoder_lens[:bs], bs)
        return md, mde

    def replay_encoder(self, md: GraphMetadata, req_to_token, req_pool_indices, encoder_lens, bs: int) -> None:
        """The seed's encoder block of ``init_forward_metadata_replay_cuda_graph`` (encoder size 1)."""
        if md.encoder_lens_int32 is None or md.encoder_cu_seqlens_k is None or md.encoder_page_table is None:
            raise ValueError(f"encoder_lens: the bucket bs={bs} was captured without encoder_lens")
        assert md.page_table is not None
        enc = int(encoder_lens[0])
        md.encoder_max_seq_len_k = enc
        if enc + md.max_seq_len_k > req_to_token.shape[1] or enc > md.encoder_page_table.shape[1]:
            raise ValueError(
                f"encoder_lens: encoder {enc} + decoder {md.max_seq_len_k} tokens exceed req_to_token's "
                f"{req_to_token.shape[1]} columns or the bucket bs={bs}'s encoder_page_table "
                f"({md.encoder_page_table.shape[1]}, max_context_len {self.max_context_len})"
            )
        md.encoder_lens_int32.copy_(encoder_lens[:1])  # broadcast: every row gets request 0's length
        md.encoder_cu_seqlens_k[1:].copy_(torch.cumsum(md.encoder_lens_int32, dim=0, dtype=I32))
        md.encoder_page_table[:, :enc].copy_(req_to_token[req_pool_indices, :enc])
        n = md.max_seq_len_k
        md.page_table[:, :n].copy_(req_to_token[req_pool_indices, enc : enc + n])
