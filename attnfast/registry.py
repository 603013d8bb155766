"""Backend registry: the built-in adapters plus third-party ones from entry points.

A vendor registers a backend without touching this repository, in its own ``pyproject.toml``::

    [project.entry-points."attnfast.backends"]
    mykernel = "mykernel_attnconf:MyKernelBackend"

The entry point names a :class:`attnfast.base.Backend` subclass (or a zero-argument factory).
Built-ins are imported lazily, so a missing kernel package never breaks the registry.
"""

from __future__ import annotations

import importlib
import importlib.util
from importlib import metadata

from .base import Backend

__all__ = ["BUILTIN", "available_names", "get_backend", "load_all", "runnable_names"]

#: name -> "module:attribute" of the built-in adapters.
BUILTIN: dict[str, str] = {
    "sdpa-cpu": "attnfast.sdpa:SdpaCpuBackend",
    "flex-cpu": "attnfast.flex:FlexCpuBackend",
    "fa2": "attnfast.fa2:FA2Backend",
    "fa3": "attnfast.fa3:FA3Backend",
    "fa3-vllm": "attnfast.fa3_vllm:FA3VllmBackend",
    "flashmla": "attnfast.flashmla:FlashMLABackend",
    "fa4": "attnfast.fa4:FA4Backend",
    "torch-flash": "attnfast.torch_flash:TorchFlashBackend",
    "sdpa-cuda": "attnfast.sdpa:SdpaCudaBackend",
}

GROUP = "attnfast.backends"


def _entry_points() -> dict[str, str]:
    return {ep.name: ep.value for ep in metadata.entry_points(group=GROUP)}


def available_names() -> list[str]:
    """Every registered name: built-ins first, then entry points."""
    names = [n for n in BUILTIN if _importable(BUILTIN[n])]
    return names + [n for n in _entry_points() if n not in BUILTIN]


def _importable(target: str) -> bool:
    module = target.split(":")[0]
    return importlib.util.find_spec(module) is not None


def get_backend(name: str) -> Backend:
    """Instantiate a backend by registry name; ``ValueError`` lists the known names."""
    target = BUILTIN.get(name) or _entry_points().get(name)
    if target is None:
        raise ValueError(f"backend must be one of {available_names()}, got {name!r}")
    module_name, _, attr = target.partition(":")
    obj = getattr(importlib.import_module(module_name), attr)
    backend = obj()
    if not isinstance(backend, Backend):
        raise TypeError(
            f"entry point {name!r} ({target}) must produce an attnfast.base.Backend, got {type(backend).__name__}"
        )
    return backend


def runnable_names(device: str) -> list[str]:
    """Registered backends that are available here and run on ``device`` (``cpu``, ``cuda``, ``cuda:N``)."""
    kind = device.split(":")[0]
    names = []
    for name in available_names():
        try:
            backend = get_backend(name)
        except Exception:  # a broken third-party entry point must not hide the others
            continue
        if kind in backend.devices and backend.is_available():
            names.append(name)
    return names


def load_all() -> list[Backend]:
    return [get_backend(n) for n in available_names()]
