"""Loading and validating the model registry (``data/*.toml``): every entry's fields and constraints are checked
and a bad one raises :class:`~conformance.models.registry.RegistryError` in one line naming the file, the model,
the field and the constraint."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import fields
from functools import lru_cache
from pathlib import Path
from typing import Any

from conformance._toml import TOMLDecodeError, load_toml_file
from conformance.models.registry import (
    DATA_DIR,
    LAYER_KINDS,
    MLA,
    TP_SIZES,
    EngineFacts,
    ModelConfig,
    Registry,
    RegistryError,
)

__all__ = ["ENGINES_FILE", "PAGE_SIZE_KEYS", "builtin_registry", "load_registry"]

ENGINES_FILE = "engines.toml"
#: The page sizes the ``models`` suite uses (``data/engines.toml`` [page_sizes]).
PAGE_SIZE_KEYS = ("vllm_fa", "flashmla", "sglang", "fa2_kvcache")
_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]*$")
_MODEL_FIELDS = {f.name for f in fields(ModelConfig)} - {"source_file"}
_MLA_FIELDS = {f.name for f in fields(MLA)}
_REQUIRED = ("name", "family", "hf_id", "config_url", "num_layers", "num_heads", "num_kv_heads", "head_dim", "serve_tp")
_POSITIVE_INTS = (
    "num_layers",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "head_dim_v",
    "sliding_window",
    "attention_chunk_size",
)


def _engines(path: Path) -> EngineFacts:
    data = _read(path)
    try:
        offered = tuple(data["kv_cache_dtypes"]["offered"])
        pages = {k: v for k, v in data["page_sizes"].items() if k != "sources"}
        sources = tuple(data["kv_cache_dtypes"].get("sources", ())) + tuple(data["page_sizes"].get("sources", ()))
    except (KeyError, TypeError) as exc:
        raise RegistryError(f"{path.name}: needs [kv_cache_dtypes] offered and [page_sizes] ({exc})") from None
    if not offered or not all(isinstance(v, int) and v > 0 for v in pages.values()):
        raise RegistryError(f"{path.name}: kv_cache_dtypes.offered must be non-empty and page sizes positive ints")
    missing = sorted(set(PAGE_SIZE_KEYS) - set(pages))
    if missing:
        raise RegistryError(f"{path.name}: page_sizes: needs {list(PAGE_SIZE_KEYS)}, {missing[0]!r} is missing")
    return EngineFacts(kv_cache_dtypes=offered, page_sizes=pages, sources=sources)


def _read(path: Path) -> dict[str, Any]:
    try:
        return load_toml_file(path)
    except (OSError, TOMLDecodeError) as exc:
        raise RegistryError(f"{path}: cannot be read as TOML: {exc}") from None


def _model(entry: dict[str, Any], where: str, engines: EngineFacts) -> ModelConfig:
    def fail(field: str, constraint: str) -> RegistryError:
        return RegistryError(f"{where}: {field}: {constraint}")

    unknown = sorted(set(entry) - _MODEL_FIELDS)
    if unknown:
        raise fail(unknown[0], f"unknown field (known: {sorted(_MODEL_FIELDS)})")
    for key in _REQUIRED:
        if key not in entry:
            raise fail(key, "required")
    for key in _POSITIVE_INTS:
        value = entry.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
            raise fail(key, f"must be a positive integer, got {value!r}")
    for key in ("name", "family", "hf_id", "config_url", "notes"):
        if key in entry and not isinstance(entry[key], str):
            raise fail(key, f"must be a string, got {entry[key]!r}")
    for key in ("sinks", "alibi"):
        if key in entry and not isinstance(entry[key], bool):
            raise fail(key, f"must be true or false, got {entry[key]!r}")
    for key in ("softcap", "query_pre_attn_scalar"):
        value = entry.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise fail(key, f"must be a number, got {value!r}")
    if not isinstance(entry["serve_tp"], int) or isinstance(entry["serve_tp"], bool):
        raise fail("serve_tp", f"must be an integer, got {entry['serve_tp']!r}")
    kw = dict(entry)
    mla = kw.pop("mla", None)
    if mla is not None and not isinstance(mla, dict):
        raise fail("mla", "must be a table ([model.mla])")
    if mla is not None:
        bad = sorted(set(mla) - _MLA_FIELDS)
        if bad:
            raise fail(f"mla.{bad[0]}", f"unknown field (known: {sorted(_MLA_FIELDS)})")
        try:
            kw["mla"] = MLA(**mla)
        except TypeError as exc:
            raise fail("mla", str(exc)) from None
    for key in ("layer_pattern", "kv_cache_dtypes", "sources", "checked_against", "unverified"):
        if key in kw:
            if not isinstance(kw[key], list) or not all(isinstance(x, str) for x in kw[key]):
                raise fail(key, "must be a list of strings")
            kw[key] = tuple(kw[key])
    kw.setdefault("kv_cache_dtypes", engines.kv_cache_dtypes)
    for key in ("softcap", "query_pre_attn_scalar"):
        if kw.get(key) is not None:
            kw[key] = float(kw[key])
    model = ModelConfig(**kw, source_file=where.split(":")[0])
    for field, constraint in _problems(model, engines):
        raise fail(field, constraint)
    return model


def _problems(m: ModelConfig, engines: EngineFacts) -> Iterable[tuple[str, str]]:
    if not _NAME.match(m.name):
        yield "name", f"must be lower-case letters, digits, '.' and '-', got {m.name!r}"
    if not m.config_url.startswith("https://huggingface.co/") or not m.config_url.endswith("config.json"):
        yield "config_url", f"must be a https://huggingface.co/... config.json URL, got {m.config_url!r}"
    if m.hf_id not in m.config_url:
        yield "config_url", f"must be the config of hf_id {m.hf_id!r}, got {m.config_url!r}"
    if m.num_heads % m.num_kv_heads:
        yield "num_kv_heads", f"num_heads ({m.num_heads}) must be a multiple of num_kv_heads ({m.num_kv_heads})"
    if not m.layer_pattern or any(k not in LAYER_KINDS for k in m.layer_pattern):
        yield "layer_pattern", f"must be a non-empty list of {LAYER_KINDS}, got {list(m.layer_pattern)}"
    if len(m.layer_pattern) > m.num_layers:
        yield "layer_pattern", f"is longer ({len(m.layer_pattern)}) than num_layers ({m.num_layers})"
    if ("sliding" in m.layer_pattern) != (m.sliding_window is not None):
        yield "sliding_window", "must be set exactly when layer_pattern has sliding layers"
    if ("chunked" in m.layer_pattern) != (m.attention_chunk_size is not None):
        yield "attention_chunk_size", "must be set exactly when layer_pattern has chunked layers"
    if m.softcap is not None and m.softcap <= 0:
        yield "softcap", f"must be positive, got {m.softcap}"
    if m.query_pre_attn_scalar is not None and m.query_pre_attn_scalar <= 0:
        yield "query_pre_attn_scalar", f"must be positive, got {m.query_pre_attn_scalar}"
    if not m.kv_cache_dtypes or any(d not in engines.kv_cache_dtypes for d in m.kv_cache_dtypes):
        yield "kv_cache_dtypes", f"must be a non-empty subset of {list(engines.kv_cache_dtypes)}"
    if m.serve_tp not in TP_SIZES:
        yield "serve_tp", f"must be one of {TP_SIZES}, got {m.serve_tp}"
    elif m.tp_problem(m.serve_tp):
        yield "serve_tp", str(m.tp_problem(m.serve_tp))
    known = _MODEL_FIELDS | {f"mla.{f}" for f in _MLA_FIELDS}
    for name in m.unverified:
        if name not in known:
            yield "unverified", f"{name!r} is not a field (known: {sorted(known)})"
    if m.mla is not None:
        mla = m.mla
        for f in ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
            value = getattr(mla, f)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                yield f"mla.{f}", f"must be a positive integer, got {value!r}"
                return
        for f in ("yarn_factor", "mscale_all_dim"):
            value = getattr(mla, f)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
                yield f"mla.{f}", f"must be a positive number, got {value!r}"
                return
        if (m.head_dim, m.dv) != mla.prefill_dims:
            yield "head_dim", f"an MLA entry's head_dim / head_dim_v must be the prefill dims {mla.prefill_dims}"
        if m.num_kv_heads != m.num_heads:
            yield "num_kv_heads", "an MLA entry's kv heads are the unabsorbed prefill's: num_heads"
        if m.layer_pattern != ("global",) or m.alibi or m.softcap is not None or m.sinks:
            yield "mla", "MLA entries here have global layers only, without alibi, softcap or sinks"


def load_registry(data_dir: str | Path = DATA_DIR) -> Registry:
    """Every ``*.toml`` under ``data_dir`` but ``engines.toml``, files in name order, validated."""
    data_dir = Path(data_dir)
    engines_path = data_dir / ENGINES_FILE
    if not engines_path.is_file():
        raise RegistryError(f"{engines_path}: missing (the engines' KV dtypes and page sizes)")
    engines = _engines(engines_path)
    models: list[ModelConfig] = []
    files = sorted(p for p in data_dir.glob("*.toml") if p.name != ENGINES_FILE)
    if not files:
        raise RegistryError(f"{data_dir}: holds no model files (*.toml)")
    for path in files:
        entries = _read(path).get("model")
        if not isinstance(entries, list) or not entries:
            raise RegistryError(f"{path.name}: needs at least one [[model]] entry")
        for i, entry in enumerate(entries):
            where = f"{path.name}: model {entry.get('name', f'#{i}')!r}"
            models.append(_model(entry, where, engines))
    seen: set[str] = set()
    for m in models:
        if m.name in seen:
            raise RegistryError(f"{m.source_file}: model {m.name!r}: name: must be unique")
        seen.add(m.name)
    return Registry(models=tuple(models), engines=engines)


@lru_cache(maxsize=1)
def builtin_registry() -> Registry:
    """The built-in registry (loaded once per process)."""
    return load_registry()
