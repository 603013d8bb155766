"""What a case derives from its fields, never stores: sizes (``dv``, ``qk_dim``, ``total_q``, ...), the
:data:`~conformance.cases.case_tables.FEATURES` it exercises, and its names (the id, the digest, the one-line
summary).  :class:`CaseDerived` is a base class of :class:`~conformance.cases.case.AttentionCase`, whose fields
and validation live in :mod:`conformance.cases.case`.

The id (:attr:`CaseDerived.id`) is ``KIND_hH_kvHK_dD[_dvDV]_DTYPE_BATCH_{contig|psBLOCKLAYOUT}[_causal]...`` then
``-DIGEST``, six hex digits of the case's canonical JSON: ids are recorded in every results file and ledger, so
this spelling never changes for an existing case (a new field adds a part only when it is set).
"""

from __future__ import annotations

import functools
import hashlib
import json
from typing import TYPE_CHECKING, Any

import torch

from conformance.cases.case_tables import DESCALES, DTYPES

__all__ = ["CaseDerived"]


def _fmt_num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x).replace(".", "p")


class CaseDerived:
    """Derived values, features and names of :class:`~conformance.cases.case.AttentionCase` (which provides the
    fields and ``to_json``); no state of its own but the cached :attr:`id`."""

    __slots__ = ()

    if TYPE_CHECKING:  # what this base reads of AttentionCase, which declares it (annotations for the type checker)
        requests: tuple[tuple[int, int], ...]
        num_heads: int
        num_kv_heads: int
        head_dim: int
        head_dim_v: int | None
        dtype: str
        kv_layout: str
        block_size: int | None
        causal: bool
        window: tuple[int | None, int | None]
        softcap: float | None
        alibi: bool
        sinks: bool
        scale: float | None
        chunk: int | None
        append: bool
        append_len: int | None
        append_lens: tuple[int, ...]
        num_splits: int | None
        quant: str
        quant_q: bool
        descale: str | None
        qv: bool
        cp_world: int
        cp_rank: int
        engine: str
        scenario: str
        graph: tuple[int, ...]
        graph_fill: int
        invariance: str
        backward: bool
        deterministic: bool
        data: str
        batch_name: str

        def to_json(self) -> dict[str, Any]: ...

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
    def new_kv_lens(self) -> list[int]:
        """Keys the call writes into the cache per request: ``append_lens[b]`` (an uneven append), ``append_len`` (a
        short append), else ``q_len`` when appending, else 0.  They are the last keys of each request's ``kv_len``."""
        if not self.append:
            return [0] * len(self.requests)
        if self.append_lens:
            return list(self.append_lens)
        return [ql if self.append_len is None else self.append_len for ql, _ in self.requests]

    @property
    def cached_kv_lens(self) -> list[int]:
        """Keys already in the cache before the call: ``kv_len`` less the new keys (:attr:`new_kv_lens`)."""
        return [kl - n for (_, kl), n in zip(self.requests, self.new_kv_lens)]

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
        if self.append_len is not None:
            f.add("append_short")
        if self.append_lens:
            f.add("append_uneven")
        if self.append and self.quant != "none":
            f.add("append_quant")
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
        if self.backward:
            f.add("backward")
            if self.deterministic:
                f.add("bwd_deterministic")
        return frozenset(f)

    # ------------------------------------------------------------------ naming
    @functools.cached_property
    def id(self) -> str:
        """Deterministic readable id, unique per case: readable axes plus a short content hash.  Computed once per
        case object (the case is frozen; a test that forces a field past the case's checks makes a fresh case)."""
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
        if self.append_lens:  # "appendv" + the counts: a readable part no other spelling of an append has
            parts.append("appendv" + ".".join(map(str, self.append_lens)))
        elif self.append:
            parts.append("append" if self.append_len is None else f"append{self.append_len}")
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
        if self.backward:
            parts.append("bwddet" if self.deterministic else "bwd")
        if self.data:
            parts.append(f"data{self.data.replace('_', '')}")
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
