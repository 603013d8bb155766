"""The field table: one :class:`FieldSpec` row per field of :class:`~conformance.cases.case.AttentionCase`, holding
what each field means beyond its name, type and default (which the dataclass declares).

A row says what the field is (``help``: ``attnconf ledger fields`` and the axis docs show it); which
:data:`~conformance.cases.case_tables.FEATURES` it owns and when a case exercises them (``features``, ``exercised``);
its part of the case id (``token``, or ``spelled_by``: the row whose token spells it, :data:`HEAD` for the id's head);
whether the fuzzer's shrink passes simplify it by name (``shrunk``; else it is reset to its default); whether a
ledger predicate names it (``ledger``; tuple fields are offered through derived scalars); the levels of the case
space's axis named after it and the classifier into them (``levels``, ``level``).  Generated from the rows: the
case's :meth:`~conformance.cases.case.AttentionCase.features`, the id's parts after its head (in row order), the
shrinker's handled fields, the ledger's own fields, and those axes' levels, ``classify`` and ``build``
(:mod:`conformance.cases.space`).

**A new field** (this list is the one place that says how; the package docstring, ``docs/reference/layout.md`` and
the add-a-mode guide point here):

1. the field in ``AttentionCase`` with a default (its JSON, and so every existing id, stays as it is) and its row
   here, where its id part goes among the others (a set field only adds a part);
2. its constraints in ``AttentionCase._problems`` (or ``graph_fields`` / ``backward_fields``), when it has some;
3. its tensors in :mod:`conformance.cases.inputs`, when it changes them;
4. a feature it turns on: its line in ``FEATURES`` (the order the CLI lists them), and in ``OPT_IN_FEATURES`` when
   adapters written before it would misread it;
5. an axis of the case space: ``levels`` (and ``level`` for a bucketed value) in its row, ``field_axis(name)`` in
   ``space_axes._AXES`` and the axis in the fuzzer's draw order (``conformance.fuzz.draw._ORDER``).

A sweep grid key of the field's name works at once (:func:`conformance.cases.sweep.build_case`).  Invariants
(``tests/conformance/cases/test_fields.py``): one row per field and no other; every feature owned by one row; every
field in the id, by its own token or the row it names.  Torch-free.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any

from conformance.cases.case_tables import DESCALES, QUANTS
from conformance.cases.graph_fields import INVARIANCES

__all__ = ["FIELD_SPECS", "HEAD", "SCALE_LEVEL", "SOFTCAP_LEVEL", "SPEC", "SPLITS_LEVEL", "FieldSpec", "fmt_num"]

#: An :class:`~conformance.cases.case.AttentionCase`: that module imports this one, so this one names it without
#: importing it (no import cycle, not even for the type checker), as ``graph_fields`` and ``backward_fields`` do.
Case = Any

#: The one non-default level of the soft-cap and scale axes and the pinned level above 1 of the num_splits axis.
SOFTCAP_LEVEL, SCALE_LEVEL, SPLITS_LEVEL = 30.0, 0.3, 3
#: ``spelled_by`` of the fields the id's head spells (kind, heads, dims, dtype, batch, layout; engine and scenario).
HEAD = "head"


@dataclass(frozen=True)
class FieldSpec:
    """One field's row (see the module docstring).  ``exercised`` None: the one feature of ``features`` while the
    field is set (differs from its default); ``token`` a string: that word while the field is set.  ``levels``: the
    levels of the case space's axis named after the field, whose level is the field's value (the first the default;
    empty: no such axis), and ``level`` the classifier that buckets any value to one (None: the value is its level)."""

    name: str
    help: str
    features: tuple[str, ...] = ()
    exercised: Callable[[Case], Iterable[str]] | None = None
    token: str | Callable[[Case], str | None] | None = None
    spelled_by: str = ""
    shrunk: bool = False
    ledger: bool = True
    levels: tuple[Hashable, ...] = ()
    level: Callable[[Case], Hashable] | None = None

    def is_set(self, case: Case) -> bool:
        """Whether ``case``'s value of this field differs from the field's default."""
        return bool(getattr(case, self.name) != _defaults(type(case))[self.name])

    def features_of(self, case: Case) -> Iterable[str]:
        """The features of this row that ``case`` exercises."""
        if self.exercised is not None:
            return self.exercised(case)
        return self.features if self.is_set(case) else ()

    def level_of(self, case: Case) -> Hashable:
        """The level of this row's axis that ``case``'s value falls in (``level``, else the value itself)."""
        return getattr(case, self.name) if self.level is None else self.level(case)

    def token_of(self, case: Case) -> str | None:
        """This row's part of ``case``'s id, or None (no part: unset, or spelled by another row)."""
        if isinstance(self.token, str):
            return self.token if self.is_set(case) else None
        return None if self.token is None else self.token(case)


_DEFAULTS: dict[type, dict[str, Any]] = {}


def _defaults(cls: type) -> dict[str, Any]:
    """Each field's default of the dataclass ``cls`` (computed once per class)."""
    found = _DEFAULTS.get(cls)
    if found is None:
        found = _DEFAULTS[cls] = {f.name: f.default for f in dataclasses.fields(cls)}
    return found


