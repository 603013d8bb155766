"""The model registry: every entry loads, validates and cites its config; TP shard arithmetic; bad data fails."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest

from conformance.models import RegistryError, builtin_registry, load_registry
from conformance.models.registry import DATA_DIR, TP_SIZES

FAMILIES = {
    "llama2",
    "llama3",
    "llama4",
    "mistral",
    "mixtral",
    "qwen2.5",
    "qwen3",
    "gemma2",
    "gemma3",
    "gpt-oss",
    "deepseek-v2",
    "deepseek-v3",
    "phi3",
    "phi4",
    "cohere",
    "glm4",
    "falcon",
    "mpt",
    "bloom",
    "kimi-k2",
}


def test_registry_holds_25_models_across_the_families() -> None:
    reg = builtin_registry()
    assert len(reg) >= 25
    assert FAMILIES <= {m.family for m in reg}
    assert len(set(reg.names())) == len(reg)


@pytest.mark.parametrize("model", builtin_registry().models, ids=lambda m: m.name)
def test_every_entry_is_consistent_and_cites_its_config(model) -> None:
    assert model.config_url.startswith("https://huggingface.co/") and model.config_url.endswith("config.json")
    assert model.hf_id in model.config_url
    assert model.num_heads % model.num_kv_heads == 0
    assert min(model.num_layers, model.num_heads, model.num_kv_heads, model.head_dim, model.dv) > 0
    assert model.checked_against or model.unverified, "an entry says where it was checked, or what was not"
    counts = model.layer_counts()
    assert sum(counts.values()) == model.num_layers
    assert model.shard(1).num_heads == model.num_heads and model.serve_tp in model.suite_tps


def test_tp_shards_split_heads_and_replicate_kv_heads_like_vllm() -> None:
    reg = builtin_registry()
    llama = reg.get("llama-3.1-70b")  # 64 / 8
    assert [(s.tp, s.num_heads, s.num_kv_heads, s.kv_replicated) for s in llama.tp_shards()] == [
        (1, 64, 8, False),
        (2, 32, 4, False),
        (4, 16, 2, False),
        (8, 8, 1, False),
    ]
    qwen = reg.get("qwen3-235b-a22b")  # 64 / 4: TP 8 keeps one replicated kv head per rank
    assert qwen.shard(8).num_kv_heads == 1 and qwen.shard(8).kv_replicated
    assert reg.get("falcon-7b").tp_shards()[-1].tp == 1  # 71 heads: no split
    phi4 = reg.get("phi-4")  # 40 / 10: TP 4 divides the heads, not the 10 kv heads
    assert [s.tp for s in phi4.tp_shards()] == [1, 2] and "kv heads" in phi4.tp_problem(4)
    for model in reg:
        for shard in model.tp_shards():
            assert shard.tp in TP_SIZES
            assert shard.num_heads * shard.tp == model.num_heads
            assert shard.num_heads % shard.num_kv_heads == 0
            assert shard.num_kv_heads == max(1, model.num_kv_heads // shard.tp)


def test_layer_patterns_windows_and_scales() -> None:
    reg = builtin_registry()
    oss = reg.get("gpt-oss-120b")
    assert oss.layer_types()[:4] == ("sliding", "global", "sliding", "global") and oss.sinks
    assert oss.window("sliding") == (127, 0) and oss.window("global") == (None, None)
    scout = reg.get("llama-4-scout-17b-16e")
    assert scout.layer_counts() == {"chunked": 36, "global": 12} and scout.chunk("chunked") == 8192
    assert reg.get("gemma-3-27b").layer_counts() == {"sliding": 52, "global": 10}
    assert reg.get("gemma-3-27b").softmax_scale == pytest.approx(168**-0.5)
    assert reg.get("gemma-2-9b").softmax_scale is None  # query_pre_attn_scalar 256 = head_dim: the default
    v3 = reg.get("deepseek-v3")
    assert v3.mla.prefill_dims == (192, 128) and v3.mla.decode_dims == (576, 512)
    assert v3.softmax_scale == pytest.approx(192**-0.5 * (0.1 * math.log(40) + 1) ** 2)
    assert {m.name for m in reg if m.alibi} >= {"falcon-rw-1b", "mpt-7b", "bloom"}


def _copy(tmp_path: Path) -> Path:
    dst = tmp_path / "data"
    shutil.copytree(DATA_DIR, dst)
    return dst


@pytest.mark.parametrize(
    "old, new, message",
    [
        (
            "num_kv_heads = 8\nhead_dim = 128  # 8192 / 64\nserve_tp = 8",
            "num_kv_heads = 7\nhead_dim = 128\nserve_tp = 8",
            "num_kv_heads: num_heads \\(64\\) must be a multiple",
        ),
        (
            'config_url = "https://huggingface.co/meta-llama/Llama-2-70b-hf/blob/main/config.json"',
            'config_url = ""',
            "config_url",
        ),
        (
            "num_layers = 80\nnum_heads = 64\nnum_kv_heads = 8\nhead_dim = 128  # 8192 / 64\nserve_tp = 8",
            "num_layers = 80\nnum_heads = 64\nnum_kv_heads = 8\nhead_dim = 0\nserve_tp = 8",
            "head_dim: must be a positive",
        ),
        ('name = "llama-2-70b"', 'name = "llama-2-70b"\nwindo = 3', "windo: unknown field"),
        ('name = "llama-2-70b"', 'name = "llama-2-7b"', "name: must be unique"),
        ('name = "llama-2-70b"', 'name = "llama-2-70b"\nunverified = ["heads"]', "'heads' is not a field"),
    ],
)
def test_a_bad_entry_is_one_line_naming_file_model_and_field(tmp_path: Path, old: str, new: str, message: str) -> None:
    data = _copy(tmp_path)
    path = data / "llama.toml"
    text = path.read_text()
    assert text.count(old) >= 1, old
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(RegistryError, match=message) as err:
        load_registry(data)
    assert str(err.value).startswith("llama.toml: model") and "\n" not in str(err.value)


def test_missing_or_unreadable_files_fail(tmp_path: Path) -> None:
    data = _copy(tmp_path)
    (data / "qwen.toml").write_text("[[model]\n")
    with pytest.raises(RegistryError, match="cannot be read as TOML"):
        load_registry(data)
    (data / "qwen.toml").unlink()
    engines = data / "engines.toml"
    engines.write_text(engines.read_text().replace("flashmla = 64\n", ""))
    with pytest.raises(RegistryError, match="page_sizes: needs .*'flashmla' is missing"):
        load_registry(data)
    engines.unlink()
    with pytest.raises(RegistryError, match="engines.toml: missing"):
        load_registry(data)


def test_sliding_window_must_come_with_sliding_layers(tmp_path: Path) -> None:
    data = _copy(tmp_path)
    path = data / "mistral.toml"
    path.write_text(path.read_text().replace("sliding_window = 4096\n", "", 1))
    with pytest.raises(RegistryError, match="mistral-7b-v0.1.*sliding_window: must be set exactly"):
        load_registry(data)


def test_a_bad_model_entry_is_one_line_and_exit_2_from_the_cli(tmp_path) -> None:
    """The registry loads when the case model is imported: a model file edited by hand (the add-model guide) used
    to end every command in a traceback and exit 1."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[3]
    for pkg in ("attnref", "attnfast", "conformance"):
        shutil.copytree(repo / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    toml = tmp_path / "conformance" / "models" / "data" / "gpt_oss.toml"
    text = toml.read_text(encoding="utf-8")
    assert "num_kv_heads = 8" in text
    toml.write_text(text.replace("num_kv_heads = 8", "num_kv_heads = 7", 1), encoding="utf-8")
    res = subprocess.run(
        [sys.executable, "-m", "conformance", "cases", "--suite", "models", "--model", "gpt-oss-20b"],
        cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path), "CUDA_VISIBLE_DEVICES": ""},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "gpt_oss.toml" in res.stderr and "num_kv_heads" in res.stderr, res.stderr
