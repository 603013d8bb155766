"""Seed ``001``'s scenarios: the engine steps :class:`~conformance.engines.vllm_v1.fa.VllmV1FlashAttention`
replays, one ``engines``-suite case each (case ids come from these tables: keep names and fields stable).

A :class:`Scenario` is one step's requests in the caller's (scheduler's) order plus what an ``AttentionCase``
cannot say: the shared prompt and who shares it, the speculative-decode threshold, the physical cache order, the
block manager's block size, DCP world and interleave, encoder attention, and what the cascade heuristic decides.
:data:`SCENARIOS` groups them: the decode/prefill split over layouts, block sizes, sinks, windows and spec decode;
cascade, chosen and declined by each rule of
:func:`~conformance.engines.vllm_v1.metadata.use_cascade_attention`; decode context parallel, as the seed does it
(context and new tokens in two calls) and through the kernel's own cp arguments (``kernel_cp``: one call per rank,
:mod:`conformance.engines.vllm_v1.dcp_kernel`); int8 types 1 and 2.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from conformance.cases.case import AttentionCase

from ..base import Request

__all__ = ["INVARIANCE_SCENARIOS", "SCENARIOS", "Scenario", "invariance_cases"]


@dataclass(frozen=True)
class Scenario:
    """One engine step: ``requests`` in the caller's order and what the case cannot say.

    ``layer`` are the ``AttentionCase`` fields of the scenario's case; ``shared_prefix`` tokens of the prompt are
    shared (same tokens, same physical blocks) by every request except ``non_sharers``; ``spec_tokens`` raises the
    decode threshold; ``physical`` allocates the cache memory in the other order than the view; ``manager_block``
    is the block manager's block size when it differs from the kernel's (``case.block_size``); ``dcp`` and
    ``interleave`` are the DCP world size and ``cp_kv_cache_interleave_size``; ``kernel_cp`` runs DCP through the
    kernel's ``cp_world_size`` / ``cp_rank`` / ``cp_tot_seqused_k`` (one call per rank; the kernel's shard rule is
    interleave 1, so ``interleave`` must be 1); ``cascade`` is what the heuristic decides (asserted by the tests);
    ``batch_invariant`` is vLLM's batch-invariant mode (``vllm_is_batch_invariant()``: the builder's
    ``max_num_splits = 1``, which upstream's forward passes as every call's ``num_splits``; the case's
    ``num_splits`` is 1).
    """

    requests: tuple[Request, ...]
    layer: dict[str, Any] = field(default_factory=dict)
    shared_prefix: int = 0
    non_sharers: tuple[int, ...] = ()
    spec_tokens: int = 0
    physical: bool = False
    manager_block: int | None = None
    dcp: int = 1
    interleave: int = 1
    encoder: bool = False
    cascade: bool = False
    kernel_cp: bool = False
    batch_invariant: bool = False

    def __post_init__(self) -> None:
        if self.kernel_cp and (self.dcp < 2 or self.interleave != 1):
            raise ValueError(
                f"kernel_cp needs dcp >= 2 and interleave 1 (the kernel reads local key j as absolute key "
                f"j * world + rank), got dcp={self.dcp}, interleave={self.interleave}"
            )

    def sharers(self) -> list[int]:
        if not self.shared_prefix:
            return []
        return [b for b in range(len(self.requests)) if b not in self.non_sharers]


def _r(*pairs: tuple[int, int]) -> tuple[Request, ...]:
    """Requests from ``(new, cached)`` pairs."""
    return tuple(Request(new=n, cached=c) for n, c in pairs)


def _layer(layout: str | None, block: int | None, **kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = dict(num_heads=8, num_kv_heads=2, head_dim=64, dtype="bf16", causal=True)
    if layout is not None:
        base.update(kv_layout=layout, block_size=block)
    return base | kw


#: decodes after prefills in the caller's order: the reorder moves them.
_MIXED = _r((40, 0), (1, 69), (24, 50), (1, 32), (17, 0))
_SHARED8 = _r((1, 599), (30, 520), (1, 529), (64, 512), (1, 514), (16, 700), (1, 512), (8, 540))
_DCP = dict(num_heads=12, num_kv_heads=1, head_dim=64)

SCENARIOS: dict[str, Scenario] = {
    # ---- decode + prefill split, layouts, block sizes, sinks, windows, spec decode
    "mixed_nhd_bs16": Scenario(_MIXED, _layer("NHD", 16)),
    "mixed_hnd_bs32": Scenario(_MIXED, _layer("HND", 32, num_kv_heads=8, head_dim=128, dtype="fp16")),
    "mixed_hnd_bs64_sinks": Scenario(_MIXED, _layer("HND", 64, sinks=True)),
    "decode_only_sinks": Scenario(
        _r((1, 299), (1, 0), (1, 64), (1, 15), (1, 127), (1, 1)), _layer("HND", 16, num_heads=16, sinks=True)
    ),
    "prefill_extend_nhd_bs32": Scenario(_r((33, 0), (20, 80), (64, 0)), _layer("NHD", 32, num_kv_heads=4)),
    "spec_decode": Scenario(_r((6, 0), (3, 87), (1, 39), (2, 15), (5, 50), (3, 0)), _layer("HND", 16), spec_tokens=2),
    "window_nhd": Scenario(_MIXED, _layer("NHD", 16, window=(47, 0))),
    "layout_nhd_over_hnd": Scenario(_MIXED, _layer("NHD", 16), physical=True),
    "layout_hnd_cross_layer": Scenario(_MIXED, _layer("HND", 32, dtype="fp16"), physical=True),
    "block_128_kernel_64": Scenario(_MIXED, _layer("HND", 64), manager_block=128),
    "encoder_only": Scenario(_r((37, 0), (64, 0), (5, 0)), _layer(None, None, causal=False), encoder=True),
    # ---- cascade: chosen, and declined by each rule of the heuristic
    "cascade_mixed": Scenario(_SHARED8, _layer("HND", 16), shared_prefix=512, cascade=True),
    "cascade_capped": Scenario(
        _r((1, 599), (260, 300), (1, 529), (20, 512), (1, 514), (16, 600), (1, 512), (8, 540)),
        _layer("NHD", 32, dtype="fp16"),
        shared_prefix=512,
        cascade=True,
    ),
    "cascade_decodes": Scenario(
        tuple(Request(new=1, cached=256 + 7 * (i % 4)) for i in range(20)),
        _layer("HND", 16, num_heads=16, num_kv_heads=8),
        shared_prefix=256,
        cascade=True,
    ),
    "cascade_declined_decodes": Scenario(
        tuple(Request(new=1, cached=256 + 7 * (i % 4)) for i in range(8)),
        _layer("HND", 16, num_heads=16, num_kv_heads=8),
        shared_prefix=256,
    ),
    "cascade_declined_short": Scenario(_SHARED8, _layer("HND", 16), shared_prefix=250),
    "cascade_declined_not_all": Scenario(_SHARED8, _layer("HND", 16), shared_prefix=512, non_sharers=(3,)),
    "cascade_declined_few": Scenario(_SHARED8[:7], _layer("HND", 16), shared_prefix=512),
    "cascade_declined_window": Scenario(_SHARED8, _layer("NHD", 16, window=(127, 0)), shared_prefix=512),
    # ---- decode context parallel (one kv head per rank: DCP runs on replicated kv heads)
    "dcp2_decode": Scenario(_r((1, 99), (1, 36), (1, 0), (1, 249)), _layer("HND", 16, **_DCP), dcp=2),
    "dcp3_mixed": Scenario(
        _r((20, 0), (1, 89), (12, 48), (1, 6)), _layer("NHD", 16, dtype="fp16", **_DCP), dcp=3, interleave=4
    ),
    "dcp4_interleave16": Scenario(_r((1, 299), (8, 132), (1, 32)), _layer("HND", 16, **_DCP), dcp=4, interleave=16),
    # ---- DCP through the kernel's cp arguments: one causal call per rank over its share of every key
    "dcpk2_spec": Scenario(
        _r((3, 87), (1, 39), (2, 15), (3, 0), (1, 0), (12, 40)),
        _layer("HND", 16, **_DCP),
        dcp=2,
        spec_tokens=2,
        kernel_cp=True,
    ),
    "dcpk3_extend": Scenario(
        _r((20, 0), (7, 89), (12, 48), (1, 6), (5, 2)), _layer("NHD", 16, dtype="fp16", **_DCP), dcp=3, kernel_cp=True
    ),
    # ---- int8 (the fork's VLLM_ATTN_OPT_LEVEL 1 and 2)
    "int8_t1_mixed": Scenario(
        _r((30, 0), (1, 59), (16, 32), (1, 19)), _layer("HND", 16, dtype="fp16", quant="int8_t1")
    ),
    "int8_t2_mixed": Scenario(_r((1, 44), (25, 0), (1, 99), (9, 61)), _layer("HND", 32, quant="int8_t2")),
    "int8_t1_decode": Scenario(_r((1, 79), (1, 129), (1, 11)), _layer("HND", 64, dtype="fp16", quant="int8_t1")),
}

#: decodes after a prefill in the caller's order, request 0 a decode (the reorder keeps it first among decodes).
_INV_MIXED = _r((1, 69), (40, 0), (24, 50), (1, 32), (17, 0))
_INV_DECODE = _r((1, 299), (1, 64), (1, 127), (1, 15), (1, 1))

#: the growing-neighbour steps: request 0 (a decode, or a 5-token chunk, of 3,000 keys: long enough for a split
#: heuristic to split) beside a 129-token prefill chunk after 971 cached tokens, which the ``neighbour`` invariance
#: cuts to 1 (a decode: the reorder moves it into the decode call), 9, 10, 64, 65 and 128 new tokens.
_NB_DECODE = _r((1, 2999), (129, 971))
_NB_CHUNK = _r((5, 2995), (129, 971))
#: the layers at the two head dims FA kernels compile templates for, both GQA 7 (as vLLM #51902's 14 / 2 heads:
#: 9 -> 10 query rows of the longest request cross 64 packed rows): Qwen2.5-0.5B's (d64) and Qwen2.5-7B's (d128).
_NB_LAYERS = {
    64: _layer("NHD", 16, num_heads=14, num_kv_heads=2),
    128: _layer("NHD", 16, num_heads=28, num_kv_heads=4, head_dim=128),
}


def _neighbour_scenarios() -> dict[str, tuple[str, Scenario]]:
    """``inv_neighbour_{decode,chunk}_d{64,128}`` in the default configuration, then in batch-invariant mode."""
    out = {}
    for mode, invariant in (("", False), ("batch_invariant_", True)):
        for d, layer in _NB_LAYERS.items():
            for target, reqs in (("decode", _NB_DECODE), ("chunk", _NB_CHUNK)):
                out[f"inv_neighbour_{mode}{target}_d{d}"] = (
                    "neighbour",
                    Scenario(reqs, layer, batch_invariant=invariant),
                )
    return out


#: name -> (invariance kind, scenario): request 0's rows through the whole step, compared bitwise
#: (:mod:`conformance.engines.invariance`); the batch is the case's ``requests`` (each variant a step of its own).
#: With ``batch_invariant`` a ``batch`` or ``neighbour`` difference fails (the mode's promise) on a kernel that
#: takes a split count.
INVARIANCE_SCENARIOS: dict[str, tuple[str, Scenario]] = {
    "inv_run_mixed": ("run", Scenario(_INV_MIXED, _layer("HND", 16))),
    "inv_batch_decode": ("batch", Scenario(_INV_DECODE, _layer("HND", 16))),
    "inv_batch_mixed": ("batch", Scenario(_INV_MIXED, _layer("NHD", 16))),
    "inv_batch_invariant_decode": ("batch", Scenario(_INV_DECODE, _layer("HND", 16), batch_invariant=True)),
    "inv_batch_invariant_mixed": ("batch", Scenario(_INV_MIXED, _layer("NHD", 16), batch_invariant=True)),
    "inv_run_batch_invariant": ("run", Scenario(_INV_MIXED, _layer("HND", 16), batch_invariant=True)),
    **_neighbour_scenarios(),
}


def invariance_cases(engine: str) -> list[AttentionCase]:
    """The invariance scenarios' ``engines``-suite cases (``num_splits = 1`` in batch-invariant mode)."""
    return [
        AttentionCase(
            requests=tuple((r.new, r.kv) for r in sc.requests),
            engine=engine,
            scenario=name,
            invariance=kind,
            num_splits=1 if sc.batch_invariant else None,
            **sc.layer,
        )
        for name, (kind, sc) in INVARIANCE_SCENARIOS.items()
    ]
