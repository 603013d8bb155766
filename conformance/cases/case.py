"""The case model: one frozen, JSON-serialisable description of one attention call.

A case says *what* is computed (batch composition, heads, dims, dtype, KV layout, masking and score modifiers);
tensors come from :func:`conformance.cases.inputs.make_inputs` given (case, seed, device), so any recorded case can
be rebuilt bit for bit.

Batch composition is a tuple of ``(q_len, kv_len)`` per request: ``kv_len`` counts every key the request attends to,
the new tokens included (a decode step is ``(1, ctx + 1)``, a prefill ``(n, n)``, a chunked-prefill chunk ``(c, done
+ c)``, cross attention any pair with ``causal=False``).  ``q_len > kv_len`` is legal: under causal masking the top
rows see nothing.

Quantization (``quant``, ``quant_q``, ``descale``: fp8 per tensor or per (sequence, kv head), int8 types 1 and 2):
``dtype`` is then the activation and output dtype; the reference judges the kernel on the dequantized values.

MLA absorbed decode (``qv``): queries carry a second part ``qv`` of width ``head_dim_v`` scored against V, ``s =
scale * (q.k + qv.v)``; the default scale is ``1/sqrt(d + dv)``.  ``v_padded``: the caller zero-pads V to
``head_dim`` and strips the output back.  ``scheduler_metadata``: FA3's precomputed scheduler metadata.  ``cp_world``
/ ``cp_rank``: the call's ``kv_len`` keys are one rank's interleave-1 shard (local key ``j`` is absolute ``j *
cp_world + cp_rank``), causal in absolute positions.  ``append``: the call writes each request's new keys into the
cache, the last ``q_len`` of its ``kv_len`` keys, or the last ``append_len`` (a *short append*), or
``append_lens[b]`` (an *uneven append*); :func:`append_fields` gives the one spelling of any counts, so one call has
one id; the query rows stay aligned to the end of the ``kv_len`` keys.  With an fp8 ``quant`` the new keys come in
fp8.  Each field's exact constraints and the kernels' spellings are in ``docs/concepts/cases.md`` (*Cases*).
Features that arrived after the adapter API (:data:`OPT_IN_FEATURES`) are refused by an adapter unless it declares
them.

Backward (``backward``, :mod:`conformance.backward`): a training call whose gradients are judged too
(``deterministic``: the kernel's deterministic backward); ``data`` picks an input distribution (:data:`DATA`).
Engine replays (``engine``, ``scenario``, :mod:`conformance.engines`): one step of an engine's attention layer,
``requests`` its sequences, the other fields the layer's configuration.  The tables the fields draw on
(:data:`DTYPES`, :data:`LAYOUTS`, :data:`QUANTS`, :data:`DESCALES`, :data:`FEATURES`, :data:`OPT_IN_FEATURES`) are
:mod:`.case_tables`, re-exported here; a field's features, id part, shrinking, ledger name: its row in :mod:`.fields`.

JSON form: :meth:`AttentionCase.to_json` writes only fields that differ from their defaults, so adding a field with
a default keeps every existing id, hash and record valid; :meth:`from_json` ignores keys it does not know (records
written by a newer version stay readable) unless ``strict`` (``--case-json``), and checks each field's JSON type.
Every case, however built, keeps its integers within 64 bits, its floats finite and its text printable
(:mod:`conformance.cases.case_json`); a refused case raises :class:`CaseError` (a ``ValueError``) with one line per
problem, naming the field.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from conformance.cases.case_json import CaseError, finite_problem, json_problems, show, value_problems
from conformance.cases.case_tables import DESCALES, DTYPES, FEATURES, LAYOUTS, OPT_IN_FEATURES, QUANTS
from conformance.cases.backward_fields import backward_problems
from conformance.cases.fields import FIELD_SPECS
from conformance.cases.graph_fields import graph_problems

__all__ = [
    "AttentionCase",
    "CaseError",
    "append_fields",
    "DESCALES",
    "DTYPES",
    "FEATURES",
    "LAYOUTS",
    "OPT_IN_FEATURES",
    "QUANTS",
]


def append_fields(q_lens: Sequence[int], new: Sequence[int]) -> dict[str, Any]:
    """The one spelling of an append of ``new[b]`` keys into request ``b`` beside ``q_lens[b]`` query tokens, as
    :class:`AttentionCase` fields: ``append_len`` None when every request appends its query tokens, the one count
    when every request appends as many, ``1 <=`` it ``<=`` every ``q_len``; ``append_lens`` (one count per request)
    otherwise.  Returns ``{"append_len": ..., "append_lens": ...}``; the case checks the counts against ``kv_len``."""
    counts = tuple(int(n) for n in new)
    if counts == tuple(q_lens):
        return {"append_len": None, "append_lens": ()}
    if len(set(counts)) == 1 and 1 <= counts[0] <= min(q_lens):
        return {"append_len": counts[0], "append_lens": ()}
    return {"append_len": None, "append_lens": counts}


def _int_tuple(value: Any) -> tuple[int, ...]:
    """``value``'s items as ints; ``TypeError`` for text (a string is a sequence, but not of counts)."""
    if isinstance(value, (str, bytes)):
        raise TypeError("text is not a sequence of integers")
    return tuple(int(n) for n in value)


