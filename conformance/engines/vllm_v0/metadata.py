"""Seed ``002``'s attention metadata: vLLM V0 ``FlashAttentionMetadataBuilder`` rebuilt from a batch description.

:func:`build_metadata` takes one engine step as V0's model runner hands it to the builder (sequences in
scheduler order, each a :class:`Seq` = a :class:`~conformance.engines.base.Request` and whether it is a prompt,
plus the block manager's per-sequence block lists) and returns a :class:`V0Metadata` with the fields the seed's
``FlashAttentionImpl.forward`` reads, computed the way ``_add_seq_group`` and ``build`` compute them:

* ``num_prefills`` / ``num_prefill_tokens`` / ``num_decode_tokens`` in the order given: V0's builder reads the
  first ``num_prefills`` sequences as prefills (``decode_query_lens = query_lens[num_prefills:]``), so prefills
  must come first, as V0's scheduler lays the tokens out (``|prefill_0|...|prefill_N-1|decode_0|...``);
* ``query_start_loc`` and ``seq_start_loc`` (cumulative query and sequence lengths), ``seq_lens`` (context +
  new), ``context_lens``, ``max_query_len``, ``max_decode_query_len`` (1 when there is no decode),
  ``max_prefill_seq_len``, ``max_decode_seq_len``;
* block tables: the sequence's blocks when the batch has a prefix-cache hit, or for decodes and (with chunked
  prefill) prompts; an empty row otherwise; rows padded with block 0 (``make_tensor_with_pad(pad=0)``);
* the slot mapping of the new tokens (positions ``context .. seq_len``) through the block manager's tables,
  with ``PAD_SLOT_ID`` (-1) for a prompt's tokens before ``query_len - sliding_window`` (V0's
  ``compute_slot_mapping_start_idx``, in ``vllm/attention/backends/utils.py``, not in the seed text) and for
  every token when there is no cache (``is_block_tables_empty``);
* encoder / cross fields: ``encoder_seq_lens``, ``encoder_seq_start_loc``, ``max_encoder_seq_len``,
  ``cross_block_tables`` and ``cross_slot_mapping`` (every encoder token through its cross table; the prompt
  step writes the cross cache with it).

The builder trusts its input in vLLM; here bad input raises ``ValueError`` naming the field (block table too
short, prefills after decodes, an encoder length without a cross cache, prefix caching with a sliding window,
...), and :func:`check_metadata` checks a metadata object's own consistency (seq lens that disagree with
``query_start_loc``, block-table rows that do not cover their sequence, ...).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import NoReturn

import torch

from ..base import Request
from ..calls import token_slots

__all__ = ["PAD_SLOT_ID", "Part", "Seq", "V0Metadata", "build_metadata", "check_metadata"]

PAD_SLOT_ID = -1


@dataclass(frozen=True)
class Seq:
    """One sequence of a V0 step: its request and whether it is a prompt (prefill chunk) or a decode."""

    request: Request
    prompt: bool


@dataclass(frozen=True)
class Part:
    """The prefill or decode part of a step (the seed's ``prefill_metadata`` / ``decode_metadata``)."""

    seqs: slice  # metadata rows
    tokens: slice  # query rows of the step
    query_lens: list[int]
    seq_lens: list[int]
    block_tables: torch.Tensor


@dataclass
class V0Metadata:
    """The fields of V0's ``FlashAttentionMetadata`` the seed's forward reads (see the module docstring)."""

    num_prefills: int
    num_prefill_tokens: int
    num_decode_tokens: int
    slot_mapping: torch.Tensor
    seq_lens: list[int]
    seq_lens_tensor: torch.Tensor
    context_lens_tensor: torch.Tensor
    max_query_len: int
    max_decode_query_len: int
    max_prefill_seq_len: int
    max_decode_seq_len: int
    query_start_loc: torch.Tensor
    seq_start_loc: torch.Tensor
    block_tables: torch.Tensor
    block_size: int
    encoder_seq_lens: list[int] | None = None
    encoder_seq_lens_tensor: torch.Tensor | None = None
    encoder_seq_start_loc: torch.Tensor | None = None
    max_encoder_seq_len: int | None = None
    num_encoder_tokens: int | None = None
    cross_slot_mapping: torch.Tensor | None = None
    cross_block_tables: torch.Tensor | None = None

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens)

    @property
    def query_lens(self) -> list[int]:
        loc = [int(x) for x in self.query_start_loc.tolist()]
        return [b - a for a, b in zip(loc, loc[1:])]

    def replace(self, **changes) -> "V0Metadata":
        return dataclasses.replace(self, **changes)

    def prefill_part(self) -> Part | None:
        """The first ``num_prefills`` sequences and ``num_prefill_tokens`` tokens; None without prefills."""
        if self.num_prefills == 0:
            return None
        n = self.num_prefills
        return Part(
            slice(0, n),
            slice(0, self.num_prefill_tokens),
            self.query_lens[:n],
            self.seq_lens[:n],
            self.block_tables[:n],
        )

    def decode_part(self) -> Part | None:
        """The sequences after the prefills (``query_start_loc`` rebased to the first decode token)."""
        if self.num_decode_tokens == 0:
            return None
        n, t = self.num_prefills, self.num_prefill_tokens
        return Part(
            slice(n, self.num_seqs),
            slice(t, t + self.num_decode_tokens),
            self.query_lens[n:],
            self.seq_lens[n:],
            self.block_tables[n:],
        )


