"""A worker's Python keeps the bytecode it compiles when torch was installed without any
(:func:`conformance.running.worker_client.bytecode_cache`), and the run header says where it went."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from conformance.running import worker_client
from conformance.running.worker_client import PYCACHE_ENV, WorkerClient, bytecode_cache, use_bytecode_cache


@pytest.fixture
def no_torch_bytecode(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """torch as a CI image installs it (no .pyc beside its sources), the attnconf cache in a temporary folder."""
    monkeypatch.setattr(worker_client, "_has_bytecode", lambda module: module != "torch")
    monkeypatch.setenv("ATTNCONF_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(PYCACHE_ENV, raising=False)
    return tmp_path / "cache" / "pycache"


def test_workers_compile_into_the_attnconf_cache_when_torch_has_no_bytecode(no_torch_bytecode: Path) -> None:
    assert bytecode_cache({}) == str(no_torch_bytecode)
    assert bytecode_cache({"PYTHONDONTWRITEBYTECODE": "1"}) == str(no_torch_bytecode)


def test_a_folder_the_caller_chose_is_kept(no_torch_bytecode: Path) -> None:
    assert bytecode_cache({PYCACHE_ENV: "/elsewhere"}) is None
    env = WorkerClient(env={})._environment()
    assert env[PYCACHE_ENV] == str(no_torch_bytecode)
    # a client's own variables come last: a folder (or None, no folder) given to the client wins
    assert WorkerClient(env={PYCACHE_ENV: "/mine"})._environment()[PYCACHE_ENV] == "/mine"
    assert PYCACHE_ENV not in WorkerClient(env={PYCACHE_ENV: None})._environment()


def test_nothing_changes_when_torch_has_its_bytecode_or_the_cache_is_off(
    no_torch_bytecode: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.setenv("ATTNCONF_CACHE_DIR", "off")
    assert bytecode_cache({}) is None
    env = WorkerClient()._environment()
    assert PYCACHE_ENV not in env and env["PYTHONDONTWRITEBYTECODE"] == "1"
    monkeypatch.setenv("ATTNCONF_CACHE_DIR", str(no_torch_bytecode.parent))
    monkeypatch.setattr(worker_client, "_has_bytecode", lambda module: True)
    assert bytecode_cache({}) is None


@pytest.mark.parametrize("bare", worker_client.BYTECODE_PACKAGES)
def test_any_of_the_packages_a_worker_imports_without_bytecode_is_enough(
    no_torch_bytecode: Path, monkeypatch: pytest.MonkeyPatch, bare: str
) -> None:
    """FA4's Python and its CuTe DSL unpacked without ``.pyc`` beside a torch that has them: the imports of every
    worker's first FA4 call would be compiled again, so the folder is used too."""
    monkeypatch.setattr(worker_client, "_has_bytecode", lambda module: module != bare)
    assert bytecode_cache({}) == str(no_torch_bytecode)


def test_the_worker_is_told_to_write_bytecode(no_torch_bytecode: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    env = WorkerClient()._environment()
    assert env[PYCACHE_ENV] == str(no_torch_bytecode) and "PYTHONDONTWRITEBYTECODE" not in env


def test_has_bytecode_reads_the_pycache_beside_the_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, compiled in (("pkg_with_pyc", True), ("pkg_without_pyc", False)):
        package = tmp_path / name
        (package / "__pycache__").mkdir(parents=True)
        (package / "__init__.py").write_text("")
        if compiled:
            (package / "__pycache__" / f"__init__.{sys.implementation.cache_tag}.pyc").write_bytes(b"")
    monkeypatch.syspath_prepend(str(tmp_path))
    worker_client._has_bytecode.cache_clear()
    try:
        assert worker_client._has_bytecode("pkg_with_pyc") is True
        assert worker_client._has_bytecode("pkg_without_pyc") is False
        assert worker_client._has_bytecode("no_such_package_anywhere") is True  # nothing to compile
        assert worker_client._has_bytecode("sys") is True  # built in: no source
    finally:
        worker_client._has_bytecode.cache_clear()


def test_the_command_compiles_into_the_same_folder(no_torch_bytecode: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's own process adopts the folder before it imports torch, so its ``import torch`` fills it for the
    workers; a folder already in force in this interpreter is kept."""
    from conformance.cli import main

    monkeypatch.setattr(sys, "pycache_prefix", None)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    assert main(["suites"]) == 0
    assert sys.pycache_prefix == str(no_torch_bytecode) and sys.dont_write_bytecode is False
    monkeypatch.setattr(sys, "pycache_prefix", "/mine")
    assert use_bytecode_cache() is None and sys.pycache_prefix == "/mine"
    monkeypatch.setattr(sys, "pycache_prefix", None)
    monkeypatch.setattr(worker_client, "_has_bytecode", lambda module: True)
    assert use_bytecode_cache() is None and sys.pycache_prefix is None


@pytest.mark.slow
def test_a_worker_writes_its_bytecode_there_and_the_header_says_so(
    no_torch_bytecode: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    client = WorkerClient()
    try:
        reply = client.request({"op": "describe", "backends": ["sdpa-cpu"], "device": "cpu"}, timeout=300)
        assert reply.kind == "ok" and reply.data["ok"], reply.reason or client.stderr_tail()
        assert reply.data["env"]["python_bytecode"] == {"prefix": str(no_torch_bytecode), "writes": True}
    finally:
        client.close()
    compiled = list(no_torch_bytecode.rglob("*.pyc"))
    assert any("torch" in p.parts for p in compiled), f"{len(compiled)} files, none of torch's"


def test_the_command_adopts_the_folder_before_it_imports_torch(tmp_path: Path) -> None:
    """In a fresh interpreter (torch not loaded yet): the CLI asks for the folder before its command imports torch,
    and torch's own modules then compile into it."""
    import subprocess
    import textwrap

    code = textwrap.dedent(
        """
        import sys
        import conformance.running.worker_client as w
        w._has_bytecode = lambda module: False  # torch as a CI image installs it
        real = w.use_bytecode_cache
        def spy():
            print("torch imported before:", "torch" in sys.modules)
            return real()
        w.use_bytecode_cache = spy
        from conformance.cli import main
        code = main(["cases", "--suite", "smoke", "--count"])
        print("torch imported after:", "torch" in sys.modules, "exit", code)
        """
    )
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "ATTNCONF_CACHE_DIR": str(tmp_path / "cache")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[3])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert "torch imported before: False" in out.stdout and "torch imported after: True exit 0" in out.stdout, (
        out.stdout + out.stderr
    )
    assert any(p.name.startswith("__init__") for p in (tmp_path / "cache" / "pycache").rglob("torch/__init__*.pyc"))
