"""The ``models`` suite: every registry model's attention layers as the engines call them.

Per model, per layer kind (global / sliding / chunked; MLA models: ``mla-prefill`` unabsorbed and ``mla-decode``
absorbed) and per tensor-parallel size in :attr:`~conformance.models.registry.ModelConfig.suite_tps` (TP 1 and
the TP the model is commonly served at; one rank's heads), the batches an engine step holds:

* ``dec``: decode-heavy, seven decodes with contexts from 17 to 32k keys (48k keys in all), on each engine's pages
* ``pf``: prefill (4096, 1000 and 37 tokens), paged (vLLM) and over contiguous K/V (no block table)
* ``cpmix``: chunked prefill mixed with decodes (a 2048-token chunk over 8k done keys, a 512-token prefill and
  three decodes); MLA prefill runs the prefill part alone (``chunk``)
* ``spec``: speculative decode, 4 query tokens (3 drafts + 1) per request

over the engines' paged caches (``data/engines.toml``: vLLM FA block 16, SGLang page 1, FlashMLA block 64, FA2's
``flash_attn_with_kvcache`` 256; the MLA prefill is contiguous, as engines up-project the latent cache first) in
bf16, and with an fp8 e4m3 cache (q quantized too, as vLLM's FA3 path does) where the model's ``kv_cache_dtypes``
offer it.  Nine cases per (model, layer kind, TP).

A case records its model in ``batch_name``: ``<model>@<layer kind>.tp<k>.<batch>`` (the case id shows it, the
content hash ignores it, so the shapes of a model's cases are the same cases as any suite's, only named).
:func:`case_model` reads it back and :func:`select_model_cases` filters any case list by model names (``attnconf
run --model NAME``).  ``lengths="small"`` gives the same cases at CPU sizes (contexts up to 300 keys) for tests.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from conformance.cases.case import AttentionCase
from conformance.models.load import builtin_registry
from conformance.models.registry import ModelConfig, Registry

__all__ = ["BATCHES", "SMALL_BATCHES", "ModelRef", "case_model", "model_cases", "select_model_cases"]

Req = tuple[tuple[int, int], ...]

#: Realistic (GPU) batches: (q_len, kv_len) per request, kv_len counting the new tokens.
BATCHES: dict[str, Req] = {
    "dec": ((1, 32768), (1, 8191), (1, 4097), (1, 2048), (1, 1000), (1, 300), (1, 17)),
    "pf": ((4096, 4096), (1000, 1000), (37, 37)),
    "cpmix": ((1, 12000), (1, 3000), (1, 700), (2048, 10240), (512, 512)),
    "chunk": ((2048, 10240), (512, 4608), (100, 100)),
    "spec": ((4, 20000), (4, 5000), (4, 900), (4, 64)),
}
#: The same batch kinds at CPU sizes (``lengths="small"``): names prefixed ``s``.
SMALL_BATCHES: dict[str, Req] = {
    "sdec": ((1, 300), (1, 130), (1, 17)),
    "spf": ((70, 70), (9, 9)),
    "scpmix": ((1, 200), (40, 160), (24, 24)),
    "schunk": ((40, 160), (24, 24)),
    "sspec": ((4, 150), (4, 20)),
}
_SEP = "@"


@dataclass(frozen=True)
class ModelRef:
    """What a model case's ``batch_name`` records."""

    model: str
    layer: str
    tp: int
    batch: str


def case_model(case: AttentionCase) -> ModelRef | None:
    """The model, layer kind, TP and batch a ``models`` case records; None for any other case."""
    name = case.batch_name
    if _SEP not in name:
        return None
    model, rest = name.split(_SEP, 1)
    parts = rest.split(".")
    if len(parts) != 3 or not parts[1].startswith("tp") or not parts[1][2:].isdigit():
        return None
    return ModelRef(model=model, layer=parts[0], tp=int(parts[1][2:]), batch=parts[2])


def select_model_cases(
    cases: Iterable[AttentionCase], names: Sequence[str], reg: Registry | None = None
) -> list[AttentionCase]:
    """The cases (of any suite or case list) that belong to one of the registry models ``names``, in order.

    A case belongs to a model when its ``batch_name`` records it (:func:`case_model`), which every ``models``
    suite case does and JSON records keep.  An unknown name raises ``ValueError`` listing the names.
    """
    reg = reg or builtin_registry()
    known = set(reg.names())
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"--model must be one of {sorted(known)}, got {unknown[0]!r}")
    wanted = set(names)
    return [c for c in cases if (ref := case_model(c)) is not None and ref.model in wanted]