def _fail(msg: str) -> NoReturn:
    raise ValueError(msg)


def _check_tables(name: str, tables: Sequence[Sequence[int]], lens: Sequence[int], block_size: int) -> None:
    if len(tables) != len(lens):
        _fail(f"{name} must hold one row per sequence ({len(lens)}), got {len(tables)}")
    for i, (row, n) in enumerate(zip(tables, lens)):
        if any(int(b) < 0 for b in row):
            _fail(f"{name}[{i}] holds a negative block id: {list(row)}")
        if len(row) * block_size < n:
            _fail(
                f"{name}[{i}] is too short: {len(row)} blocks of {block_size} = {len(row) * block_size} slots "
                f"for {n} tokens"
            )


def _check_inputs(
    seqs: Sequence[Seq],
    block_tables: Sequence[Sequence[int]] | None,
    block_size: int,
    chunked_prefill: bool,
    sliding_window: int | None,
    cross_block_tables: Sequence[Sequence[int]] | None,
) -> None:
    if not seqs:
        _fail("seqs must hold at least one sequence")
    if block_size <= 0 or block_size % 16:
        _fail(f"block_size must be a positive multiple of 16 (V0 get_kv_cache_shape), got {block_size}")
    if sliding_window is not None and sliding_window < 1:
        _fail(f"sliding_window must be None or >= 1 (keys a token sees, itself included), got {sliding_window}")
    for i, s in enumerate(seqs):
        r = s.request
        if r.new < 1 or r.cached < 0 or r.encoder < 0:
            _fail(f"seqs[{i}].request must have new >= 1, cached >= 0, encoder >= 0, got {r}")
        if not s.prompt and r.cached == 0:
            _fail(f"seqs[{i}]: a decode needs cached context (context_len > 0), got {r}")
        if s.prompt and r.cached and sliding_window is not None:
            _fail(
                f"sliding_window: V0 does not combine prefix caching with a sliding window "
                f"(seqs[{i}] is a prompt with {r.cached} cached tokens)"
            )
    prompts = [s.prompt for s in seqs]
    first_decode = prompts.index(False) if False in prompts else len(prompts)
    if True in prompts[first_decode:]:
        late = first_decode + prompts[first_decode:].index(True)
        _fail(
            f"is_prompt: V0's builder reads the first num_prefills sequences as prefills, so prefills come first; "
            f"seqs[{first_decode}] is a decode and seqs[{late}] a prefill"
        )
    if any(prompts) and not all(prompts) and not chunked_prefill:
        _fail("chunked_prefill: V0 schedules prefills and decodes in one step only with chunked prefill enabled")
    encoder = [s.request.encoder for s in seqs]
    if any(encoder) and any(prompts) and not all(prompts):
        _fail("is_prompt: V0's encoder-decoder runner does not mix prefills and decodes in one step")
    if block_tables is not None:
        _check_tables("block_tables", block_tables, [s.request.kv for s in seqs], block_size)
    if any(encoder):
        if cross_block_tables is None:
            i = next(i for i, e in enumerate(encoder) if e)
            _fail(
                f"cross_block_tables: seqs[{i}] has {encoder[i]} encoder tokens but the step has no cross-attention "
                "cache (cross_block_tables is None)"
            )
        _check_tables("cross_block_tables", cross_block_tables, encoder, block_size)


