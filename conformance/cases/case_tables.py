"""The vocabulary of the case model (:mod:`conformance.cases.case`): the dtypes, KV layouts, quantization modes and
descale granularities a case may name, every feature a case can exercise (:data:`FEATURES`, what backends declare
support for) and the ones an adapter must opt into (:data:`OPT_IN_FEATURES`).  Data, not logic; the case's
validation reads it, the rows of :mod:`conformance.cases.fields` say which field turns on which feature.

Importing it does not import torch (``attnconf --help`` lists the features): :data:`DTYPES`, the one table that
holds torch objects, is built on first access (PEP 562).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["DATA", "DESCALES", "DTYPES", "FEATURES", "LAYOUTS", "OPT_IN_FEATURES", "QUANTS"]

#: The dtypes a case may name, by name (``{"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}``).
DTYPES: dict[str, torch.dtype]


def __getattr__(name: str) -> Any:
    if name == "DTYPES":
        import torch

        table = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
        globals()["DTYPES"] = table  # later reads find it without this hook
        return table
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


LAYOUTS = ("contiguous", "NHD", "HND")
#: Quantization modes: which tensors are stored in which format (the case's ``quant`` field).
QUANTS: dict[str, str] = {
    "none": "q, k, v in the activation dtype",
    "fp8_e4m3": "k, v (and q, qv unless quant_q is False) fp8 e4m3 with fp32 descales",
    "fp8_e5m2": "k, v (and q, qv unless quant_q is False) fp8 e5m2 with fp32 descales",
    "int8_t1": "seed 001 type 1: int8 q, k per token and head; int8 v with a static per-channel scale",
    "int8_t2": "seed 001 type 2: int8 q, k per token and head; v in the activation dtype",
}
#: Descale granularity per quantization family (the first is the default when ``descale`` is None).
DESCALES: dict[str, tuple[str, ...]] = {"fp8": ("tensor", "head"), "int8": ("token",)}

#: Every feature a case can exercise; backends declare support for each (see attnfast.base).
FEATURES: dict[str, str] = {
    "prefill": "every request has q_len == kv_len",
    "decode": "every request has q_len == 1",
    "chunked": "some request has 1 < q_len < kv_len (chunked prefill / spec decode)",
    "mixed": "decode and prefill requests in one batch",
    "cross": "q_len and kv_len unrelated, no causal mask (encoder-decoder / cross attention)",
    "sq_gt_sk": "some request has q_len > kv_len",
    "empty_kv": "some request has kv_len == 0",
    "varlen": "more than one request",
    "paged": "keys read from a paged cache through a block table",
    "hnd": "paged cache in HND layout (num_blocks, hk, block, d)",
    "causal": "bottom-right causal mask",
    "window": "sliding window (left and/or right bounded)",
    "local_chunk": "chunked local attention (FA3 attention_chunk)",
    "softcap": "logits soft-cap",
    "alibi": "ALiBi slopes",
    "sinks": "per-head attention sinks",
    "scale": "custom softmax scale",
    "gqa": "1 < q heads / kv heads < q heads",
    "mqa": "a single kv head",
    "dv": "value head dim differs from the qk head dim",
    "append": "the kernel writes the new k/v into the cache itself (kvcache append)",
    "append_short": "an append of fewer new keys than query tokens (append_len; the peers' seqlen_new < seqlen_q)",
    "append_uneven": (
        "an append of its own count of new keys per request, not every q_len nor one count <= every q_len "
        "(append_lens; FA3's varlen_q appends, cu_seqlens_k_new)"
    ),
    "append_quant": "an append into a quantized cache: the new keys and values given already quantized (FA3 fp8)",
    "splits": "split-KV with a pinned num_splits > 1",
    "fp16": "fp16 inputs",
    "bf16": "bf16 inputs",
    "fp32": "fp32 inputs",
    "fp8_e4m3": "k, v (and q) stored as fp8 e4m3 with fp32 descales",
    "fp8_e5m2": "k, v (and q) stored as fp8 e5m2 with fp32 descales",
    "fp8_kv_only": "fp8 k, v with q (and qv) in the activation dtype",
    "descale_head": "fp8 descales per (sequence, kv head) rather than per tensor",
    "int8_t1": "int8 q, k per token and head, int8 v per channel (seed 001 type 1)",
    "int8_t2": "int8 q, k per token and head, v in the activation dtype (seed 001 type 2)",
    "qv": "MLA absorbed: a query part scored against V (FA3 qv, FlashMLA's 576-wide cache)",
    "v_pad": "V zero-padded to the qk head dim, output stripped back (seed 004)",
    "sched_meta": "precomputed FA3 scheduler metadata (vLLM's CUDA-graph path)",
    "cp": "context parallel: a causal call over one rank's interleave-1 key shard (FA3 cp_world_size/cp_rank)",
    "graph": "CUDA-graph mode: captured on a bucket's static buffers, replayed for several batches",
    "inv_run": "invariance: the same call twice, bitwise",
    "inv_batch": "invariance: a request alone, in a batch, at another position, beside other lengths, bitwise",
    "inv_splits": "invariance: num_splits 1 vs pinned values vs the heuristic, bitwise",
    "inv_neighbour": "invariance: a request beside a neighbour that grows by one token and one tile, bitwise",
    "backward": "the backward pass: dQ, dK, dV (and d sinks) of the call, each judged against reference gradients",
    "bwd_deterministic": "the backward run with the kernel's deterministic option, gradients bitwise run to run",
}

#: Features an adapter must declare in ``Backend.accepts`` to be given (refused otherwise, with a
#: reason): they arrived after the adapter API, and an adapter written before them would otherwise
#: be fed dequantized or concatenated tensors it never asked for.
OPT_IN_FEATURES: frozenset[str] = frozenset(
    {
        "fp8_e4m3",
        "fp8_e5m2",
        "fp8_kv_only",
        "descale_head",
        "int8_t1",
        "int8_t2",
        "qv",
        "v_pad",
        "sched_meta",
        "cp",
        "append_short",
        "append_uneven",
        "append_quant",
        "graph",
        "backward",
        "bwd_deterministic",
    }
)

#: Input distributions a case may ask for (``AttentionCase.data``; :mod:`conformance.cases.data_inputs`): what
#: Gaussian inputs miss.  The empty string is the default (standard normal q, k, v).
DATA: dict[str, str] = {
    "": "standard normal q, k, v",
    "outliers": "one token row in 16 of q and of k scaled by 8: large-magnitude rows, scores far beyond the rest",
    "peaked": "q scaled by 8: every softmax row near one-hot (a few keys carry the mass)",
    "offset_v": "V shifted by +8 (a large common component): dP - rowsum(dO * O) cancels in dS",
}
