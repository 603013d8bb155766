"""Real models' attention configurations, as data: one TOML entry per model under ``conformance/models/data/``.

Each ``[[model]]`` entry holds what the attention kernels of an engine see of the model, every value as its
published Hugging Face ``config.json`` gives it (``config_url``; ``sources`` for a paper or model card where the
config lacks a field):

* ``num_layers``, ``num_heads``, ``num_kv_heads``, ``head_dim`` (and ``head_dim_v`` where V differs)
* ``layer_pattern``: the per-layer kinds, repeated over the layers from layer 0 (``global``: full causal
  attention; ``sliding``: a causal window of ``sliding_window`` keys, the query's own included, which engines pass
  as ``window_size = (sliding_window - 1, 0)``; ``chunked``: causal attention within chunks of
  ``attention_chunk_size`` tokens, FA3's ``attention_chunk``)
* ``softcap`` (``attn_logit_softcapping``), ``sinks`` (per-head learned sinks), ``alibi``, ``query_pre_attn_scalar``
  (the softmax scale is its inverse square root)
* ``[model.mla]``: multi-head latent attention (``kv_lora_rank``, ``qk_rope_head_dim``, ``qk_nope_head_dim``,
  ``v_head_dim``, the YaRN ``yarn_factor`` / ``mscale_all_dim`` that scale the softmax); engines run it as two
  kernels, :attr:`MLA.prefill_dims` (unabsorbed: d = nope + rope, dv = v_head_dim, kv heads = heads) and
  :attr:`MLA.decode_dims` (absorbed: d = kv_lora_rank + rope, dv = kv_lora_rank, one kv head)
* ``kv_cache_dtypes``: the KV-cache dtypes engines offer for it (default: every one of ``engines.toml``)
* ``serve_tp``: the largest tensor-parallel size it is commonly served at (the suite runs TP 1 and this one)
* ``checked_against``: where this registry's values were checked; ``unverified``: the fields that were not
  checked against any source (they come from the published config as remembered, and say so); ``notes``

Tensor-parallel shards (:meth:`ModelConfig.tp_shards`) are computed, never written: heads / TP and kv heads / TP,
the kv heads replicated (one per rank) when TP exceeds them, as vLLM does; a TP that does not divide the heads
(or whose kv split vLLM refuses) has no shard.  :func:`conformance.models.load.load_registry` validates every
entry and raises :class:`RegistryError` naming the file, the model, the field and the constraint.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path


__all__ = [
    "DATA_DIR",
    "LAYER_KINDS",
    "TP_SIZES",
    "EngineFacts",
    "MLA",
    "ModelConfig",
    "Registry",
    "RegistryError",
    "TPShard",
]

DATA_DIR = Path(__file__).parent / "data"
LAYER_KINDS = ("global", "sliding", "chunked")
TP_SIZES = (1, 2, 4, 8)


class RegistryError(ValueError):
    """A registry file that does not load or an entry that breaks a constraint (one line: file, model, field)."""


@dataclass(frozen=True)
class EngineFacts:
    """What the engines offer every model: KV-cache dtypes and page sizes (``data/engines.toml``)."""

    kv_cache_dtypes: tuple[str, ...]
    page_sizes: dict[str, int]
    sources: tuple[str, ...]


@dataclass(frozen=True)
class MLA:
    """Multi-head latent attention dimensions and the YaRN factors that scale its softmax."""

    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    yarn_factor: float | None = None
    mscale_all_dim: float | None = None

    @property
    def prefill_dims(self) -> tuple[int, int]:
        """Unabsorbed prefill (MHA): (qk_nope + qk_rope, v_head_dim), 192/128 for DeepSeek V3."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim, self.v_head_dim

    @property
    def decode_dims(self) -> tuple[int, int]:
        """Absorbed decode (MQA over the latent cache): (kv_lora_rank + qk_rope, kv_lora_rank), 576/512."""
        return self.kv_lora_rank + self.qk_rope_head_dim, self.kv_lora_rank

    @property
    def mscale(self) -> float:
        """YaRN's attention factor ``0.1 * mscale_all_dim * ln(factor) + 1`` (1 without YaRN)."""
        if not self.mscale_all_dim or not self.yarn_factor or self.yarn_factor <= 1:
            return 1.0
        return 0.1 * self.mscale_all_dim * math.log(self.yarn_factor) + 1.0


@dataclass(frozen=True)
class TPShard:
    """One tensor-parallel rank's attention: its query heads and kv heads (``kv_replicated``: TP > kv heads)."""

    tp: int
    num_heads: int
    num_kv_heads: int
    kv_replicated: bool