def _padded(rows: Sequence[Sequence[int]], device) -> torch.Tensor:
    """``make_tensor_with_pad(rows, pad=0, dtype=torch.int)``."""
    width = max((len(r) for r in rows), default=0)
    out = torch.zeros(len(rows), width, dtype=torch.int32)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(list(r), dtype=torch.int32)
    return out.to(device)


def build_metadata(
    seqs: Sequence[Seq],
    block_tables: Sequence[Sequence[int]] | None,
    *,
    block_size: int,
    chunked_prefill: bool = False,
    sliding_window: int | None = None,
    cross_block_tables: Sequence[Sequence[int]] | None = None,
    device: torch.device | str = "cpu",
) -> V0Metadata:
    """V0's metadata of one step (see the module docstring); ``ValueError`` names the bad field.

    Args:
        seqs: the step's sequences in scheduler order (prefills first).
        block_tables: the block manager's blocks of each sequence's self-attention cache, covering its
            ``cached + new`` tokens; None when the model has no KV cache (every slot ``PAD_SLOT_ID``).
        block_size: tokens per block (a multiple of 16).
        chunked_prefill: whether prompts get their block tables (V0's ``chunked_prefill_enabled``).
        sliding_window: the model's window ``w`` (keys a token sees, itself included), or None.
        cross_block_tables: blocks of each sequence's cross-attention cache (encoder-decoder models).
    """
    _check_inputs(seqs, block_tables, block_size, chunked_prefill, sliding_window, cross_block_tables)
    prefix_cache_hit = any(s.prompt and s.request.cached > 0 for s in seqs)
    num_prefills = num_prefill_tokens = num_decode_tokens = 0
    prefill_seq_lens: list[int] = []
    decode_seq_lens: list[int] = []
    rows: list[list[int]] = []
    slot_mapping: list[int] = []
    for b, s in enumerate(seqs):
        r = s.request
        if s.prompt:
            num_prefills += 1
            num_prefill_tokens += r.new
            prefill_seq_lens.append(r.kv)
        else:
            num_decode_tokens += r.new
            decode_seq_lens.append(r.kv)
        own = [] if block_tables is None else [int(x) for x in block_tables[b]]
        rows.append(own if prefix_cache_hit or chunked_prefill or not s.prompt else [])
        if block_tables is None:  # no cache (profile run / encoder-only model): nothing is written
            slot_mapping += [PAD_SLOT_ID] * r.new
            continue
        start = max(0, r.new - sliding_window) if s.prompt and sliding_window is not None else 0
        slot_mapping += [PAD_SLOT_ID] * max(0, start - r.cached)
        slot_mapping += token_slots(own, range(max(start, r.cached), r.kv), block_size)
    query_lens = [s.request.new for s in seqs]
    seq_lens = [s.request.kv for s in seqs]
    decode_query_lens = query_lens[num_prefills:]
    dev = torch.device(device)

    def ints(values, dtype=torch.int32) -> torch.Tensor:
        return torch.tensor(list(values), dtype=dtype, device=dev)

    meta = V0Metadata(
        num_prefills=num_prefills,
        num_prefill_tokens=num_prefill_tokens,
        num_decode_tokens=num_decode_tokens,
        slot_mapping=ints(slot_mapping, torch.int64),
        seq_lens=seq_lens,
        seq_lens_tensor=ints(seq_lens),
        context_lens_tensor=ints(s.request.cached for s in seqs),
        max_query_len=max(query_lens),
        max_decode_query_len=max(decode_query_lens) if decode_query_lens else 1,
        max_prefill_seq_len=max(prefill_seq_lens, default=0),
        max_decode_seq_len=max(decode_seq_lens, default=0),
        query_start_loc=ints(accumulate(query_lens, initial=0)),
        seq_start_loc=ints(accumulate(seq_lens, initial=0)),
        block_tables=_padded(rows, dev),
        block_size=block_size,
    )
    encoder = [s.request.encoder for s in seqs]
    if any(encoder):
        assert cross_block_tables is not None  # checked above
        meta.encoder_seq_lens = encoder
        meta.encoder_seq_lens_tensor = ints(encoder)
        meta.encoder_seq_start_loc = ints(accumulate(encoder, initial=0))
        meta.max_encoder_seq_len = max(encoder)
        meta.num_encoder_tokens = sum(encoder)
        meta.cross_block_tables = _padded(cross_block_tables, dev)
        cross = [x for t, e in zip(cross_block_tables, encoder) for x in token_slots(t, range(e), block_size)]
        meta.cross_slot_mapping = ints(cross, torch.int64)
    check_metadata(meta)
    return meta


