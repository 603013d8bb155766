"""The case model: one frozen, JSON-serialisable description of one attention call.

A case says *what* is computed (batch composition, heads, dims, dtype, KV layout, masking and
score modifiers); tensors come from :func:`conformance.cases.inputs.make_inputs` given (case, seed,
device), so any recorded case can be rebuilt bit for bit.

Batch composition is a tuple of ``(q_len, kv_len)`` per request: ``kv_len`` counts every key the
request attends to, the new tokens included (a decode step is ``(1, ctx + 1)``, a prefill
``(n, n)``, a chunked-prefill chunk ``(c, done + c)``, cross attention any pair with
``causal=False``).  ``q_len > kv_len`` is legal: under causal masking the top rows see nothing.

Quantization (``quant``, seed ``001`` and vLLM/SGLang's fp8 caches): ``fp8_e4m3`` / ``fp8_e5m2``
quantize k and v (and q, and qv, unless ``quant_q`` is False) with descales per tensor or per
(sequence, kv head) (``descale``); ``int8_t1`` quantizes q and k per token and head and v per
channel with a static scale, ``int8_t2`` q and k only (v stays in the activation dtype).  ``dtype``
is then the activation and output dtype.  The reference judges the kernel on the dequantized values.

MLA absorbed decode (``qv``): queries carry a second part ``qv`` of width ``head_dim_v`` scored
against V, ``s = scale * (q.k + qv.v)`` (FA3 ``qv``; FlashMLA's 576-wide cache is the same call with
``head_dim`` 64 = rope and ``head_dim_v`` 512 = latent); the default scale is ``1/sqrt(d + dv)``.
``v_padded``: the caller zero-pads V to ``head_dim`` and strips the output back to ``head_dim_v``
(seed ``004``'s path for kernels that need equal head dims).  ``scheduler_metadata``: the FA3 call
takes precomputed scheduler metadata (vLLM's CUDA-graph path).  ``cp_world`` / ``cp_rank``: context
parallelism as vLLM's FA3 fork takes it (``cp_world_size``, ``cp_rank``, ``cp_tot_seqused_k``): the call's keys
(``kv_len``) are one rank's interleave-1 shard of a longer sequence, local key ``j`` being absolute key ``j *
cp_world + cp_rank``, and the causal rule holds in absolute positions; each sequence's total comes with the inputs
(``CaseInputs.cp_tot_seqused_k``).  Features that arrived after the adapter API (:data:`OPT_IN_FEATURES`) are
refused by an adapter unless it declares them.

Engine replays (``engine`` and ``scenario``, :mod:`conformance.engines`): the case is one step of an engine
backend's attention layer, replayed as that engine composes its kernel calls; ``requests`` are the step's
sequences and the other fields the layer's configuration.

JSON form: :meth:`AttentionCase.to_json` writes only fields that differ from their defaults, so
adding a field with a default keeps every existing id, hash and record valid; :meth:`from_json`
ignores keys it does not know (records written by a newer version stay readable).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import torch

from conformance.cases.graph_fields import graph_problems

__all__ = ["AttentionCase", "DESCALES", "DTYPES", "FEATURES", "LAYOUTS", "OPT_IN_FEATURES", "QUANTS"]

DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
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
        "graph",
    }
)


def _fmt_num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x).replace(".", "p")


@dataclass(frozen=True)
class AttentionCase:
    """One attention call.  All fields are plain values; see the module docstring."""

    requests: tuple[tuple[int, int], ...]
    num_heads: int
    num_kv_heads: int
    head_dim: int
    head_dim_v: int | None = None
    dtype: str = "bf16"
    kv_layout: str = "contiguous"
    block_size: int | None = None
    causal: bool = False
    window: tuple[int | None, int | None] = (None, None)
    softcap: float | None = None
    alibi: bool = False
    sinks: bool = False
    scale: float | None = None
    chunk: int | None = None
    append: bool = False
    num_splits: int | None = None
    quant: str = "none"
    quant_q: bool = True
    descale: str | None = None
    qv: bool = False
    v_padded: bool = False
    scheduler_metadata: bool = False
    cp_world: int = 1
    cp_rank: int = 0
    engine: str = ""
    scenario: str = ""
    graph: tuple[int, ...] = ()
    graph_fill: int = 0
    invariance: str = ""
    batch_name: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        reqs = tuple((int(a), int(b)) for a, b in self.requests)
        object.__setattr__(self, "requests", reqs)
        object.__setattr__(self, "window", tuple(self.window))
        object.__setattr__(self, "graph", tuple(int(n) for n in self.graph))
        for name in ("softcap", "scale"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, float(getattr(self, name)))
        errors = list(self._problems())
        if errors:
            raise ValueError("invalid AttentionCase: " + "; ".join(errors))

    def _problems(self):
        if not self.requests:
            yield "requests must hold at least one (q_len, kv_len) pair"
        for i, (ql, kl) in enumerate(self.requests):
            if ql < 0 or kl < 0:
                yield f"requests[{i}] = {(ql, kl)} must be non-negative"
        if self.num_heads <= 0 or self.num_kv_heads <= 0 or self.num_heads % self.num_kv_heads:
            yield f"num_heads ({self.num_heads}) must be a positive multiple of num_kv_heads ({self.num_kv_heads})"
        if self.head_dim <= 0 or (self.head_dim_v is not None and self.head_dim_v <= 0):
            yield f"head dims must be positive, got {self.head_dim}, {self.head_dim_v}"
        if self.dtype not in DTYPES:
            yield f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}"
        if self.kv_layout not in LAYOUTS:
            yield f"kv_layout must be one of {LAYOUTS}, got {self.kv_layout!r}"
        if (self.kv_layout != "contiguous") != (self.block_size is not None):
            yield "block_size must be set exactly when kv_layout is paged (NHD/HND)"
        if self.block_size is not None and self.block_size <= 0:
            yield f"block_size must be positive, got {self.block_size}"
        if len(self.window) != 2 or any(w is not None and (not isinstance(w, int) or w < 0) for w in self.window):
            yield f"window must be (left, right) with None or ints >= 0, got {self.window!r}"
        elif self.causal and self.window[1] not in (None, 0):
            yield f"window right must be None or 0 with causal, got {self.window[1]}"
        if self.softcap is not None and self.softcap <= 0:
            yield f"softcap must be positive or None, got {self.softcap}"
        if self.chunk is not None and self.chunk <= 0:
            yield f"chunk must be positive or None, got {self.chunk}"
        if self.append and any(ql > kl for ql, kl in self.requests):
            yield "append needs q_len <= kv_len for every request (the new tokens are the last q_len keys)"
        if self.num_splits is not None and self.num_splits < 1:
            yield f"num_splits must be >= 1 or None, got {self.num_splits}"
        yield from self._quant_problems()
        if bool(self.engine) != bool(self.scenario):
            yield f"engine and scenario must be set together, got engine={self.engine!r}, scenario={self.scenario!r}"
        if self.qv and self.head_dim_v is None:
            yield "qv needs head_dim_v (the width of qv and V, e.g. 512 for MLA's latent)"
        yield from self._cp_problems()
        yield from graph_problems(self)
        if self.v_padded and not self.dv < self.head_dim:
            yield (
                f"v_padded needs head_dim_v < head_dim (V is zero-padded to head_dim), got {self.dv}, {self.head_dim}"
            )

    def _cp_problems(self):
        if self.cp_world < 1 or not 0 <= self.cp_rank < self.cp_world:
            yield f"cp_rank must be in [0, cp_world) with cp_world >= 1, got {self.cp_rank} of {self.cp_world}"
        elif self.cp_world > 1:
            if not self.causal or self.has_window or self.chunk is not None:
                yield (
                    "cp_world > 1 needs causal=True without window or chunk (the kernel applies cp_* in its causal "
                    "mask only)"
                )
            if self.alibi or self.append:
                yield "cp_world > 1 cannot be combined with alibi or append (positions are absolute under cp)"

    def _quant_problems(self):
        if self.quant not in QUANTS:
            yield f"quant must be one of {list(QUANTS)}, got {self.quant!r}"
            return
        family = self.quant_family
        if family is None:
            if self.descale is not None or not self.quant_q:
                yield "descale and quant_q apply only to a quantized case (quant != 'none')"
            return
        if self.dtype not in ("bf16", "fp16"):
            yield f"a quantized case needs a bf16 or fp16 activation dtype, got {self.dtype!r}"
        if self.descale is not None and self.descale not in DESCALES[family]:
            allowed = list(DESCALES[family])
            yield f"descale must be one of {allowed} (or None) for quant {self.quant!r}, got {self.descale!r}"
        if family == "int8" and not self.quant_q:
            yield "quant_q must be True for the int8 types (they quantize q by definition)"
        if family == "int8" and self.qv:
            yield "qv cannot be combined with an int8 type (seed 001's int8 modes have no MLA path)"
        if self.append:
            yield (
                "append cannot be combined with quant: engines quantize new keys while writing the cache "
                "(attnref.quant.write_kv_cache_fp8 / _int8) before the kernel reads it"
            )

    # ------------------------------------------------------------------ derived values
    @property
    def dv(self) -> int:
        return self.head_dim if self.head_dim_v is None else self.head_dim_v

    @property
    def qk_dim(self) -> int:
        """Width of the q.k product: ``head_dim``, plus ``dv`` with ``qv`` (MLA absorbed: q_v scored against V)."""
        return self.head_dim + (self.dv if self.qv else 0)

    @property
    def quant_family(self) -> str | None:
        """``"fp8"``, ``"int8"`` or None (not quantized)."""
        return None if self.quant == "none" else self.quant.split("_")[0]

    @property
    def descale_mode(self) -> str | None:
        """The descale granularity in force: ``descale``, or the family's default; None when not quantized."""
        family = self.quant_family
        return None if family is None else (self.descale or DESCALES[family][0])

    @property
    def paged(self) -> bool:
        return self.kv_layout != "contiguous"

    @property
    def batch(self) -> int:
        return len(self.requests)

    @property
    def q_lens(self) -> list[int]:
        return [q for q, _ in self.requests]

    @property
    def kv_lens(self) -> list[int]:
        return [k for _, k in self.requests]

    @property
    def cached_kv_lens(self) -> list[int]:
        """Keys already in the cache before the call: ``kv_len - q_len`` when appending, else ``kv_len``."""
        return [kl - (ql if self.append else 0) for ql, kl in self.requests]

    @property
    def total_q(self) -> int:
        return sum(self.q_lens)

    @property
    def total_kv(self) -> int:
        return sum(self.kv_lens)

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def has_window(self) -> bool:
        return self.window != (None, None)

    def features(self) -> frozenset[str]:
        """The :data:`FEATURES` this case exercises."""
        f = {self.dtype}
        ql, kl = self.q_lens, self.kv_lens
        if all(q == k for q, k in self.requests):
            f.add("prefill")
        if all(q == 1 for q in ql):
            f.add("decode")
        if any(1 < q < k for q, k in self.requests):
            f.add("chunked")
        if any(q == 1 for q in ql) and any(q > 1 for q in ql):
            f.add("mixed")
        if any(q > k for q, k in self.requests):
            f.add("sq_gt_sk")
        if any(k == 0 for k in kl):
            f.add("empty_kv")
        if not self.causal and not self.has_window and self.chunk is None and any(q != k for q, k in self.requests):
            f.add("cross")
        if self.batch > 1:
            f.add("varlen")
        if self.paged:
            f.add("paged")
        if self.kv_layout == "HND":
            f.add("hnd")
        for name in ("causal", "alibi", "sinks", "append"):
            if getattr(self, name):
                f.add(name)
        if self.has_window:
            f.add("window")
        if self.chunk is not None:
            f.add("local_chunk")
        if self.softcap is not None:
            f.add("softcap")
        if self.scale is not None:
            f.add("scale")
        if self.num_kv_heads == 1 and self.num_heads > 1:
            f.add("mqa")
        elif self.num_heads != self.num_kv_heads:
            f.add("gqa")
        if self.dv != self.head_dim:
            f.add("dv")
        if self.num_splits is not None and self.num_splits > 1:
            f.add("splits")
        if self.quant != "none":
            f.add(self.quant)
            if not self.quant_q:
                f.add("fp8_kv_only")
            if self.descale_mode == "head":
                f.add("descale_head")
        for name, feature in (("qv", "qv"), ("v_padded", "v_pad"), ("scheduler_metadata", "sched_meta")):
            if getattr(self, name):
                f.add(feature)
        if self.cp_world > 1:
            f.add("cp")
        if self.graph:
            f.add("graph")
        if self.invariance:
            f.add(f"inv_{self.invariance}")
        return frozenset(f)

    # ------------------------------------------------------------------ naming
    @property
    def id(self) -> str:
        """Deterministic readable id, unique per case: readable axes plus a short content hash."""
        h, hk = self.num_heads, self.num_kv_heads
        kind = "mha" if h == hk else ("mqa" if hk == 1 else "gqa")
        parts = [f"{self.engine}-{self.scenario}"] if self.engine else []
        parts.append(f"{kind}_h{h}_kv{hk}_d{self.head_dim}")
        if self.dv != self.head_dim:
            parts.append(f"dv{self.dv}")
        parts.append(self.dtype)
        parts.append(self.batch_name or f"b{self.batch}")
        parts.append(f"ps{self.block_size}{self.kv_layout.lower()}" if self.paged else "contig")
        if self.causal:
            parts.append("causal")
        if self.has_window:
            l, r = ("inf" if w is None else str(w) for w in self.window)
            parts.append(f"win{l}-{r}")
        if self.chunk is not None:
            parts.append(f"chunk{self.chunk}")
        if self.softcap is not None:
            parts.append(f"cap{_fmt_num(self.softcap)}")
        if self.alibi:
            parts.append("alibi")
        if self.sinks:
            parts.append("sink")
        if self.scale is not None:
            parts.append(f"scale{_fmt_num(self.scale)}")
        if self.append:
            parts.append("append")
        if self.num_splits is not None:
            parts.append(f"split{self.num_splits}")
        if self.quant != "none":
            parts.append(self.quant.replace("_", "") + ("kv" if not self.quant_q else ""))
            if self.descale is not None:
                parts.append(f"ds{self.descale}")
        for name in ("qv", "v_padded", "scheduler_metadata"):
            if getattr(self, name):
                parts.append({"qv": "qv", "v_padded": "vpad", "scheduler_metadata": "sched"}[name])
        if self.cp_world > 1:
            parts.append(f"cp{self.cp_world}r{self.cp_rank}")
        if self.graph:
            parts.append(
                "graph" + ".".join(map(str, self.graph)) + (f"fill{self.graph_fill}" if self.graph_fill else "")
            )
        if self.invariance:
            parts.append(f"inv{self.invariance}")
        return "_".join(parts) + "-" + self.digest()

    def digest(self) -> str:
        """Six hex digits of the canonical JSON (the batch label excluded)."""
        payload = {k: v for k, v in self.to_json().items() if k != "batch_name"}
        return hashlib.sha1(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:6]

    def summary(self) -> str:
        """One line of shapes and modes, never data."""
        reqs = self.requests
        shown = ", ".join(f"{q}/{k}" for q, k in reqs[:6]) + (f", ... ({len(reqs)} requests)" if len(reqs) > 6 else "")
        mods = sorted(self.features() - {self.dtype})
        return (
            f"q/kv lens [{shown}] h={self.num_heads} hk={self.num_kv_heads} d={self.head_dim} dv={self.dv} "
            f"{self.dtype} {f'paged {self.kv_layout} block {self.block_size}' if self.paged else 'contiguous'}"
            f" window={self.window} softcap={self.softcap}"
            f"{f' quant={self.quant} descale={self.descale_mode}' if self.quant != 'none' else ''}"
            f"{f' cp rank {self.cp_rank} of {self.cp_world}' if self.cp_world > 1 else ''} [{' '.join(mods)}]"
        )

    # ------------------------------------------------------------------ JSON
    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            default = f.default if f.default is not dataclasses.MISSING else dataclasses.MISSING
            if f.name == "requests":
                out[f.name] = [list(r) for r in value]
            elif value != default:
                out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "AttentionCase":
        known = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        kwargs["requests"] = tuple(tuple(r) for r in kwargs["requests"])
        for name in ("window", "graph"):
            if name in kwargs:
                kwargs[name] = tuple(kwargs[name])
        return cls(**kwargs)

    def padded_v_call(self) -> "AttentionCase":
        """The kernel call a ``v_padded`` case makes (``head_dim_v == head_dim``); the case itself otherwise."""
        return self.replace(head_dim_v=None, v_padded=False) if self.v_padded else self

    def replace(self, **changes: Any) -> "AttentionCase":
        return dataclasses.replace(self, **changes)
