"""The run header's account of the CUDA driver's JIT cache (:func:`conformance.running.env.cuda_jit_cache`)."""

from __future__ import annotations

from pathlib import Path

from conformance.running import env as run_env
from conformance.running.env import cuda_jit_cache


def test_jit_cache_counts_the_folder_the_driver_uses(tmp_path: Path) -> None:
    folder = tmp_path / "cc"
    (folder / "a").mkdir(parents=True)
    (folder / "a" / "k1").write_bytes(b"x" * 10)
    (folder / "k2").write_bytes(b"y" * 5)
    got = cuda_jit_cache({"CUDA_CACHE_PATH": str(folder), "CUDA_CACHE_MAXSIZE": "4294967296"})
    assert got == {"path": str(folder), "disabled": False, "maxsize": "4294967296", "files": 2, "bytes": 15}
    off = cuda_jit_cache({"CUDA_CACHE_PATH": str(tmp_path / "none"), "CUDA_CACHE_DISABLE": "1"})
    assert off == {"path": str(tmp_path / "none"), "disabled": True, "files": 0, "bytes": 0}


def test_jit_cache_defaults_to_the_home_folder(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".nv" / "ComputeCache").mkdir(parents=True)
    (tmp_path / ".nv" / "ComputeCache" / "index").write_bytes(b"z")
    got = cuda_jit_cache({})
    assert got["path"] == str(tmp_path / ".nv" / "ComputeCache") and got["files"] == 1 and got["bytes"] == 1


def test_jit_cache_scan_is_bounded(tmp_path: Path, monkeypatch) -> None:
    for i in range(5):
        (tmp_path / f"k{i}").write_bytes(b"")
    monkeypatch.setattr(run_env, "_JIT_CACHE_SCAN", 3)
    assert cuda_jit_cache({"CUDA_CACHE_PATH": str(tmp_path)})["files"] == ">= 3"