def _int_list(name: str, t: torch.Tensor) -> list[int]:
    if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.dtype.is_floating_point:
        _fail(f"{name} must be a 1-D integer tensor, got {getattr(t, 'shape', type(t).__name__)}")
    return [int(x) for x in t.tolist()]


def _check_rows(name: str, table: torch.Tensor | None, lens: list[int], block_size: int) -> None:
    if table is None or table.dim() != 2 or table.shape[0] != len(lens):
        _fail(f"{name} must be a ({len(lens)}, max_blocks) tensor, got {getattr(table, 'shape', None)}")
    assert table is not None
    if table.shape[1] and table.shape[1] * block_size < max(lens, default=0):
        b = max(range(len(lens)), key=lambda i: lens[i])
        _fail(f"{name} has {table.shape[1]} columns of {block_size} slots, too short for row {b} ({lens[b]} tokens)")


def check_metadata(meta: V0Metadata) -> None:
    """Raise ``ValueError`` naming the field if ``meta`` is not self-consistent (see the module docstring)."""
    n = len(meta.seq_lens)
    loc = _int_list("query_start_loc", meta.query_start_loc)
    if len(loc) != n + 1 or loc[0] != 0 or any(b < a for a, b in zip(loc, loc[1:])):
        _fail(f"query_start_loc must be [0, ...] non-decreasing with {n + 1} entries (one per sequence + 1), got {loc}")
    total = meta.num_prefill_tokens + meta.num_decode_tokens
    if loc[-1] != total:
        _fail(f"query_start_loc ends at {loc[-1]} but the step has {total} query tokens (prefill + decode)")
    if not 0 <= meta.num_prefills <= n or loc[meta.num_prefills] != meta.num_prefill_tokens:
        _fail(
            f"num_prefill_tokens ({meta.num_prefill_tokens}) must be query_start_loc[num_prefills = "
            f"{meta.num_prefills}]"
        )
    ctx = _int_list("context_lens_tensor", meta.context_lens_tensor)
    if len(ctx) != n:
        _fail(f"context_lens_tensor must hold {n} entries (one per sequence), got {len(ctx)}")
    qlens = [b - a for a, b in zip(loc, loc[1:])]
    for b, (sl, ql, c) in enumerate(zip(meta.seq_lens, qlens, ctx)):
        if sl != c + ql:
            _fail(
                f"seq_lens[{b}] = {sl} disagrees with query_start_loc (query_len {ql}) and context_lens_tensor "
                f"({c}): seq_len must be context_len + query_len"
            )
    if _int_list("seq_lens_tensor", meta.seq_lens_tensor) != list(meta.seq_lens):
        _fail(f"seq_lens_tensor must equal seq_lens {list(meta.seq_lens)}")
    if _int_list("seq_start_loc", meta.seq_start_loc) != list(accumulate(meta.seq_lens, initial=0)):
        _fail("seq_start_loc must be the cumulative seq_lens")
    want = max(qlens[meta.num_prefills :], default=1)
    if meta.max_decode_query_len != want:
        _fail(f"max_decode_query_len must be {want} (the longest decode query, 1 without decodes)")
    _check_rows("block_tables", meta.block_tables, list(meta.seq_lens), meta.block_size)
    if meta.slot_mapping.numel() != total:
        _fail(f"slot_mapping must hold one slot per query token ({total}), got {meta.slot_mapping.numel()}")
    enc = meta.encoder_seq_lens
    if enc is not None:
        if len(enc) != n:
            _fail(f"encoder_seq_lens must hold {n} entries (one per sequence), got {len(enc)}")
        if any(enc) and meta.cross_block_tables is None:
            _fail("cross_block_tables: encoder tokens without a cross-attention cache")
        _check_rows("cross_block_tables", meta.cross_block_tables, list(enc), meta.block_size)
        if meta.cross_slot_mapping is None or meta.cross_slot_mapping.numel() != sum(enc):
            _fail(f"cross_slot_mapping must hold one slot per encoder token ({sum(enc)})")
