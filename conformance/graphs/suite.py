"""Suite ``graphs``: CUDA-graph replays and invariance checks of the kernels, in the configurations engines serve.

Graph cases (:mod:`conformance.graphs.replay`) capture a decode or speculative-verify call on a bucket and replay
it for four batches: the capture batch, a smaller batch with a longer and a tiny request (padded rows), a full
batch of other lengths, and one request alone.  The configurations are those of the seeds' CUDA-graph paths:

* vLLM V1 (seed 001): FA3 with AOT scheduler metadata (``sched_meta``), ``num_splits`` left to the metadata or
  pinned to 1 (batch-invariant mode), padded ``seq_lens`` at 0; the same with a 128-key sliding window and sinks
  (gpt-oss's local layers);
* vLLM V0 and SGLang (seeds 002, 000, 003): ``flash_attn_with_kvcache`` decode over pages of 256 (FA2's page
  multiple) and 16, SGLang's fill value 1, a soft-capped layer (Gemma 2), a 3-token target verify;
* MLA absorbed decode (DeepSeek V3's rope 64 and latent 512 over pages of 64, at 16 heads: its 128 heads
  sharded over tensor parallelism 8; FlashMLA and FA3 ``qv``).

Invariance cases (:mod:`conformance.graphs.invariance`): run to run, batch composition (with ``num_splits`` left
to the kernel and pinned to 1) and split count, for a GQA decode batch, a mixed prefill + decode batch and MLA;
and a growing neighbour (``neighbour``, ``num_splits`` pinned to 1) at every head dim FA3 compiles a template for
(64, 96, 128, 192, 256; ``hopper/generate_kernels.py`` of flash-attention), a decode and a 64-token prefill target
over 3,000 keys (enough for the split heuristic to split), pages of 64 and 16 and contiguous keys.

An engine author adds their own buckets by building cases like these (``graph`` = the batch sizes of the
replays, capture first; ``graph_fill`` = their padded ``seq_lens`` value) and running them with
``attnconf run --case-json``; ``graph_cases(batches=...)`` takes other replay batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypedDict

from conformance.cases.case import AttentionCase

__all__ = ["DEFAULT_BATCHES", "graph_cases", "graphs_suite", "invariance_cases", "neighbour_cases", "small_cases"]

#: The head dims FA3 (hopper/) compiles a forward template for; a split or tile heuristic may differ at each.
TEMPLATE_HEAD_DIMS = (64, 96, 128, 192, 256)

#: DeepSeek V3's 128 query heads (config.json ``num_attention_heads``) at tensor parallelism 8.
MLA_HEADS = 128 // 8

#: Key counts of the four replay batches (capture first): shorter and longer requests within one bucket, a
#: batch smaller than the bucket (its rows padded), a full batch of other lengths, one request alone.
DEFAULT_BATCHES: tuple[tuple[int, ...], ...] = (
    (300, 41, 1000, 7),
    (1290, 3),
    (64, 700, 129, 900),
    (1,),
)


class _Shape(TypedDict, total=False):
    """Head counts, head dims, dtype and mask that a group of cases shares (a dict of keyword arguments of
    :class:`AttentionCase`)."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    head_dim_v: int
    qv: bool
    dtype: str
    causal: bool


class _Layout(TypedDict, total=False):
    """A paged KV cache's layout and block size (keyword arguments of :class:`AttentionCase`; empty: contiguous)."""

    kv_layout: str
    block_size: int


class _Paged(_Shape, _Layout, total=False):
    """A shape and a layout in one dict."""


def _requests(batches: Sequence[Sequence[int]], q_len: int) -> tuple[tuple[int, ...], tuple[tuple[int, int], ...]]:
    sizes = tuple(len(b) for b in batches)
    reqs = tuple((q_len, max(kv, q_len)) for b in batches for kv in b)
    return sizes, reqs


def graph_cases(batches: Sequence[Sequence[int]] = DEFAULT_BATCHES) -> list[AttentionCase]:
    """The kernel-level graph cases over replay ``batches`` (key counts per batch, the capture batch first)."""
    dec_sizes, dec = _requests(batches, 1)
    ver_sizes, ver = _requests(batches, 3)
    gqa = _Shape(num_heads=32, num_kv_heads=8, head_dim=128, dtype="bf16", causal=True)
    mla = _Shape(num_heads=MLA_HEADS, num_kv_heads=1, head_dim=64, head_dim_v=512, qv=True, dtype="bf16", causal=True)
    nhd16 = _Layout(kv_layout="NHD", block_size=16)
    out = [
        # vLLM V1 (seed 001): FA3 + AOT scheduler metadata, padded seq_lens 0; splits from the metadata / pinned 1
        AttentionCase(dec, graph=dec_sizes, scheduler_metadata=True, **gqa, **nhd16),
        AttentionCase(dec, graph=dec_sizes, scheduler_metadata=True, num_splits=1, **gqa, **nhd16),
        AttentionCase(dec, graph=dec_sizes, window=(127, 0), sinks=True, **gqa, **nhd16),
        AttentionCase(dec, graph=dec_sizes, **gqa, kv_layout="HND", block_size=16),
        # vLLM V0 / SGLang (seeds 002, 000, 003): kvcache decode, pages of 256 and 16, fill 1, soft-cap, verify
        AttentionCase(dec, graph=dec_sizes, graph_fill=1, **gqa, kv_layout="NHD", block_size=256),
        AttentionCase(dec, graph=dec_sizes, graph_fill=1, softcap=50.0, **gqa, kv_layout="NHD", block_size=256),
        AttentionCase(dec, graph=dec_sizes, graph_fill=1, num_splits=1, **gqa, **nhd16),
        AttentionCase(dec, graph=dec_sizes, graph_fill=1, num_splits=1, **gqa, kv_layout="NHD", block_size=256),
        AttentionCase(ver, graph=ver_sizes, graph_fill=1, **gqa, **nhd16),
        AttentionCase(ver, graph=ver_sizes, graph_fill=1, **gqa, kv_layout="NHD", block_size=256),
        # MLA absorbed decode (DeepSeek V3): FlashMLA's pages of 64 and FA3 qv
        AttentionCase(dec, graph=dec_sizes, **mla, kv_layout="NHD", block_size=64),
        AttentionCase(dec, graph=dec_sizes, graph_fill=1, **mla, kv_layout="NHD", block_size=64),
    ]
    return out