def model_cases(
    models: Iterable[ModelConfig] | None = None, *, lengths: str = "full", reg: Registry | None = None
) -> list[AttentionCase]:
    """Every case of the ``models`` suite (``models``: a subset of the registry; ``lengths``: full or small)."""
    if lengths not in ("full", "small"):
        raise ValueError(f"lengths must be 'full' or 'small', got {lengths!r}")
    reg = reg or builtin_registry()
    pages = reg.engines.page_sizes
    out: list[AttentionCase] = []
    for model in reg.models if models is None else models:
        for tp in model.suite_tps:
            if model.mla is not None:
                out += _mla_cases(model, tp, lengths, pages)
            else:
                for layer in model.layer_counts():
                    out += _layer_cases(model, layer, tp, lengths, pages)
    return out


def _batch(name: str, lengths: str) -> tuple[str, Req]:
    key = name if lengths == "full" else "s" + name
    return key, (BATCHES if lengths == "full" else SMALL_BATCHES)[key]


def _case(model: ModelConfig, layer: str, tp: int, batch: str, lengths: str, **fields) -> AttentionCase:
    key, requests = _batch(batch, lengths)
    return AttentionCase(requests=requests, batch_name=f"{model.name}{_SEP}{layer}.tp{tp}.{key}", **fields)


def _scale(model: ModelConfig) -> float | None:
    scale = model.softmax_scale
    return None if scale is None else float(f"{scale:.6g}")


def _layer_cases(model: ModelConfig, layer: str, tp: int, lengths: str, pages: dict[str, int]) -> list[AttentionCase]:
    shard = model.shard(tp)
    base = dict(
        num_heads=shard.num_heads,
        num_kv_heads=shard.num_kv_heads,
        head_dim=model.head_dim,
        head_dim_v=model.head_dim_v,
        causal=True,
        window=model.window(layer),
        chunk=model.chunk(layer),
        softcap=model.softcap,
        alibi=model.alibi,
        sinks=model.sinks,
        scale=_scale(model),
        kv_layout="NHD",
    )
    vllm, sglang = pages["vllm_fa"], pages["sglang"]
    runs = [
        ("dec", vllm, "none"),
        ("dec", sglang, "none"),
        # flash_attn_with_kvcache's paged decode (FA2 takes pages divisible by 256 only)
        ("dec", pages["fa2_kvcache"], "none"),
        ("pf", vllm, "none"),
        # a varlen prefill over contiguous K/V (prefill-only and training-style callers; no block table)
        ("pf", None, "none"),
        ("cpmix", vllm, "none"),
        ("spec", vllm, "none"),
    ]
    if "fp8_e4m3" in model.kv_cache_dtypes:
        runs += [("dec", vllm, "fp8_e4m3"), ("cpmix", vllm, "fp8_e4m3")]
    return [
        _case(
            model, layer, tp, b, lengths, **{**base, "kv_layout": "NHD" if bs else "contiguous"}, block_size=bs, quant=q
        )
        for b, bs, q in runs
    ]


def _mla_cases(model: ModelConfig, tp: int, lengths: str, pages: dict[str, int]) -> list[AttentionCase]:
    mla = model.mla
    assert mla is not None
    scale = _scale(model)
    decode = model.shard(tp, num_kv_heads=1)  # absorbed: one latent kv head, replicated on every rank
    # FlashMLA's spelling in the case model: q = [absorbed nope | rope] is head_dim rope + qv latent (see case.py)
    dec = dict(
        num_heads=decode.num_heads,
        num_kv_heads=1,
        head_dim=mla.qk_rope_head_dim,
        head_dim_v=mla.kv_lora_rank,
        qv=True,
        causal=True,
        scale=scale,
        kv_layout="NHD",
    )
    flashmla, sglang = pages["flashmla"], pages["sglang"]
    runs = [("dec", flashmla, "none"), ("dec", sglang, "none"), ("spec", flashmla, "none")]
    if "fp8_e4m3" in model.kv_cache_dtypes:
        runs.append(("dec", flashmla, "fp8_e4m3"))
    out = [_case(model, "mla-decode", tp, b, lengths, block_size=bs, quant=q, **dec) for b, bs, q in runs]
    prefill = model.shard(tp)
    d, dv = mla.prefill_dims
    pre = dict(
        num_heads=prefill.num_heads,
        num_kv_heads=prefill.num_kv_heads,
        head_dim=d,
        head_dim_v=dv,
        causal=True,
        scale=scale,
    )
    out += [
        _case(model, "mla-prefill", tp, "pf", lengths, **pre),
        _case(model, "mla-prefill", tp, "chunk", lengths, **pre),
        # FA2-style kernels need equal head dims: the engine zero-pads V to d and strips the output
        _case(model, "mla-prefill", tp, "pf", lengths, v_padded=True, **pre),
    ]
    return out