def fmt_num(x: float) -> str:
    """A number as an id spells it: ``30`` for 30.0, ``0p3`` for 0.3."""
    return str(int(x)) if float(x).is_integer() else str(x).replace(".", "p")


def _shape_features(c: Case) -> Iterable[str]:
    ql, kl = c.q_lens, c.kv_lens
    checks = (
        ("prefill", all(q == k for q, k in c.requests)),
        ("decode", all(q == 1 for q in ql)),
        ("chunked", any(1 < q < k for q, k in c.requests)),
        ("mixed", any(q == 1 for q in ql) and any(q > 1 for q in ql)),
        ("sq_gt_sk", any(q > k for q, k in c.requests)),
        ("empty_kv", any(k == 0 for k in kl)),
        (
            "cross",
            not c.causal and not c.has_window and c.chunk is None and any(q != k for q, k in c.requests),
        ),
        ("varlen", c.batch > 1),
    )
    return [name for name, on in checks if on]


def _heads_feature(c: Case) -> Iterable[str]:
    if c.num_kv_heads == 1 and c.num_heads > 1:
        return ("mqa",)
    return ("gqa",) if c.num_heads != c.num_kv_heads else ()


def _layout_features(c: Case) -> Iterable[str]:
    return [name for name, on in (("paged", c.paged), ("hnd", c.kv_layout == "HND")) if on]


def _append_token(c: Case) -> str | None:
    if c.append_lens:  # "appendv" + the counts: a readable part no other spelling of an append has
        return "appendv" + ".".join(map(str, c.append_lens))
    if c.append:
        return "append" if c.append_len is None else f"append{c.append_len}"
    return None


def _window_token(c: Case) -> str | None:
    if not c.has_window:
        return None
    left, right = ("inf" if w is None else str(w) for w in c.window)
    return f"win{left}-{right}"


def _graph_token(c: Case) -> str | None:
    if not c.graph:
        return None
    return "graph" + ".".join(map(str, c.graph)) + (f"fill{c.graph_fill}" if c.graph_fill else "")


def _if(on: bool, text: str) -> str | None:
    return text if on else None