def invariance_cases() -> list[AttentionCase]:
    """Run-to-run, batch-composition and split-count cases (paged decode, mixed batches, MLA)."""
    gqa = _Shape(num_heads=32, num_kv_heads=8, head_dim=128, dtype="bf16", causal=True)
    mla = _Shape(num_heads=MLA_HEADS, num_kv_heads=1, head_dim=64, head_dim_v=512, qv=True, dtype="bf16", causal=True)
    decode = ((1, 3000), (1, 17), (1, 800), (1, 1500))
    mixed = ((1, 2000), (200, 200), (1, 90), (64, 600))
    out = []
    for layout in (_Layout(kv_layout="NHD", block_size=16), _Layout(kv_layout="NHD", block_size=256)):
        out += [
            AttentionCase(decode, invariance="run", **gqa, **layout),
            AttentionCase(decode, invariance="batch", **gqa, **layout),
            AttentionCase(decode, invariance="batch", num_splits=1, **gqa, **layout),
            AttentionCase(decode[:2], invariance="splits", **gqa, **layout),
        ]
    out += [
        AttentionCase(mixed, invariance="run", **gqa),
        AttentionCase(mixed, invariance="batch", **gqa),
        AttentionCase(mixed, invariance="batch", num_splits=1, **gqa),
        AttentionCase(decode, invariance="run", **mla, kv_layout="NHD", block_size=64),
        AttentionCase(decode, invariance="batch", **mla, kv_layout="NHD", block_size=64),
    ]
    return out


def neighbour_cases() -> list[AttentionCase]:
    """``neighbour`` invariance with ``num_splits`` pinned to 1 (the batch-invariant promise): a decode and a 64-token
    prefill target of 3,000 keys beside a 129-token prefill of 1,100 keys, at every FA3 template head dim over pages
    of 64; at head dim 64 (vLLM #51902's 14 query / 2 KV heads) also over pages of 16 and contiguous keys."""
    out = []
    layouts = {
        64: (_Layout(kv_layout="NHD", block_size=64), _Layout(kv_layout="NHD", block_size=16), _Layout()),
    }
    for d in TEMPLATE_HEAD_DIMS:
        num_heads, num_kv_heads = (14, 2) if d == 64 else (32, 8)
        for layout in layouts.get(d, (_Layout(kv_layout="NHD", block_size=64),)):
            for target in ((1, 3000), (64, 3000)):
                out.append(
                    AttentionCase(
                        (target, (129, 1100)),
                        invariance="neighbour",
                        num_splits=1,
                        num_heads=num_heads,
                        num_kv_heads=num_kv_heads,
                        head_dim=d,
                        dtype="bf16",
                        causal=True,
                        **layout,
                    )
                )
    return out


def small_cases() -> list[AttentionCase]:
    """A few small graph and invariance cases for suites ``smoke`` and ``default`` (every feature there): a decode
    bucket replayed for smaller, longer and padded batches, with and without a pinned split count, a verify
    bucket, and each invariance, at most 300 keys a request."""
    gqa = _Paged(num_heads=8, num_kv_heads=2, head_dim=64, dtype="bf16", causal=True, kv_layout="NHD", block_size=16)
    batches = ((120, 17, 260), (290, 3), (40, 200, 9), (1,))
    sizes, dec = _requests(batches, 1)
    _, ver = _requests(batches, 3)
    decode = ((1, 300), (1, 17), (1, 120), (1, 64))
    return [
        AttentionCase(dec, graph=sizes, batch_name="graphsmall", **gqa),
        AttentionCase(dec, graph=sizes, graph_fill=1, num_splits=1, batch_name="graphsmall", **gqa),
        AttentionCase(ver, graph=sizes, graph_fill=1, batch_name="graphsmall", **gqa),
        AttentionCase(decode, invariance="run", batch_name="invsmall", **gqa),
        AttentionCase(decode, invariance="batch", num_splits=1, batch_name="invsmall", **gqa),
        AttentionCase(decode[:2], invariance="splits", batch_name="invsmall", **gqa),
        AttentionCase(((1, 300), (17, 40)), invariance="neighbour", num_splits=1, batch_name="invsmall", **gqa),
    ]


def graphs_suite() -> list[AttentionCase]:
    """Suite ``graphs``: the graph cases, then the invariance cases, then the growing-neighbour cases."""
    return graph_cases() + invariance_cases() + neighbour_cases()
