"""Seed ``003``'s metadata side: SGLang's memory pool and ``init_forward_metadata`` (eager path), as
:class:`SGLangMetadataBuilder`, the base of :class:`~conformance.engines.sglang.runner.SGLangForwardRunner`.

* **The pool and the ForwardBatch** (:meth:`SGLangMetadataBuilder._step`, a :class:`Step`): ``req_to_token``
  (request x position -> token slot ``page * page_size + offset``, pages handed out in a shuffled order, one spare;
  a cross-attention row holds ``[encoder | decoder]`` tokens), ``seq_lens`` (the committed tokens for a verify), the
  top-k verify's ``custom_mask`` built from the draft tree;
* **The builder** (:meth:`~SGLangMetadataBuilder.init_forward_metadata`, written from the seed):
  ``cache_seqlens_int32``, ``cu_seqlens_q``, ``cu_seqlens_k``, the page table ``req_to_token[:, :max_seq_len_k]``
  strided to pages, per mode (EXTEND, MIXED, DECODE, TARGET_VERIFY); the local attention's virtual batches
  (:mod:`conformance.engines.sglang.local`), the top-k verify's expand table from the custom mask
  (:meth:`~SGLangMetadataBuilder._expand_metadata`) and its sliding-window form
  (:meth:`~SGLangMetadataBuilder._swa_spec_metadata`), the encoder page table;
* **Validation** (:meth:`~SGLangMetadataBuilder.check_metadata`): every table the step's calls may read, through
  :func:`~conformance.engines.sglang.local.check_call_metadata` (``ValueError`` naming SGLang's field).

The methods are the engine's (planted bugs and the findings' fixes override them one at a time); the engine supplies
:meth:`~SGLangMetadataBuilder.scenario`, ``check`` and the calls (``_plan_calls``).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field

import torch

from conformance.cases.case import AttentionCase

from ..base import Engine
from ..calls import hand_out_blocks, prefix_sums, token_slots
from .local import VirtualBatches, check_call_metadata, make_local_attention_virtual_batches
from .scenarios import Scenario, tree_paths

__all__ = [
    "ENCODER_FIELDS",
    "LOCAL_FIELDS",
    "MAIN_FIELDS",
    "KCall",
    "SGLMetadata",
    "SGLangMetadataBuilder",
    "Step",
    "prefixed_fields",
]


@dataclass
class SGLMetadata:
    """SGLang's ``FlashAttentionMetadata`` (the fields the replay uses); ``expand`` is the backend's
    ``forward_metadata_spec_decode_expand``; ``local_attn_metadata`` the virtual batches."""

    cache_seqlens_int32: list[int]
    cu_seqlens_q: list[int]
    cu_seqlens_k: list[int] | None
    page_table: torch.Tensor
    max_seq_len_q: int = 1
    max_seq_len_k: int = 0
    encoder_lens_int32: list[int] | None = None
    encoder_cu_seqlens_k: list[int] | None = None
    encoder_page_table: torch.Tensor | None = None
    local_attn_metadata: VirtualBatches | None = None
    swa_spec_metadata: SGLMetadata | None = None
    expand: SGLMetadata | None = None


@dataclass
class KCall:
    """One kernel call: its case, the metadata it reads (paged) or the key spans per request (varlen)."""

    label: str
    case: AttentionCase
    names: tuple[str, str, str, str | None] = ("", "", "", None)
    table: torch.Tensor | None = None
    lens: list[int] | None = None
    cu_q: list[int] = field(default_factory=list)
    cu_k: list[int] | None = None
    spans: list[tuple[int, int]] | None = None


@dataclass
class Step:
    """One forward step: the pool, the ForwardBatch fields the builder reads, the metadata, the calls."""

    scenario: Scenario
    page_size: int
    num_pages: int
    req_to_token: torch.Tensor
    seq_lens: list[int]
    custom_mask: torch.Tensor | None
    metadata: SGLMetadata | None = None
    calls: list[KCall] = field(default_factory=list)
    combine: str = "single"


#: SGLang's names of a call's (table, cache lengths, cu_seqlens_q, cu_seqlens_k) for each table the calls read.
MAIN_FIELDS = ("page_table", "cache_seqlens_int32", "cu_seqlens_q", "cu_seqlens_k")
ENCODER_FIELDS = ("encoder_page_table", "encoder_lens_int32", "cu_seqlens_q", "encoder_cu_seqlens_k")
LOCAL_FIELDS = ("local_block_table", "local_seqused_k", "local_query_start_loc", None)


def prefixed_fields(prefix: str) -> tuple[str, str, str, str]:
    """:data:`MAIN_FIELDS` of a sub-metadata (``expand.``, ``swa_spec_metadata.``)."""
    table, lens, cu_q, cu_k = MAIN_FIELDS
    return prefix + table, prefix + lens, prefix + cu_q, prefix + cu_k


class SGLangMetadataBuilder(Engine):
    """SGLang's pool and ``init_forward_metadata`` for seed 003 (see the module docstring); the engine subclasses it."""

    @abc.abstractmethod
    def scenario(self, case: AttentionCase) -> Scenario:
        """The :class:`~conformance.engines.sglang.scenarios.Scenario` ``case`` names."""

    @abc.abstractmethod
    def _plan_calls(self, case: AttentionCase, st: Step) -> None:
        """Fill ``st.calls`` and ``st.combine`` with the calls the forward makes (the runner's)."""

    # ------------------------------------------------------------------ the builder's hooks (findings' fixes override)
    def local_page_table(self, page_table: torch.Tensor, page_size: int) -> torch.Tensor:
        """The table ``_init_local_attn_metadata`` reads: the metadata's page table *before* it is strided to pages
        (token slots when ``page_size > 1``; see the findings)."""
        return page_table

    def virtual_batches(self, chunk: int, cu_q: list[int], lens: list[int], table: torch.Tensor, page_size: int):
        return make_local_attention_virtual_batches(chunk, cu_q, lens, table, page_size)

    # ------------------------------------------------------------------ pool and ForwardBatch
    def _step(self, case: AttentionCase) -> Step:
        self.check(case)
        sc = self.scenario(case)
        if sc.mode == "target_verify":
            drafts = {r.new for r in sc.requests} | ({len(sc.tree)} if sc.tree else set())
            if len(drafts) != 1:
                raise ValueError(
                    f"requests: every verify request has speculative_num_draft_tokens new tokens, got {drafts}"
                )
        page = sc.page_size
        rows = [r.encoder + r.kv for r in sc.requests]  # req_to_token row: [encoder | decoder] tokens
        gen = torch.Generator().manual_seed(int(case.digest(), 16))
        perm, pages = hand_out_blocks(rows, page, gen)
        num_pages = len(perm)
        r2t = torch.zeros(len(rows), (max(rows) // page + 2) * page, dtype=torch.int32)
        for b, n in enumerate(rows):
            r2t[b, :n] = torch.tensor(token_slots(pages[b], range(n), page), dtype=torch.int32)
        seq_lens = [r.cached if sc.mode == "target_verify" else r.kv for r in sc.requests]
        mask = None
        if sc.tree:  # spec_info.custom_mask: per request (draft, seq_len + draft) row-major, flattened
            paths, d = tree_paths(sc.tree), len(sc.tree)
            mask = torch.cat(
                [
                    torch.tensor([[True] * s + [j in paths[i] for j in range(d)] for i in range(d)]).flatten()
                    for s in seq_lens
                ]
            )
        st = Step(sc, page, num_pages, r2t, seq_lens, mask)
        st.metadata = self.init_forward_metadata(st)
        self.check_metadata(st.metadata, page_size=page, num_pages=num_pages, total_q=case.total_q)
        self._plan_calls(case, st)
        return st

    # ------------------------------------------------------------------ init_forward_metadata
    def init_forward_metadata(self, st: Step) -> SGLMetadata:
        sc, r2t, seq, page = st.scenario, st.req_to_token, st.seq_lens, st.page_size
        bs = len(seq)
        extend = [r.new for r in sc.requests]
        prefix = [r.cached for r in sc.requests]
        mode = "extend" if sc.mode == "mla_prefix" else sc.mode
        if mode == "decode":
            md = SGLMetadata(seq, list(range(bs + 1)), prefix_sums(seq), r2t[:, : max(seq)], 1, max(seq))
            self._init_local(sc, md)
        elif mode == "target_verify" and not sc.tree:  # top-k 1: one causal call over the draft tokens
            d = extend[0]
            lens = [s + d for s in seq]
            md = SGLMetadata(lens, list(range(0, bs * d + 1, d)), prefix_sums(lens), r2t[:, : max(lens)], d, max(lens))
            self._init_local(sc, md)
        elif mode == "target_verify":
            if page != 1:
                raise ValueError(
                    "page_size: top-k > 1 verify builds its expand page table from token slots (req_to_token), "
                    f"a page table only at page size 1, got {page} (SGLang allows it only for other backends)"
                )
            d = len(sc.tree)
            md = SGLMetadata(seq, list(range(0, bs * d + 1, d)), prefix_sums(seq), r2t[:, : max(seq)], d, max(seq))
            md.expand = self._expand_metadata(st, d)
            if sc.window is not None:
                md.swa_spec_metadata = self._swa_spec_metadata(md, md.expand, d)
        elif mode in ("extend", "mixed"):
            cu_k = prefix_sums(seq)
            md = SGLMetadata(seq, cu_k, cu_k, r2t[:, : max(seq)], max(seq), max(seq))
            if any(prefix):
                md.cu_seqlens_q, md.max_seq_len_q = prefix_sums(extend), max(extend)
            if mode == "extend":  # only ForwardMode.EXTEND sets up local attention (not MIXED)
                self._init_local(sc, md)
        else:
            raise ValueError(f"mode must be extend, mixed, decode or target_verify, got {sc.mode!r}")
        if sc.cross:
            enc = [r.encoder for r in sc.requests]
            if len(enc) != 1:
                raise ValueError(f"encoder_lens: 'Only encoder size 1 is supported for now', got {len(enc)}")
            md.encoder_lens_int32, md.encoder_cu_seqlens_k = enc, prefix_sums(enc)
            md.encoder_page_table = r2t[:, : enc[0]]
            md.page_table = r2t[:, enc[0] : enc[0] + md.max_seq_len_k]
        if page > 1:  # strided to pages for FA3 (after the local metadata, and not the encoder table)
            md.page_table = md.page_table[:, ::page] // page
        return md

    def _init_local(self, sc: Scenario, md: SGLMetadata) -> None:
        if sc.chunk is None:
            return
        table = self.local_page_table(md.page_table, sc.page_size)
        md.local_attn_metadata = self.virtual_batches(
            sc.chunk, md.cu_seqlens_q, md.cache_seqlens_int32, table, sc.page_size
        )

    def _expand_metadata(self, st: Step, d: int) -> SGLMetadata:
        """The expand half of the top-k > 1 verify cascade, from the custom mask (the seed's construction)."""
        assert st.custom_mask is not None
        seq = torch.tensor(st.seq_lens, dtype=torch.long)
        offsets = torch.arange(d)[None, :]
        cols = offsets + seq[:, None]  # (bs, d): the draft tokens' positions in req_to_token
        row_start = torch.tensor(prefix_sums((seq + d).repeat_interleave(d).tolist())[:-1])  # each mask row's start
        mask = st.custom_mask[(cols.repeat_interleave(d, dim=0) + row_start[:, None]).flatten()].view(-1, d)
        order = torch.sort(torch.where(mask, offsets, offsets + d), dim=1).indices  # visible draft tokens first
        slots = st.req_to_token.long().gather(1, cols).repeat_interleave(d, dim=0)
        lens = mask.sum(dim=1).tolist()
        n = len(lens)
        return SGLMetadata(lens, list(range(n + 1)), prefix_sums(lens), slots.gather(1, order).to(torch.int32), 1, d)

    def _swa_spec_metadata(self, md: SGLMetadata, exp: SGLMetadata, d: int) -> SGLMetadata:
        """Sliding-window verify without cascade: each draft token over ``prefix + its visible draft tokens``."""
        rows = []
        for r, n in enumerate(exp.cache_seqlens_int32):
            s = md.cache_seqlens_int32[r // d]
            row = torch.zeros(md.max_seq_len_k + exp.page_table.shape[1], dtype=torch.int32)
            row[:s], row[s : s + n] = md.page_table[r // d, :s], exp.page_table[r, :n]
            rows.append(row)
        lens = [md.cache_seqlens_int32[r // d] + n for r, n in enumerate(exp.cache_seqlens_int32)]
        return SGLMetadata(lens, exp.cu_seqlens_q, prefix_sums(lens), torch.stack(rows), 1, max(lens))

    def check_metadata(self, md: SGLMetadata, *, page_size: int, num_pages: int, total_q: int) -> None:
        """Every table the step's calls may read, checked as :func:`check_call_metadata` does (fields named)."""
        kw = dict(page_size=page_size, num_pages=num_pages, total_q=total_q)
        check_call_metadata(MAIN_FIELDS, md.page_table, md.cache_seqlens_int32, md.cu_seqlens_q, md.cu_seqlens_k, **kw)
        if md.encoder_lens_int32 is not None:
            if md.encoder_page_table is None:
                raise ValueError(
                    f"encoder_page_table: encoder_lens_int32 is {md.encoder_lens_int32} but there is no encoder page "
                    "table for cross attention to read"
                )
            check_call_metadata(
                ENCODER_FIELDS,
                md.encoder_page_table,
                md.encoder_lens_int32,
                md.cu_seqlens_q,
                md.encoder_cu_seqlens_k,
                **kw,
            )
        vb = md.local_attn_metadata
        if vb is not None:
            check_call_metadata(
                LOCAL_FIELDS, vb.block_table_local, vb.seqlens_k_local, vb.cu_seqlens_q_local, None, **kw
            )
        for prefix, sub in (("expand.", md.expand), ("swa_spec_metadata.", md.swa_spec_metadata)):
            if sub is not None:
                check_call_metadata(
                    prefixed_fields(prefix),
                    sub.page_table,
                    sub.cache_seqlens_int32,
                    sub.cu_seqlens_q,
                    sub.cu_seqlens_k,
                    **kw,
                )