#: The rows, in the order of the id's parts (the head's fields first).
FIELD_SPECS: tuple[FieldSpec, ...] = (
    FieldSpec(
        "requests",
        "(q_len, kv_len) per request",
        ("prefill", "decode", "chunked", "mixed", "cross", "sq_gt_sk", "empty_kv", "varlen"),
        _shape_features,
        spelled_by=HEAD,
        shrunk=True,
        ledger=False,
    ),
    FieldSpec("num_heads", "query heads", spelled_by=HEAD, shrunk=True),
    FieldSpec("num_kv_heads", "key/value heads", ("gqa", "mqa"), _heads_feature, spelled_by=HEAD, shrunk=True),
    FieldSpec("head_dim", "qk head dim", spelled_by=HEAD, shrunk=True),
    FieldSpec(
        "head_dim_v",
        "value head dim as given (None: equal to head_dim; see dv)",
        ("dv",),
        lambda c: ("dv",) if c.dv != c.head_dim else (),
        spelled_by=HEAD,
        shrunk=True,
    ),
    FieldSpec(
        "dtype",
        "activation dtype: bf16, fp16, fp32",
        ("fp16", "bf16", "fp32"),
        lambda c: (c.dtype,),
        spelled_by=HEAD,
        shrunk=True,
        levels=("bf16", "fp16", "fp32"),
    ),
    FieldSpec("kv_layout", "contiguous, NHD or HND", ("paged", "hnd"), _layout_features, spelled_by=HEAD, shrunk=True),
    FieldSpec("block_size", "page size of a paged cache (None: contiguous)", spelled_by=HEAD, shrunk=True),
    FieldSpec("causal", "bottom-right causal mask", ("causal",), token="causal", shrunk=True),
    FieldSpec("window", "sliding window (left, right)", ("window",), token=_window_token, ledger=False, shrunk=True),
    FieldSpec(
        "chunk",
        "local attention chunk (None: off)",
        ("local_chunk",),
        token=lambda c: None if c.chunk is None else f"chunk{c.chunk}",
        shrunk=True,
    ),
    FieldSpec(
        "softcap",
        "logit soft-cap (None: off)",
        ("softcap",),
        token=lambda c: None if c.softcap is None else f"cap{fmt_num(c.softcap)}",
        shrunk=True,
        levels=(None, SOFTCAP_LEVEL),
        level=lambda c: None if c.softcap is None else SOFTCAP_LEVEL,
    ),
    FieldSpec("alibi", "ALiBi slopes", ("alibi",), token="alibi", shrunk=True, levels=(False, True)),
    FieldSpec("sinks", "per-head attention sinks", ("sinks",), token="sink", shrunk=True, levels=(False, True)),
    FieldSpec(
        "scale",
        "explicit softmax scale (None: the kernel's default)",
        ("scale",),
        token=lambda c: None if c.scale is None else f"scale{fmt_num(c.scale)}",
        shrunk=True,
        levels=(None, SCALE_LEVEL),
        level=lambda c: None if c.scale is None else SCALE_LEVEL,
    ),
    FieldSpec(
        "append",
        "the kernel appends the new k/v to the cache",
        ("append", "append_quant"),
        lambda c: (("append", "append_quant") if c.quant != "none" else ("append",)) if c.append else (),
        token=_append_token,
        shrunk=True,
    ),
    FieldSpec(
        "append_len",
        "new keys per request of a short append (None: q_len, or per request: append_uneven)",
        ("append_short",),
        spelled_by="append",
        shrunk=True,
    ),
    FieldSpec(
        "append_lens",
        "new keys per request of an uneven append (() unless uneven)",
        ("append_uneven",),
        spelled_by="append",
        ledger=False,
        shrunk=True,
    ),
    FieldSpec(
        "num_splits",
        "pinned split-KV count (None: the kernel's choice)",
        ("splits",),
        lambda c: ("splits",) if c.num_splits is not None and c.num_splits > 1 else (),
        token=lambda c: None if c.num_splits is None else f"split{c.num_splits}",
        shrunk=True,
        levels=(None, 1, SPLITS_LEVEL),
        level=lambda c: None if c.num_splits is None else (1 if c.num_splits <= 1 else SPLITS_LEVEL),
    ),
    FieldSpec(
        "quant",
        "none, fp8_e4m3, fp8_e5m2, int8_t1, int8_t2",
        tuple(q for q in QUANTS if q != "none"),
        lambda c: (c.quant,) if c.quant != "none" else (),
        token=lambda c: _if(c.quant != "none", c.quant.replace("_", "") + ("kv" if not c.quant_q else "")),
        shrunk=True,
        levels=tuple(QUANTS),
    ),
    FieldSpec(
        "quant_q",
        "q quantized too (quantized cases)",
        ("fp8_kv_only",),
        lambda c: ("fp8_kv_only",) if c.quant != "none" and not c.quant_q else (),
        spelled_by="quant",
        shrunk=True,
        levels=(True, False),
    ),
    FieldSpec(
        "descale",
        "descale granularity as given (None: the family's default)",
        ("descale_head",),
        lambda c: ("descale_head",) if c.quant != "none" and c.descale_mode == "head" else (),
        token=lambda c: _if(c.quant != "none" and c.descale is not None, f"ds{c.descale}"),
        shrunk=True,
        levels=(None, *dict.fromkeys(m for modes in DESCALES.values() for m in modes)),
    ),
    FieldSpec(
        "qv", "MLA absorbed: a query part scored against V", ("qv",), token="qv", shrunk=True, levels=(False, True)
    ),
    FieldSpec(
        "v_padded",
        "V zero-padded to head_dim, output stripped (seed 004)",
        ("v_pad",),
        token="vpad",
        shrunk=True,
        levels=(False, True),
    ),
    FieldSpec(
        "scheduler_metadata",
        "precomputed FA3 scheduler metadata",
        ("sched_meta",),
        token="sched",
        shrunk=True,
        levels=(False, True),
    ),
    FieldSpec(
        "cp_world",
        "context-parallel ranks (1: off)",
        ("cp",),
        lambda c: ("cp",) if c.cp_world > 1 else (),
        token=lambda c: _if(c.cp_world > 1, f"cp{c.cp_world}r{c.cp_rank}"),
    ),
    FieldSpec("cp_rank", "this call's context-parallel rank", spelled_by="cp_world"),
    FieldSpec("engine", "engine replay's backend ('' for kernel cases)", spelled_by=HEAD, shrunk=True),
    FieldSpec("scenario", "engine replay's scenario ('' for kernel cases)", spelled_by=HEAD, shrunk=True),
    FieldSpec(
        "graph",
        "replay batch sizes of a graph case, capture batch first (() unless a graph case)",
        ("graph",),
        token=_graph_token,
        ledger=False,
    ),
    FieldSpec(
        "graph_fill",
        "key count of a graph bucket's padded requests (graph cases)",
        spelled_by="graph",
    ),
    FieldSpec(
        "invariance",
        "invariance kind: run, batch, splits ('' for other cases)",
        tuple(f"inv_{kind}" for kind in INVARIANCES),
        lambda c: (f"inv_{c.invariance}",) if c.invariance else (),
        token=lambda c: _if(bool(c.invariance), f"inv{c.invariance}"),
    ),
    FieldSpec(
        "backward",
        "a training call: gradients judged too (conformance.backward)",
        ("backward",),
        token=lambda c: _if(c.backward, "bwddet" if c.deterministic else "bwd"),
    ),
    FieldSpec(
        "deterministic",
        "the kernel's deterministic backward asked for (backward cases)",
        ("bwd_deterministic",),
        lambda c: ("bwd_deterministic",) if c.backward and c.deterministic else (),
        spelled_by="backward",
    ),
    FieldSpec(
        "data",
        "input distribution: '', outliers, peaked, offset_v",
        token=lambda c: _if(bool(c.data), f"data{c.data.replace('_', '')}"),
    ),
    FieldSpec("batch_name", "the suite's batch label (not part of the case's meaning)", spelled_by=HEAD, shrunk=True),
)

#: The rows by field name.
SPEC: dict[str, FieldSpec] = {s.name: s for s in FIELD_SPECS}
