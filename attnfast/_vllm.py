"""vLLM's kernels (its FA3 fork and FlashMLA): where they are imported from, whether they run here, and which
version a record of them carries.  The one place the ``fa3-vllm`` and ``flashmla`` adapters
(:mod:`attnfast.fa3_vllm`, :mod:`attnfast.flashmla`) and the engines replaying vLLM
(``conformance/engines/vllm_v1/graph_builder.py``) decide these.

* Version: both kernels are built into the ``vllm`` wheel and have no version of their own, so a record carries
  vLLM's (:func:`vllm_version`: the ``vllm`` distribution's, else ``vllm.__version__`` for a vLLM unpacked without
  its metadata, else ``"not installed"``; :func:`attnfast.base.package_version`).  The ``versions`` ranges of
  ``ledgers/fa3-vllm.toml`` and ``ledgers/flashmla.toml`` are ranges of it.
* Importable: the FA3 fork is ``vllm.vllm_flash_attn`` *with* its FA3 library (``flash_attn_interface.FA3_AVAILABLE``:
  the module imports without it, with FA2's alone); FlashMLA is its interface module.  Each importer raises
  (``ImportError``, or an ``OSError`` from a library built for another torch) when the kernel is not here.
* Available (:func:`vllm_kernel_support`): importable, and a CUDA device of compute capability 9 or more (both are
  Hopper builds).

Importing this module imports no kernel.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType

from ._fa_common import cuda_device_support
from .base import Support, package_version

__all__ = [
    "FA3_MODULE",
    "FLASHMLA_MODULE",
    "MIN_MAJOR",
    "VLLM_DIST",
    "import_flashmla",
    "import_vllm_fa3",
    "vllm_kernel_support",
    "vllm_version",
]

#: the distribution (and top-level module) whose version the records of vLLM's kernels carry
VLLM_DIST = "vllm"
#: vLLM's FA3 fork: ``flash_attn_varlen_func(..., fa_version=3)``, ``get_scheduler_metadata``
FA3_MODULE = "vllm.vllm_flash_attn"
#: FlashMLA's interface as vLLM ships it: ``flash_mla_with_kvcache``, ``get_mla_metadata``
FLASHMLA_MODULE = "vllm.third_party.flashmla.flash_mla_interface"
#: the least compute capability (major) both kernels run on: Hopper
MIN_MAJOR = 9


def vllm_version() -> str:
    """The version of vLLM, whose wheel carries both kernels (``"not installed"`` without it)."""
    return package_version(VLLM_DIST, module=VLLM_DIST)


def import_vllm_fa3() -> ModuleType:
    """``vllm.vllm_flash_attn`` with its FA3 library; ``ImportError`` saying what is missing."""
    mod = importlib.import_module(FA3_MODULE)
    if not getattr(importlib.import_module(f"{FA3_MODULE}.flash_attn_interface"), "FA3_AVAILABLE", False):
        raise ImportError(f"{FA3_MODULE} is importable but its FA3 library (_vllm_fa3_C) is not")
    return mod


def import_flashmla() -> ModuleType:
    """FlashMLA's interface module (:data:`FLASHMLA_MODULE`)."""
    return importlib.import_module(FLASHMLA_MODULE)


def vllm_kernel_support(importer: Callable[[], ModuleType], what: str) -> Support:
    """Whether the kernel ``importer`` imports can run here: it imports (else ``"<what> is not importable: <why>"``)
    and a CUDA device of compute capability :data:`MIN_MAJOR` or more is present."""
    try:
        importer()
    except Exception as exc:  # ImportError, or an OSError from a library built for another torch
        return Support(False, f"{what} is not importable: {exc}")
    return cuda_device_support(min_major=MIN_MAJOR)
