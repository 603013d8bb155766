"""Seed ``003``'s CUDA-graph metadata: ``init_cuda_graph_state``, ``init_forward_metadata_capture_cuda_graph`` and
``init_forward_metadata_replay_cuda_graph`` of SGLang's FlashAttention backend, written from the seed (no copied
code), as :class:`CudaGraphState` (the graph scenarios: :data:`~conformance.engines.sglang.scenarios.GRAPH_SCENARIOS`).

What the seed does, and this module with it:

* ``init_cuda_graph_state(max_bs, ...)`` allocates every buffer once for the largest batch: the decode buffers
  (``cache_seqlens``, ``cu_seqlens_q = arange(max_bs + 1)``, ``cu_seqlens_k``, ``page_table`` of ``ceil(
  max_context_len / page_size)`` pages, ``strided_indices``), the local-attention virtual-batch buffers
  (``max_bs * ceil(max_context_len / chunk)`` virtual batches of ``ceil(chunk / page_size)`` pages), with
  speculative decoding ``page_table_draft_decode`` and the target-verify buffers, with top-k > 1 the draft-decode
  and verify *normal* (prefix) and *expand* (draft tokens) buffers, whose tables hold token slots
  (``req_to_token`` columns, not strided to pages);
* the capture for a bucket ``bs`` makes the metadata *views* ``[:bs]`` of those buffers (normal decode: the
  runner's ``seq_lens`` as ``cache_seqlens_int32``, a fresh ``cu_seqlens_k``), and for local attention the
  virtual-batch views sized by the capture batch (``_update_local_attn_metadata_for_capture``);
* each replay writes the live batch into the same tensors in place: ``normal_decode_set_metadata``
  (``cache_seqlens = seq_lens + delta``, ``cu_seqlens_k[1:]``, ``page_table[:, :max_seq_pages]`` from
  ``req_to_token`` at ``strided_indices // page_size``), target verify's ``seq_lens + draft_tokens``, the top-k > 1
  expand table from the custom mask (padded rows' mask indices zeroed), the draft-decode expand table from
  ``out_cache_loc.view(-1, num_steps)[:, :step_id + 1]``, and the local buffers (``_update_local_attn_metadata_
  for_replay``: recomputed on the host, copied in, the rest zeroed).  Table columns past ``max_seq_pages`` keep
  whatever earlier replays wrote, as in the seed.

Padding (SGLang's ``CudaGraphRunner.replay_prepare``, outside the seed; :class:`RunnerBuffers`): a batch of
``raw_bs < bs`` requests is padded to the bucket with ``seq_lens`` at ``get_cuda_graph_seq_len_fill_value()`` = 1,
``out_cache_loc`` zeroed, and ``req_pool_indices`` of the padded rows left as earlier batches wrote them.

Bad input raises ``ValueError`` naming the field and the bucket: a batch larger than the captured bucket, a
sequence whose pages do not fit the bucket's page table (``max_context_len``), virtual batches beyond the local
buffers.  Cross attention's encoder buffers (``encoder_metadata``) are
:class:`~conformance.engines.sglang.graph_cross.EncoderDecoderGraphState`.  Not modelled: draft extend, top-k > 1
with a sliding window (``target_verify_metadata_topk_swa``), hybrid SWA pools.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .local import make_local_attention_virtual_batches
from .scenarios import GraphScenario

__all__ = ["FILL_VALUE", "CudaGraphState", "GraphMetadata", "LocalGraphMetadata", "RunnerBuffers"]

#: ``get_cuda_graph_seq_len_fill_value()`` of the seed: a padded request's ``seq_lens``.
FILL_VALUE = 1

I32 = torch.int32


@dataclass
class LocalGraphMetadata:
    """``FlashAttentionMetadata.LocalAttentionMetadata`` as the graph path holds it (views of the buffers)."""

    local_query_start_loc: torch.Tensor
    local_seqused_k: torch.Tensor
    local_block_table: torch.Tensor
    local_max_query_len: int
    local_max_seq_len: int


@dataclass
class GraphMetadata:
    """``FlashAttentionMetadata`` of the graph path: tensors that are views of the bucket's buffers."""

    cache_seqlens_int32: torch.Tensor | None = None
    cu_seqlens_q: torch.Tensor | None = None
    cu_seqlens_k: torch.Tensor | None = None
    page_table: torch.Tensor | None = None
    max_seq_len_q: int = 1
    max_seq_len_k: int = 0
    local_attn_metadata: LocalGraphMetadata | None = None
    encoder_lens_int32: torch.Tensor | None = None
    encoder_cu_seqlens_k: torch.Tensor | None = None
    encoder_page_table: torch.Tensor | None = None
    encoder_max_seq_len_k: int = 0