#: How ``__post_init__`` normalises the fields that take several spellings (a list for a tuple, an int for a
#: float), and what a field must be when its value cannot be converted.
_CONVERSIONS: dict[str, tuple[Any, str]] = {
    "requests": (lambda v: tuple((int(a), int(b)) for a, b in v), "(q_len, kv_len) integer pairs"),
    "window": (tuple, "(left, right) with None or ints >= 0"),
    "graph": (lambda v: tuple(int(n) for n in v), "a sequence of integers"),
    "append_lens": (_int_tuple, "a sequence of integers (new keys per request)"),
    "softcap": (lambda v: None if v is None else float(v), "a finite number > 0 (or unset)"),
    "scale": (lambda v: None if v is None else float(v), "a finite number (or unset)"),
}


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
    append_len: int | None = None
    append_lens: tuple[int, ...] = ()
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
    backward: bool = False
    deterministic: bool = False
    data: str = ""
    batch_name: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        wrong = []
        for name, (convert, what) in _CONVERSIONS.items():
            value = getattr(self, name)
            try:
                object.__setattr__(self, name, convert(value))
            except (TypeError, ValueError, OverflowError):
                wrong.append(f"{name} must be {what}, got {show(value)}")
        errors = wrong or list(self._problems())
        if errors:
            raise CaseError(errors)

    def _problems(self):
        limits = list(value_problems(self))
        if limits:  # the checks below would quote and combine values beyond the limits
            yield from limits
            return
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
            yield f"dtype must be one of {sorted(DTYPES)}, got {show(self.dtype)}"
        if self.kv_layout not in LAYOUTS:
            yield f"kv_layout must be one of {LAYOUTS}, got {show(self.kv_layout)}"
        if (self.kv_layout != "contiguous") != (self.block_size is not None):
            yield "block_size must be set exactly when kv_layout is paged (NHD/HND)"
        if self.block_size is not None and self.block_size <= 0:
            yield f"block_size must be positive, got {self.block_size}"
        if len(self.window) != 2 or any(w is not None and (not isinstance(w, int) or w < 0) for w in self.window):
            yield f"window must be (left, right) with None or ints >= 0, got {show(self.window)}"
        elif self.causal and self.window[1] not in (None, 0):
            yield f"window right must be None or 0 with causal, got {self.window[1]}"
        for problem in (finite_problem("softcap", self.softcap, True), finite_problem("scale", self.scale, False)):
            if problem:
                yield problem
        if self.chunk is not None and self.chunk <= 0:
            yield f"chunk must be positive or None, got {self.chunk}"
        yield from self._append_problems()
        if self.num_splits is not None and self.num_splits < 1:
            yield f"num_splits must be >= 1 or None, got {self.num_splits}"
        yield from self._quant_problems()
        if bool(self.engine) != bool(self.scenario):
            yield (
                f"engine and scenario must be set together, got engine={show(self.engine)}, "
                f"scenario={show(self.scenario)}"
            )
        if self.qv and self.head_dim_v is None:
            yield "qv needs head_dim_v (the width of qv and V, e.g. 512 for MLA's latent)"
        yield from self._cp_problems()
        yield from graph_problems(self)
        yield from backward_problems(self)
        if self.v_padded and not self.dv < self.head_dim:
            yield (
                f"v_padded needs head_dim_v < head_dim (V is zero-padded to head_dim), got {self.dv}, {self.head_dim}"
            )
        if self.v_padded and self.qv:
            yield "v_padded cannot be combined with qv (qv is scored against V at head_dim_v; its padded call has none)"

    def _append_problems(self):
        if self.append_lens:
            yield from self._append_lens_problems()
            return
        if self.append_len is None:
            if self.append and any(ql > kl for ql, kl in self.requests):
                yield "append needs q_len <= kv_len for every request (the new tokens are the last q_len keys)"
            return
        if not self.append:
            yield "append_len needs append=True (it counts the new keys the call writes into the cache)"
            return
        ql = self.q_lens
        if self.append_len < 1 or any(self.append_len > q for q in ql) or all(self.append_len == q for q in ql):
            yield (
                f"append_len must be in [1, q_len] for every request and below some q_len (equal to every q_len "
                f"it is append_len=None), got {self.append_len} with q_lens {sorted(set(ql))}"
            )
        elif any(self.append_len > kl for kl in self.kv_lens):
            yield (
                f"append_len ({self.append_len}) must be <= kv_len for every request (the new keys are the last "
                f"append_len keys), got kv_lens {sorted(set(self.kv_lens))}"
            )

    def _append_lens_problems(self):
        if not self.append:
            yield "append_lens needs append=True (it counts the new keys the call writes into each request's cache)"
            return
        if self.append_len is not None:
            yield (
                f"append_lens and append_len cannot both be set (append_len: one count for every request), got "
                f"append_len={self.append_len}"
            )
            return
        if len(self.append_lens) != self.batch:
            yield f"append_lens must hold one count per request ({self.batch}), got {len(self.append_lens)}"
            return
        for b, (n, (_, kl)) in enumerate(zip(self.append_lens, self.requests)):
            if not 0 <= n <= kl:
                yield (
                    f"append_lens[{b}] = {n} must be in [0, kv_len] ({kl}: the new keys are the last keys of "
                    f"requests[{b}])"
                )
                return
        spelling = append_fields(self.q_lens, self.append_lens)
        if not spelling["append_lens"]:
            n = spelling["append_len"]
            said = "append_len unset (each request appends its q_len)" if n is None else f"append_len={n}"
            yield (
                f"append_lens must hold counts append_len cannot say (one call, one id): "
                f"{show(list(self.append_lens))} with q_lens {show(self.q_lens)} is {said}"
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
            yield f"quant must be one of {list(QUANTS)}, got {show(self.quant)}"
            return
        family = self.quant_family
        if family is None:
            if self.descale is not None or not self.quant_q:
                yield "descale and quant_q apply only to a quantized case (quant != 'none')"
            return
        if self.dtype not in ("bf16", "fp16"):
            yield f"a quantized case needs a bf16 or fp16 activation dtype, got {show(self.dtype)}"
        if self.descale is not None and self.descale not in DESCALES[family]:
            allowed = list(DESCALES[family])
            yield f"descale must be one of {allowed} (or None) for quant {show(self.quant)}, got {show(self.descale)}"
        if family == "int8" and not self.quant_q:
            yield "quant_q must be True for the int8 types (they quantize q by definition)"
        if family == "int8" and self.qv:
            yield "qv cannot be combined with an int8 type (seed 001's int8 modes have no MLA path)"
        if self.append and family != "fp8":
            yield (
                "append with quant needs an fp8 type (FA3 appends new keys given in fp8 with the cache's descales); "
                "int8 new keys are quantized by the engine while writing the cache (attnref.quant.write_kv_cache_int8)"
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
        """The :data:`FEATURES` this case exercises: what the rows of :data:`~.fields.FIELD_SPECS` say of it."""
        return frozenset(f for spec in FIELD_SPECS for f in spec.features_of(self))

    # ------------------------------------------------------------------ naming
    @functools.cached_property
    def id(self) -> str:
        """Deterministic readable id, unique per case: ``KIND_hH_kvHK_dD[_dvDV]_DTYPE_BATCH_{contig|psBLOCKLAYOUT}``
        (engine cases ``ENGINE-SCENARIO_`` before it), then the parts of the rows of :data:`~.fields.FIELD_SPECS` that
        have one, in the rows' order, then ``-`` and :meth:`digest`.  Ids are recorded in every results file and
        ledger, so this spelling never changes for an existing case (a new field adds a part only when it is set).
        Computed once per case object (the case is frozen; a test that forces a field past the case's checks makes a
        fresh case)."""
        h, hk = self.num_heads, self.num_kv_heads
        kind = "mha" if h == hk else ("mqa" if hk == 1 else "gqa")
        parts = [f"{self.engine}-{self.scenario}"] if self.engine else []
        parts.append(f"{kind}_h{h}_kv{hk}_d{self.head_dim}")
        if self.dv != self.head_dim:
            parts.append(f"dv{self.dv}")
        parts.append(self.dtype)
        parts.append(self.batch_name or f"b{self.batch}")
        parts.append(f"ps{self.block_size}{self.kv_layout.lower()}" if self.paged else "contig")
        parts += [t for spec in FIELD_SPECS if (t := spec.token_of(self)) is not None]
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
    def from_json(cls, data: Any, *, strict: bool = False) -> "AttentionCase":
        """The case ``data`` (parsed JSON) describes; :class:`CaseError` (a ``ValueError``) naming each field at
        fault and its constraint otherwise (:mod:`conformance.cases.case_json`: JSON types, then the case's own
        checks).  ``strict`` (input a user typed) refuses unknown fields too; without it they are ignored."""
        fields = dataclasses.fields(cls)
        problems = json_problems(data, fields, strict)
        if problems:
            raise CaseError(problems)
        known = {f.name for f in fields}
        kwargs = {k: v for k, v in data.items() if k in known}
        kwargs["requests"] = tuple(tuple(r) for r in kwargs["requests"])
        for name in ("window", "graph", "append_lens"):
            if name in kwargs:
                kwargs[name] = tuple(kwargs[name])
        return cls(**kwargs)

    def padded_v_call(self) -> "AttentionCase":
        """The kernel call a ``v_padded`` case makes (``head_dim_v == head_dim``); the case itself otherwise."""
        return self.replace(head_dim_v=None, v_padded=False) if self.v_padded else self

    def replace(self, **changes: Any) -> "AttentionCase":
        return dataclasses.replace(self, **changes)
