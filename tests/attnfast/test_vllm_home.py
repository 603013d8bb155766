"""vLLM's kernels decided in one place (issue 27 item 3, :mod:`attnfast._vllm`): the version the records of
``fa3-vllm`` and ``flashmla`` carry, whether each kernel imports, and the same FA3 probe in the engine replaying
vLLM V1's CUDA graphs (``graph_scheduler``).  On CPU, with fake ``vllm`` modules in ``sys.modules``."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from attnfast import _vllm
from attnfast.fa3_vllm import FA3VllmBackend
from attnfast.flashmla import FlashMLABackend
from conformance.cases.case import AttentionCase
from conformance.engines.vllm_v1.graph_builder import graph_scheduler, host_scheduler_metadata

CASE = AttentionCase(requests=((1, 70),), num_heads=4, num_kv_heads=1, head_dim=64, causal=True)


def _fake_vllm(monkeypatch: pytest.MonkeyPatch, fa3_library: bool, version: str = "0.99.1") -> None:
    """A ``vllm`` without distribution metadata (``__version__`` only, as the GPU kit unpacks it) whose
    ``vllm_flash_attn`` imports with (or without) its FA3 library."""
    from importlib import metadata

    try:
        metadata.version("vllm")
    except metadata.PackageNotFoundError:
        pass
    else:
        pytest.skip("vLLM is installed here: its metadata would win over the fake's __version__")
    vllm = types.ModuleType("vllm")
    vllm.__version__ = version  # type: ignore[attr-defined]
    fork = types.ModuleType(_vllm.FA3_MODULE)
    fork.get_scheduler_metadata = lambda *a, **kw: torch.zeros(2, dtype=torch.int32)  # type: ignore[attr-defined]
    interface = types.ModuleType(f"{_vllm.FA3_MODULE}.flash_attn_interface")
    interface.FA3_AVAILABLE = fa3_library  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, _vllm.FA3_MODULE, fork)
    monkeypatch.setitem(sys.modules, f"{_vllm.FA3_MODULE}.flash_attn_interface", interface)


def test_both_adapters_carry_vllms_version(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_vllm(monkeypatch, fa3_library=True)
    assert _vllm.vllm_version() == "0.99.1"
    assert FA3VllmBackend().version() == FlashMLABackend().version() == "0.99.1"
    assert FA3VllmBackend().describe()["version"] == "0.99.1"


def test_without_vllm_the_version_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm raises ImportError
    from importlib import metadata

    try:
        metadata.version("vllm")
    except metadata.PackageNotFoundError:
        assert FA3VllmBackend().version() == FlashMLABackend().version() == "not installed"
    else:
        pytest.skip("vLLM is installed here")


def test_the_engine_and_the_adapter_decide_fa3_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    # the fork without its FA3 library: neither the adapter nor the engine's graph scheduler takes it
    _fake_vllm(monkeypatch, fa3_library=False)
    with pytest.raises(ImportError, match="FA3 library"):
        _vllm.import_vllm_fa3()
    got = FA3VllmBackend().is_available()
    assert not got and got.reason.startswith("vllm.vllm_flash_attn (FA3) is not importable: ")
    cu = torch.tensor([0, 1], dtype=torch.int32)
    assert graph_scheduler(CASE, cu, "cuda") is host_scheduler_metadata
    # with it: both take the kernel (the adapter then asks for a Hopper device)
    _fake_vllm(monkeypatch, fa3_library=True)
    assert graph_scheduler(CASE, cu, "cuda") is not host_scheduler_metadata
    assert graph_scheduler(CASE, cu, "cpu") is host_scheduler_metadata
    got = FA3VllmBackend().is_available()
    assert "not importable" not in got.reason


def test_flashmla_availability_names_its_module(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, _vllm.FLASHMLA_MODULE, None)
    got = FlashMLABackend().is_available()
    assert not got and got.reason.startswith(f"FlashMLA ({_vllm.FLASHMLA_MODULE}) is not importable: ")
    fake = types.ModuleType(_vllm.FLASHMLA_MODULE)
    monkeypatch.setitem(sys.modules, _vllm.FLASHMLA_MODULE, fake)
    assert _vllm.import_flashmla() is fake
    assert "not importable" not in FlashMLABackend().is_available().reason