@dataclass
class RunnerBuffers:
    """The graph runner's input buffers for a bucket (``CudaGraphRunner``, outside the seed): a replay of
    ``raw_bs`` requests pads to ``bs`` with ``seq_lens`` at :data:`FILL_VALUE`, ``out_cache_loc`` zeroed, and the
    padded ``req_pool_indices`` as earlier batches left them."""

    bs: int
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    out_cache_loc: torch.Tensor
    raw_bs: int = 0
    encoder_lens: torch.Tensor | None = None  # encoder-decoder models only (graph_cross.allocate_encoder_lens)

    @classmethod
    def allocate(cls, bs: int, out_cache_locs: int, device: torch.device | str) -> "RunnerBuffers":
        return cls(
            bs,
            torch.zeros(bs, dtype=torch.int64, device=device),
            torch.full((bs,), FILL_VALUE, dtype=I32, device=device),
            torch.zeros(max(out_cache_locs, 1), dtype=torch.int64, device=device),
        )

    def prepare(
        self,
        req_pool_indices: list[int],
        seq_lens: list[int],
        out_cache_loc: list[int] | None,
        encoder_lens: list[int] | None = None,
    ) -> None:
        raw = len(seq_lens)
        if raw > self.bs:
            raise ValueError(f"graph: a replay batch of {raw} requests exceeds the captured bucket bs={self.bs}")
        if raw != self.bs:
            self.seq_lens.fill_(FILL_VALUE)
            self.out_cache_loc.zero_()
        dev = self.seq_lens.device
        self.req_pool_indices[:raw].copy_(torch.tensor(req_pool_indices, dtype=torch.int64, device=dev))
        self.seq_lens[:raw].copy_(torch.tensor(seq_lens, dtype=I32, device=dev))
        if out_cache_loc:
            self.out_cache_loc[: len(out_cache_loc)].copy_(torch.tensor(out_cache_loc, dtype=torch.int64, device=dev))
        if self.encoder_lens is not None and encoder_lens is not None:  # padded rows keep earlier values
            self.encoder_lens[:raw].copy_(torch.tensor(encoder_lens, dtype=I32, device=dev))
        self.raw_bs = raw