@dataclass(frozen=True)
class ModelConfig:
    """One registry entry (see the module docstring for the fields)."""

    name: str
    family: str
    hf_id: str
    config_url: str
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    serve_tp: int
    head_dim_v: int | None = None
    layer_pattern: tuple[str, ...] = ("global",)
    sliding_window: int | None = None
    attention_chunk_size: int | None = None
    softcap: float | None = None
    sinks: bool = False
    alibi: bool = False
    query_pre_attn_scalar: float | None = None
    mla: MLA | None = None
    kv_cache_dtypes: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()
    checked_against: tuple[str, ...] = ()
    unverified: tuple[str, ...] = ()
    notes: str = ""
    source_file: str = ""

    @property
    def dv(self) -> int:
        """The value head dim: ``head_dim_v``, or ``head_dim``."""
        return self.head_dim if self.head_dim_v is None else self.head_dim_v

    # ------------------------------------------------------------------ layers
    def layer_types(self) -> tuple[str, ...]:
        """The kind of every layer, layer 0 first (the pattern repeated)."""
        p = self.layer_pattern
        return tuple(p[i % len(p)] for i in range(self.num_layers))

    def layer_counts(self) -> dict[str, int]:
        """Layers per kind, kinds in the order they first appear."""
        counts: dict[str, int] = {}
        for kind in self.layer_types():
            counts[kind] = counts.get(kind, 0) + 1
        return counts

    def window(self, kind: str) -> tuple[int | None, int | None]:
        """The ``(left, right)`` window a layer of ``kind`` passes to the kernel (vLLM's ``(sliding_window - 1,
        0)``; unbounded for global and chunked layers)."""
        if kind == "sliding":
            assert self.sliding_window is not None
            return (self.sliding_window - 1, 0)
        return (None, None)

    def chunk(self, kind: str) -> int | None:
        return self.attention_chunk_size if kind == "chunked" else None

    # ------------------------------------------------------------------ scale
    @property
    def softmax_scale(self) -> float | None:
        """The softmax scale the engines pass, or None where it is the kernels' default ``head_dim ** -0.5``."""
        if self.mla is not None:
            return self.mla.prefill_dims[0] ** -0.5 * self.mla.mscale**2
        if self.query_pre_attn_scalar is not None and self.query_pre_attn_scalar != self.head_dim:
            return float(self.query_pre_attn_scalar) ** -0.5
        return None

    # ------------------------------------------------------------------ tensor parallel
    def tp_problem(self, tp: int, num_kv_heads: int | None = None) -> str | None:
        """Why vLLM cannot split this model's attention over ``tp`` ranks, or None where it can."""
        hk = self.num_kv_heads if num_kv_heads is None else num_kv_heads
        if tp < 1:
            return f"tp must be >= 1, got {tp}"
        if self.num_heads % tp:
            return f"{self.num_heads} heads are not divisible by TP {tp}"
        if hk >= tp and hk % tp:
            return f"{hk} kv heads are not divisible by TP {tp}"
        if hk < tp and tp % hk:
            return f"TP {tp} is not a multiple of {hk} kv heads (replication needs it)"
        return None

    def shard(self, tp: int, num_kv_heads: int | None = None) -> TPShard:
        """The shard of one rank at TP ``tp`` (``num_kv_heads``: another kv head count, e.g. MLA decode's 1)."""
        hk = self.num_kv_heads if num_kv_heads is None else num_kv_heads
        problem = self.tp_problem(tp, hk)
        if problem:
            raise ValueError(f"model {self.name}: {problem}")
        return TPShard(tp=tp, num_heads=self.num_heads // tp, num_kv_heads=max(1, hk // tp), kv_replicated=hk < tp)

    def tp_shards(self) -> tuple[TPShard, ...]:
        """The shards for TP 1, 2, 4, 8 that vLLM can build."""
        return tuple(self.shard(tp) for tp in TP_SIZES if self.tp_problem(tp) is None)

    @property
    def suite_tps(self) -> tuple[int, ...]:
        """The TP sizes the ``models`` suite runs: 1 and ``serve_tp``."""
        return tuple(sorted({1, self.serve_tp}))


@dataclass(frozen=True)
class Registry:
    models: tuple[ModelConfig, ...]
    engines: EngineFacts

    def names(self) -> list[str]:
        return [m.name for m in self.models]

    def get(self, name: str) -> ModelConfig:
        for m in self.models:
            if m.name == name:
                return m
        raise KeyError(f"model must be one of {self.names()}, got {name!r}")

    def __iter__(self):
        return iter(self.models)

    def __len__(self) -> int:
        return len(self.models)
