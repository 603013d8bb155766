"""Seed ``003``'s chunked local attention: SGLang's "virtual batches", and the checks of a paged call's metadata.

Chunked local attention (Llama 4's iRoPE layers, ``attention_chunk_size`` C): a query at position ``p`` sees the
keys of its own chunk ``[p - p mod C, p]``.  SGLang's FlashAttention backend does not pass the chunk to the kernel;
``make_local_attention_virtual_batches`` (copied by SGLang from vLLM's V1 backend) cuts every request into one
"virtual" request per chunk its queries touch, each a plain causal attention over that chunk's keys through its own
rows of the block table.  :func:`make_local_attention_virtual_batches` here is written from the seed's docstring and
comments (not copied): for a request with ``q`` queries and ``s`` keys (queries at positions ``s - q .. s - 1``):

* the first virtual batch takes the queries up to the end of the chunk of position ``s - q``:
  ``min(C - (s - q) mod C, q)``; the others take ``min(C, remaining)``;
* every virtual batch but the last reads ``C`` keys; the last reads ``s mod C`` (``C`` when ``s`` is a multiple);
  virtual batch ``i`` of ``n`` starts at key ``s - last - C (n - 1 - i)``;
* its block-table row is the request's row from page ``start // page_size``, ``C // page_size`` pages wide, the
  column indices clipped to the table's width (SGLang's guard against reading past the table);
* SGLang first adjusts the chunk: ``min(C, max(seq_lens))`` rounded down to a multiple of ``page_size`` (at least
  one page).  With ``page_size`` 1 this changes nothing; with larger pages and a batch whose longest sequence is
  shorter than C and not a page multiple it *shrinks* the chunk, so a request is cut where the model has no chunk
  boundary (``adjust_chunk=False`` leaves it out; sglang PR 32902 removed the adjustment).

The seed's docstring example (chunk 4, ``q_seqlens [4, 10, 5]``, ``kv_seqlens [6, 17, 9]``, page size 2) is
reproduced number for number by ``tests/conformance/engines/test_sglang_fa.py``, with one exception: the docstring
prints ``cu_seqlens_q_local = [0, 4, 6, 10, 14, 18, 19, 23, 24]``, which is the prefix sum of ``seqlens_k_local``;
the function (SGLang's and this one) returns the prefix sum of ``seqlens_q_local``, ``[0, 2, 4, 5, 9, 13, 14, 18,
19]``.

:func:`check_call_metadata` is the validation every paged call of the replay goes through before the kernel sees
it, raising ``ValueError`` that names SGLang's field (``page_table``, ``cache_seqlens_int32``, ``cu_seqlens_q``,
``cu_seqlens_k``, ``encoder_page_table``, ``local_block_table``, ...).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from conformance.cases.paged_kv import prefix_sums

__all__ = ["VirtualBatches", "check_call_metadata", "effective_chunk_size", "make_local_attention_virtual_batches"]


def _ints(name: str, values: Sequence[int] | torch.Tensor) -> list[int]:
    if isinstance(values, torch.Tensor):
        if values.dim() != 1:
            raise ValueError(f"{name} must be 1-D, got shape {tuple(values.shape)}")
        return [int(x) for x in values.tolist()]
    return [int(x) for x in values]


@dataclass(frozen=True)
class VirtualBatches:
    """What ``make_local_attention_virtual_batches`` returns (SGLang's ``LocalAttentionMetadata`` inputs), plus the
    key start and the request of every virtual batch and the chunk size in force."""

    seqlens_q_local: list[int]
    cu_seqlens_q_local: list[int]
    seqlens_k_local: list[int]
    block_table_local: torch.Tensor
    k_starts: list[int]
    requests: list[int]
    chunk: int


def effective_chunk_size(attn_chunk_size: int, max_seq_len: int, page_size: int) -> int:
    """SGLang's adjustment: ``min(C, max_seq_len)`` rounded down to a multiple of ``page_size``, at least one page."""
    chunk = min(attn_chunk_size, max_seq_len) // page_size * page_size
    return max(chunk, page_size)


def make_local_attention_virtual_batches(
    attn_chunk_size: int,
    query_start_loc: Sequence[int] | torch.Tensor,
    seq_lens: Sequence[int] | torch.Tensor,
    block_table: torch.Tensor,
    page_size: int,
    *,
    adjust_chunk: bool = True,
) -> VirtualBatches:
    """Requests cut into one virtual request per local-attention chunk (see the module docstring).

    Args:
        attn_chunk_size: the layer's chunk C.
        query_start_loc: ``cu_seqlens_q`` of the batch (``b + 1`` entries).
        seq_lens: keys of each request, its queries included (``cache_seqlens_int32``).
        block_table: ``(b, columns)`` table the virtual rows are cut from, read as pages of ``page_size``.
        page_size: the cache's page size.
        adjust_chunk: apply SGLang's :func:`effective_chunk_size` (True, as the seed does).
    """
    cu_q, lens = _ints("query_start_loc", query_start_loc), _ints("seq_lens", seq_lens)
    if len(cu_q) != len(lens) + 1:
        raise ValueError(f"query_start_loc must have len(seq_lens) + 1 = {len(lens) + 1} entries, got {len(cu_q)}")
    if page_size < 1 or attn_chunk_size < 1:
        raise ValueError(f"attn_chunk_size and page_size must be positive, got {attn_chunk_size}, {page_size}")
    chunk = effective_chunk_size(attn_chunk_size, max(lens), page_size) if adjust_chunk else attn_chunk_size
    if chunk % page_size:
        raise ValueError(f"attn_chunk_size {chunk} is not divisible by page_size {page_size}")
    pages = chunk // page_size
    q_local: list[int] = []
    k_local: list[int] = []
    k_starts: list[int] = []
    owner: list[int] = []
    for r, s in enumerate(lens):
        q = cu_q[r + 1] - cu_q[r]
        if q <= 0 or q > s:
            raise ValueError(f"query_start_loc: request {r} has {q} queries for {s} keys (SGLang assumes 0 < q <= s)")
        first = min(chunk - (s - q) % chunk, q)
        n = 1 + -(-(q - first) // chunk)
        last = s % chunk or chunk
        for i in range(n):
            q_local.append(first if i == 0 else min(chunk, q - first - chunk * (i - 1)))
            k_local.append(chunk if i < n - 1 else last)
            k_starts.append(s - last - chunk * (n - 1 - i))
            owner.append(r)
    width = block_table.shape[1]
    cols = torch.tensor(
        [[min(start // page_size + j, width - 1) for j in range(pages)] for start in k_starts], dtype=torch.long
    )
    rows = torch.tensor(owner, dtype=torch.long)[:, None].expand(-1, pages)
    table = block_table[rows.to(block_table.device), cols.to(block_table.device)]
    return VirtualBatches(q_local, prefix_sums(q_local), k_local, table, k_starts, owner, chunk)


def check_call_metadata(
    names: tuple[str, str, str, str | None],
    page_table: torch.Tensor | None,
    cache_seqlens: Sequence[int] | None,
    cu_seqlens_q: Sequence[int],
    cu_seqlens_k: Sequence[int] | None,
    *,
    page_size: int,
    num_pages: int,
    total_q: int,
) -> None:
    """Check one paged call's metadata before the kernel reads it; ``ValueError`` names the SGLang field.

    ``names`` are the fields' names in SGLang (table, cache lengths, ``cu_seqlens_q``, ``cu_seqlens_k`` or None when
    the call passes no ``cu_seqlens_k_new``).  Checked: the query offsets cover the step's ``total_q`` rows; the key
    offsets are the prefix sums of the cache lengths; the table has a row per sequence and, per row, the pages its
    length needs, each a page id of the cache (``0 <= id < num_pages``).
    """
    t_name, l_name, q_name, k_name = names
    if page_table is None:
        raise ValueError(f"{t_name}: the call needs a page table, got None")
    if cache_seqlens is None:
        raise ValueError(f"{l_name}: the call needs cache lengths, got None")
    lens, cu_q = _ints(l_name, cache_seqlens), _ints(q_name, cu_seqlens_q)
    if len(cu_q) != len(lens) + 1 or cu_q[0] != 0 or any(b < a for a, b in zip(cu_q, cu_q[1:])):
        raise ValueError(f"{q_name} must be {len(lens) + 1} non-decreasing offsets from 0, got {cu_q}")
    if cu_q[-1] != total_q:
        raise ValueError(f"{q_name} ends at {cu_q[-1]} but the step has {total_q} query rows")
    if any(n < 0 for n in lens):
        raise ValueError(f"{l_name} must be non-negative, got {lens}")
    if k_name is not None and cu_seqlens_k is not None:
        cu_k = _ints(k_name, cu_seqlens_k)
        if cu_k != prefix_sums(lens):
            raise ValueError(
                f"{k_name} {cu_k} disagrees with {l_name} {lens}: it must be their prefix sums {prefix_sums(lens)}"
            )
    if page_table.dim() != 2 or page_table.shape[0] != len(lens):
        raise ValueError(f"{t_name} must be ({len(lens)}, pages), one row per sequence, got {tuple(page_table.shape)}")
    width = page_table.shape[1]
    table = page_table.tolist()
    for r, n in enumerate(lens):
        need = -(-n // page_size)
        if need > width:
            raise ValueError(
                f"{t_name} is too short: {l_name}[{r}] = {n} needs {need} pages of {page_size}, "
                f"the table has {width} columns"
            )
        for c in range(need):
            if not 0 <= table[r][c] < num_pages:
                raise ValueError(
                    f"{t_name}[{r}, {c}] = {table[r][c]} is not a page id of the cache (0 <= id < {num_pages})"
                )