def _pad_cumsum(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.pad(torch.cumsum(x, dim=0, dtype=I32), (1, 0))


@dataclass
class CudaGraphState:
    """The backend's CUDA-graph state for one layer configuration (see the module docstring)."""

    scenario: GraphScenario
    device: torch.device | str = "cpu"
    decode_cuda_graph_metadata: dict = field(default_factory=dict)
    decode_cuda_graph_local_attn_metadata: dict = field(default_factory=dict)
    draft_decode_metadata_topk_normal: dict = field(default_factory=dict)
    draft_decode_metadata_topk_expand: dict = field(default_factory=dict)
    target_verify_metadata: dict = field(default_factory=dict)
    target_verify_metadata_topk_normal: dict = field(default_factory=dict)
    target_verify_metadata_topk_expand: dict = field(default_factory=dict)
    max_bs: int = 0

    @property
    def page_size(self) -> int:
        return self.scenario.page_size

    @property
    def max_context_len(self) -> int:
        return self.scenario.max_context_len

    # ------------------------------------------------------------------ init_cuda_graph_state
    def init_cuda_graph_state(self, max_bs: int) -> None:
        sc, dev, ps = self.scenario, self.device, self.page_size
        self.max_bs = max_bs
        max_num_pages = -(-self.max_context_len // ps)
        zeros = lambda *shape: torch.zeros(*shape, dtype=I32, device=dev)  # noqa: E731
        self.decode_cuda_graph_metadata = {
            "cache_seqlens": zeros(max_bs),
            "cu_seqlens_q": torch.arange(0, max_bs + 1, dtype=I32, device=dev),
            "cu_seqlens_k": zeros(max_bs + 1),
            "page_table": zeros(max_bs, max_num_pages),
            "strided_indices": torch.arange(0, self.max_context_len, ps, device=dev),
        }
        if sc.chunk is not None:
            max_virtual_batches = max_bs * -(-self.max_context_len // sc.chunk)
            self.decode_cuda_graph_local_attn_metadata = {
                "local_query_start_loc": zeros(max_virtual_batches + 1),
                "local_seqused_k": zeros(max_virtual_batches),
                "local_block_table": zeros(max_virtual_batches, -(-sc.chunk // ps)),
            }
        if sc.topk > 1:
            decode_length = sc.step_id + 1
            self.draft_decode_metadata_topk_normal = {
                "cache_seqlens": zeros(max_bs),
                "cu_seqlens_q": torch.arange(0, max_bs * sc.topk + 1, sc.topk, dtype=I32, device=dev),
                "cu_seqlens_k": zeros(max_bs + 1),
                "page_table": zeros(max_bs, self.max_context_len),
            }
            self.draft_decode_metadata_topk_expand = {
                "cache_seqlens": torch.full((max_bs * sc.topk,), decode_length, dtype=I32, device=dev),
                "cu_seqlens_q": torch.arange(0, max_bs * sc.topk + 1, dtype=I32, device=dev),
                "cu_seqlens_k": torch.arange(
                    0, max_bs * sc.topk * decode_length + 1, decode_length, dtype=I32, device=dev
                ),
                "page_table": zeros(max_bs * sc.topk, decode_length),
            }
        d = sc.draft_tokens
        if d > 0:
            self.decode_cuda_graph_metadata["page_table_draft_decode"] = zeros(max_bs, max_num_pages)
            self.target_verify_metadata = {
                "cache_seqlens": zeros(max_bs),
                "cu_seqlens_q": torch.arange(0, max_bs * d + 1, d, dtype=I32, device=dev),
                "cu_seqlens_k": zeros(max_bs + 1),
                "page_table": zeros(max_bs, max_num_pages),
                "strided_indices": torch.arange(0, self.max_context_len, ps, device=dev),
            }
            if sc.topk > 1:
                self.target_verify_metadata_topk_normal = {
                    "cache_seqlens": zeros(max_bs),
                    "cu_seqlens_q": torch.arange(0, max_bs * d + 1, d, dtype=I32, device=dev),
                    "cu_seqlens_k": zeros(max_bs + 1),
                    "page_table": zeros(max_bs, self.max_context_len),
                }
                self.target_verify_metadata_topk_expand = {
                    "cache_seqlens": zeros(max_bs * d),
                    "cu_seqlens_k": zeros(max_bs * d + 1),
                    "cu_seqlens_q": torch.arange(0, max_bs * d + 1, dtype=I32, device=dev),
                    "page_table": zeros(max_bs * d, d),
                }

    # ------------------------------------------------------------------ capture
    def capture(self, bs: int, seq_lens: torch.Tensor) -> tuple[GraphMetadata, GraphMetadata | None]:
        """``init_forward_metadata_capture_cuda_graph`` for bucket ``bs`` (``seq_lens``: the runner's buffer)."""
        sc = self.scenario
        if bs > self.max_bs:
            raise ValueError(f"bs: a bucket of {bs} exceeds init_cuda_graph_state's max_bs={self.max_bs}")
        md, mde = GraphMetadata(), None
        if sc.mode == "draft_decode" and sc.topk <= 1:
            buf = self.decode_cuda_graph_metadata
            md.cache_seqlens_int32 = buf["cache_seqlens"][:bs]
            md.max_seq_len_k = int(seq_lens.max()) + sc.step_id + 1
            md.cu_seqlens_q = buf["cu_seqlens_q"][: bs + 1]
            md.cu_seqlens_k = _pad_cumsum(md.cache_seqlens_int32)
            md.page_table = buf["page_table_draft_decode"][:bs, :]
            buf[bs] = md
        elif sc.mode == "draft_decode":
            nb, eb = self.draft_decode_metadata_topk_normal, self.draft_decode_metadata_topk_expand
            md.cache_seqlens_int32 = nb["cache_seqlens"][:bs]
            md.max_seq_len_q, md.max_seq_len_k = sc.topk, int(seq_lens.max())
            md.cu_seqlens_q, md.cu_seqlens_k = nb["cu_seqlens_q"][: bs + 1], nb["cu_seqlens_k"][: bs + 1]
            md.page_table = nb["page_table"][:bs, :]
            n = bs * sc.topk
            mde = GraphMetadata(
                eb["cache_seqlens"][:n], eb["cu_seqlens_q"][: n + 1], eb["cu_seqlens_k"][: n + 1], eb["page_table"][:n]
            )
            nb[bs], eb[bs] = md, mde
        elif sc.mode == "decode":
            md.cache_seqlens_int32 = seq_lens.to(I32)  # the runner's int32 buffer itself (no copy)
            md.cu_seqlens_k = _pad_cumsum(seq_lens)
            md.max_seq_len_k = int(seq_lens.max())
            md.page_table = self.decode_cuda_graph_metadata["page_table"][:bs, :]
            md.cu_seqlens_q = torch.arange(0, len(seq_lens) + 1, dtype=I32, device=seq_lens.device)
            self.decode_cuda_graph_metadata[bs] = md
            if sc.chunk is not None:
                self._update_local_attn_metadata_for_capture(md, len(seq_lens))
        elif sc.mode == "target_verify" and sc.topk <= 1:
            buf, d = self.target_verify_metadata, sc.draft_tokens
            md.cache_seqlens_int32 = buf["cache_seqlens"][:bs]
            md.cache_seqlens_int32.copy_(seq_lens + d)
            md.max_seq_len_q, md.max_seq_len_k = d, int(seq_lens.max()) + d
            md.cu_seqlens_q = torch.arange(0, bs * d + 1, d, dtype=I32, device=seq_lens.device)
            md.cu_seqlens_k, md.page_table = buf["cu_seqlens_k"][: bs + 1], buf["page_table"][:bs, :]
            buf[bs] = md
        elif sc.mode == "target_verify":
            nb, eb, d = (
                self.target_verify_metadata_topk_normal,
                self.target_verify_metadata_topk_expand,
                sc.draft_tokens,
            )
            md.cache_seqlens_int32, md.max_seq_len_q = nb["cache_seqlens"][:bs], d
            md.cu_seqlens_q, md.cu_seqlens_k = nb["cu_seqlens_q"][: bs + 1], nb["cu_seqlens_k"][: bs + 1]
            md.page_table = nb["page_table"][:bs, :]
            n = bs * d
            mde = GraphMetadata(
                eb["cache_seqlens"][:n], eb["cu_seqlens_q"][: n + 1], eb["cu_seqlens_k"][: n + 1], eb["page_table"][:n]
            )
            nb[bs], eb[bs] = md, mde
        else:
            raise ValueError(f"mode must be decode, target_verify or draft_decode, got {sc.mode!r}")
        return md, mde

    # ------------------------------------------------------------------ replay
    def _check_pages(self, name: str, bs: int, max_len: int, table: torch.Tensor, per_page: int) -> int:
        """``max_seq_pages`` of a replay, or ``ValueError`` when the bucket's table cannot hold them."""
        pages = -(-max_len // per_page)
        if pages > table.shape[1]:
            raise ValueError(
                f"{name}: the longest sequence needs {pages} columns ({max_len} tokens) but the bucket bs={bs} "
                f"holds {table.shape[1]} (max_context_len {self.max_context_len}, page_size {self.page_size})"
            )
        return pages

    def normal_decode_set_metadata(self, md: GraphMetadata, req_to_token, req_pool_indices, seq_lens, delta, pages):
        """The seed's ``normal_decode_set_metadata``: lengths, ``cu_seqlens_k[1:]``, the strided page-table columns."""
        assert md.cache_seqlens_int32 is not None and md.cu_seqlens_k is not None and md.page_table is not None
        md.cache_seqlens_int32.copy_(seq_lens + delta)
        md.cu_seqlens_k[1:].copy_(torch.cumsum(md.cache_seqlens_int32, dim=0, dtype=I32))
        strided = self.decode_cuda_graph_metadata["strided_indices"][:pages]
        md.page_table[:, :pages].copy_(req_to_token[req_pool_indices[:, None], strided[None, :]] // self.page_size)

    def replay(
        self,
        bs: int,
        req_to_token: torch.Tensor,
        runner: RunnerBuffers,
        custom_mask: torch.Tensor | None = None,
    ) -> tuple[GraphMetadata, GraphMetadata | None]:
        """``init_forward_metadata_replay_cuda_graph`` for the batch the runner holds (in place); ``custom_mask``:
        the top-k > 1 verify's ``spec_info.custom_mask`` of the real requests."""
        sc = self.scenario
        seq_lens, req_pool_indices = runner.seq_lens[:bs], runner.req_pool_indices[:bs]
        seq_lens_cpu = seq_lens.cpu()
        mde = None
        if sc.mode == "draft_decode" and sc.topk <= 1:
            md = self.decode_cuda_graph_metadata[bs]
            md.max_seq_len_k = int(seq_lens_cpu.max()) + sc.step_id + 1
            pages = self._check_pages("seq_lens", bs, md.max_seq_len_k, md.page_table, self.page_size)
            self.normal_decode_set_metadata(md, req_to_token, req_pool_indices, seq_lens, sc.step_id + 1, pages)
        elif sc.mode == "draft_decode":
            md = self.draft_decode_metadata_topk_normal[bs]
            md.cache_seqlens_int32.copy_(seq_lens)
            md.max_seq_len_k = int(seq_lens_cpu.max())
            md.cu_seqlens_k[1:].copy_(torch.cumsum(md.cache_seqlens_int32, dim=0, dtype=I32))
            self._check_pages("seq_lens", bs, md.max_seq_len_k, md.page_table, 1)
            md.page_table[:, : md.max_seq_len_k].copy_(req_to_token[req_pool_indices, : md.max_seq_len_k])
            mde = self.draft_decode_metadata_topk_expand[bs]
            cache_loc = runner.out_cache_loc.view(-1, sc.num_steps)  # rows (request, branch), columns the steps
            mde.page_table[: cache_loc.shape[0]].copy_(cache_loc[:, : sc.step_id + 1])
        elif sc.mode == "decode":
            md = self.decode_cuda_graph_metadata[bs]
            md.max_seq_len_k = int(seq_lens_cpu.max())
            pages = self._check_pages("seq_lens", bs, md.max_seq_len_k, md.page_table, self.page_size)
            self.normal_decode_set_metadata(md, req_to_token, req_pool_indices, seq_lens, 0, pages)
            self._update_local_attn_metadata_for_replay(md, bs)
        elif sc.mode == "target_verify" and sc.topk <= 1:
            md, d = self.target_verify_metadata[bs], sc.draft_tokens
            md.cache_seqlens_int32.copy_(seq_lens + d)
            md.max_seq_len_k = int(seq_lens_cpu.max()) + d
            md.cu_seqlens_k[1:].copy_(torch.cumsum(md.cache_seqlens_int32, dim=0, dtype=I32))
            pages = self._check_pages("seq_lens", bs, md.max_seq_len_k, md.page_table, self.page_size)
            strided = self.decode_cuda_graph_metadata["strided_indices"][:pages]
            md.page_table[:, :pages].copy_(req_to_token[req_pool_indices[:, None], strided] // self.page_size)
        else:
            md, mde = self._replay_verify_topk(bs, req_to_token, req_pool_indices, runner, custom_mask)
        return md, mde

    def _replay_verify_topk(self, bs, req_to_token, req_pool_indices, runner: RunnerBuffers, custom_mask):
        d = self.scenario.draft_tokens
        seq_lens, seq_lens_cpu = runner.seq_lens[:bs], runner.seq_lens[:bs].cpu()
        if custom_mask is None:
            raise ValueError("spec_info.custom_mask: a top-k > 1 verify replay needs the draft tree's mask")
        md = self.target_verify_metadata_topk_normal[bs]
        md.cache_seqlens_int32.copy_(seq_lens)
        md.max_seq_len_k = int(seq_lens_cpu.max())
        md.cu_seqlens_k[1:].copy_(torch.cumsum(md.cache_seqlens_int32, dim=0, dtype=I32))
        self._check_pages("seq_lens", bs, md.max_seq_len_k + d, md.page_table, 1)
        md.page_table[:, : md.max_seq_len_k].copy_(req_to_token[req_pool_indices, : md.max_seq_len_k])
        mde = self.target_verify_metadata_topk_expand[bs]
        dev = seq_lens.device
        offsets = torch.arange(d, device=dev).unsqueeze(0)
        cols = offsets.expand(seq_lens.numel(), -1) + seq_lens.unsqueeze(1)
        cum_len = torch.nn.functional.pad(torch.cumsum((seq_lens + d).repeat_interleave(d), dim=0), (1, 0))[:-1]
        idx = (cols.repeat_interleave(d, dim=0) + cum_len[:, None]).view(1, -1)
        positions = runner.raw_bs * d  # spec_info.positions.numel(): the real requests' draft tokens
        idx[:, positions * d :].fill_(0)  # padded requests' indices would fall outside the real mask
        mask = custom_mask[idx].view(-1, d)
        col_indices = offsets.expand(mask.shape[0], d)
        _, sort_order = torch.sort(torch.where(mask, col_indices, col_indices + d), dim=1)
        slots = req_to_token[req_pool_indices, :].gather(1, cols.long()).repeat_interleave(d, dim=0)
        mde.page_table.copy_(slots.gather(1, sort_order))
        mde.cache_seqlens_int32.copy_(mask.sum(dim=1))
        mde.cu_seqlens_k[1:].copy_(torch.cumsum(mde.cache_seqlens_int32, dim=0, dtype=I32))
        return md, mde

    # ------------------------------------------------------------------ local attention
    def _update_local_attn_metadata_for_capture(self, md: GraphMetadata, bs: int) -> None:
        sc, buf = self.scenario, self.decode_cuda_graph_local_attn_metadata
        assert sc.chunk is not None and md.cache_seqlens_int32 is not None and md.cu_seqlens_q is not None
        assert md.page_table is not None
        vb = self._virtual_batches(md.cu_seqlens_q.tolist(), md.cache_seqlens_int32.tolist(), md.page_table, bs)
        q_len, k_len = len(vb.cu_seqlens_q_local), len(vb.seqlens_k_local)
        b0 = vb.block_table_local.shape[0] or bs
        b1 = vb.block_table_local.shape[1] or 1
        md.local_attn_metadata = LocalGraphMetadata(
            buf["local_query_start_loc"][:q_len],
            buf["local_seqused_k"][:k_len],
            buf["local_block_table"][:b0, :b1],
            1,
            int(md.cache_seqlens_int32.max()),
        )

    def _virtual_batches(self, cu_q: list[int], lens: list[int], table: torch.Tensor, bs: int):
        sc, buf = self.scenario, self.decode_cuda_graph_local_attn_metadata
        assert sc.chunk is not None
        vb = make_local_attention_virtual_batches(sc.chunk, cu_q, lens, table, self.page_size)
        if len(vb.seqlens_k_local) > buf["local_seqused_k"].shape[0]:
            raise ValueError(
                f"local_seqused_k: {len(vb.seqlens_k_local)} virtual batches exceed the bucket bs={bs}'s "
                f"{buf['local_seqused_k'].shape[0]} (max_bs * ceil(max_context_len / attention_chunk_size))"
            )
        return vb

    def _update_local_attn_metadata_for_replay(self, md: GraphMetadata, bs: int) -> None:
        if self.scenario.chunk is None:
            return
        buf = self.decode_cuda_graph_local_attn_metadata
        q_buf, k_buf, block_buf = buf["local_query_start_loc"], buf["local_seqused_k"], buf["local_block_table"]
        assert md.cache_seqlens_int32 is not None and md.page_table is not None
        seqlens = md.cache_seqlens_int32[:bs]
        max_seq_len = int(seqlens.max())
        vb = self._virtual_batches(list(range(bs + 1)), seqlens.tolist(), md.page_table[:bs, :max_seq_len], bs)
        dev = q_buf.device
        q_local = torch.tensor(vb.cu_seqlens_q_local, dtype=I32, device=dev)
        k_local = torch.tensor(vb.seqlens_k_local, dtype=I32, device=dev)
        table = vb.block_table_local.to(dev)
        q_len, k_len = q_local.shape[0], k_local.shape[0]
        b0, b1 = table.shape
        q_buf[:q_len].copy_(q_local)
        q_buf[q_len:].fill_(0)
        k_buf[:k_len].copy_(k_local)
        k_buf[k_len:].fill_(0)
        block_buf[:b0, :b1].copy_(table)
        block_buf[b0:, :].fill_(0)
        block_buf[:b0, b1:].fill_(0)
        if md.local_attn_metadata is not None:
            md.local_attn_metadata.local_max_query_len = max(vb.seqlens_q_local)
            md.local_attn_metadata.local_max_seq_len = max(vb.seqlens_k_local)
