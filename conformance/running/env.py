"""The environment a run happened in, for the header line of a results file.

:func:`resolve_backend` turns what the user typed (a registry name or ``module:Class``) into an
adapter.  The header has two halves: :func:`host_env` (machine, OS, Python, torch, CUDA, GPU)
and :func:`backend_info` (one adapter's name, family, package version, availability and declared
refusals, in the describe-info format :mod:`attnfast.base` reads back: ``REFUSES_PREFIX``, ``refused_features``,
``declared_support_of_info``).  Both are
collected inside the worker process (:mod:`conformance.running.worker`), because asking for the GPU's name
and compute capability creates a CUDA context, which the parent process must not own: a crashed
kernel would otherwise leave the parent with a broken context.

Every probe tolerates failure (no git, no ``nvidia-smi``, no GPU): a missing fact is recorded as
``"n/a"`` rather than stopping the run.
"""

from __future__ import annotations

import os
import platform
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from attnfast.base import REFUSES_PREFIX, refused_features
from conformance.running.pool import usable_cpus

__all__ = [
    "REFUSES_PREFIX",
    "backend_info",
    "cuda_jit_cache",
    "git_commit",
    "host_env",
    "refused_features",
    "resolve_backend",
]

_REPO = Path(__file__).resolve().parents[2]


def _run(cmd: list[str], cwd: Path | None = None) -> str | None:
    """stdout of a short command, or None when it is missing or fails."""
    if shutil.which(cmd[0]) is None:
        return None
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def git_commit(repo: Path = _REPO) -> str:
    """Commit of the harness checkout (``+dirty`` when the tree has changes), or ``"n/a"``.

    ``$ATTNCONF_GIT_COMMIT``, when set, wins: a GPU runner that receives a copy of the files (with no
    ``.git``, or with a ``.git`` that is not the one the files came from, as seen on a GPU machine whose
    copy reported the session's starting commit ``+dirty``) is told the commit by whoever sent them.
    """
    if os.environ.get("ATTNCONF_GIT_COMMIT"):
        return os.environ["ATTNCONF_GIT_COMMIT"]
    commit = _run(["git", "rev-parse", "HEAD"], cwd=repo)
    if not commit:
        return "n/a"
    dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo)
    return commit + ("+dirty" if dirty else "")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "n/a"


#: files of the CUDA JIT cache counted at most (a bound on the header's cost; ``files`` then reads ``">= N"``)
_JIT_CACHE_SCAN = 200_000


def cuda_jit_cache(environ: dict[str, str] | None = None) -> dict[str, Any]:
    """The CUDA driver's JIT cache as this process sees it: its folder (``$CUDA_CACHE_PATH``, else
    ``~/.nv/ComputeCache``), whether it is off (``$CUDA_CACHE_DISABLE=1``), ``$CUDA_CACHE_MAXSIZE`` when set, and
    the files and bytes in it now.  cuDNN's attention kernels (sdpa-cuda) are compiled through it: a run on a machine
    whose cache is empty spends about twice the kernel time of the next run (docs/concepts/performance.md), so a
    header that says how full the cache was explains a wall."""
    environ = dict(os.environ) if environ is None else environ
    folder = Path(environ.get("CUDA_CACHE_PATH") or Path.home() / ".nv" / "ComputeCache")
    info: dict[str, Any] = {"path": str(folder), "disabled": environ.get("CUDA_CACHE_DISABLE", "0") == "1"}
    if environ.get("CUDA_CACHE_MAXSIZE"):
        info["maxsize"] = environ["CUDA_CACHE_MAXSIZE"]
    files = size = 0
    try:
        for root, _dirs, names in os.walk(folder):
            for name in names:
                files += 1
                try:
                    size += os.lstat(os.path.join(root, name)).st_size
                except OSError:
                    pass
            if files >= _JIT_CACHE_SCAN:
                break
    except OSError:
        pass
    info["files"] = files if files < _JIT_CACHE_SCAN else f">= {_JIT_CACHE_SCAN}"
    info["bytes"] = size
    return info


def _gpu_env(device: str) -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"cuda": torch.version.cuda or "n/a", "cuda_available": torch.cuda.is_available()}
    if not device.startswith("cuda") or not torch.cuda.is_available():
        return info
    index = torch.device(device).index or 0
    props = torch.cuda.get_device_properties(index)
    info.update(
        gpu=props.name,
        gpu_count=torch.cuda.device_count(),
        gpu_memory_gib=round(props.total_memory / 2**30, 1),
        compute_capability=f"{props.major}.{props.minor}",
        cuda_jit_cache=cuda_jit_cache(),
    )
    smi = _run(["nvidia-smi", f"--id={index}", "--query-gpu=driver_version", "--format=csv,noheader"])
    if smi:
        info["driver"] = smi.splitlines()[0].strip()
    else:
        # The CUDA driver API version (e.g. 12040): coarser than the display driver, but always there.
        try:
            # CUDA builds only, and in no torch stub: a stub gap (the except covers a build without it)
            info["driver"] = f"cuda-driver-api {torch._C._cuda_getDriverVersion()}"  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001 - a private API; its absence only loses one fact
            info["driver"] = "n/a"
    return info


def host_env(device: str = "cpu") -> dict[str, Any]:
    """Machine, OS, Python, torch, CUDA and (for a CUDA device) the GPU, driver and compute capability."""
    import torch

    env: dict[str, Any] = {
        "host": socket.gethostname(),
        "os": platform.platform(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count() or 0,
        "usable_cpus": usable_cpus(),  # the run's CPU affinity (taskset, cpuset): what --jobs auto counted
        # where this process keeps compiled bytecode (conformance.running.worker_client.bytecode_cache)
        "python_bytecode": {"prefix": sys.pycache_prefix, "writes": not sys.dont_write_bytecode},
        "device": device,
        "git_commit": git_commit(),
    }
    env.update(_gpu_env(device))
    return env


def backend_info(backend: Any, spec: str | None = None) -> dict[str, str]:
    """One adapter as the header records it: describe() plus availability and refusals.

    ``spec`` is what the user typed (a registry name or ``module:Class``) when it differs from the
    adapter's own name, so a report can show how the backend was selected.
    """
    info = {str(k): str(v) for k, v in backend.describe().items()}
    try:
        avail = backend.is_available()
        info["available"] = "yes" if avail.ok else "no"
        if not avail.ok:
            info["unavailable_reason"] = avail.reason
    except Exception as exc:  # noqa: BLE001 - an adapter probe that raises is itself a finding
        info["available"] = "no"
        info["unavailable_reason"] = f"is_available() raised {type(exc).__name__}: {exc}"
    info["devices"] = ",".join(getattr(backend, "devices", ()))
    try:
        for feature, support in sorted(backend.capabilities().items()):
            if not support.ok:
                info[REFUSES_PREFIX + feature] = support.reason
    except Exception as exc:  # noqa: BLE001
        info["capabilities_error"] = f"{type(exc).__name__}: {exc}"
    if spec and spec != info.get("name"):
        info["spec"] = spec
    return info


def resolve_backend(spec: str) -> Any:
    """An adapter instance from a registry name or a ``module:Class`` import path.

    The import form lets a test or a vendor point the runner at any
    :class:`attnfast.base.Backend` subclass (or zero-argument factory) without registering it.
    """
    import importlib

    from attnfast.base import Backend
    from attnfast.registry import get_backend

    if ":" not in spec:
        return get_backend(spec)
    module_name, _, attr = spec.partition(":")
    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot import backend {spec!r}: {type(exc).__name__}: {exc}") from exc
    backend = obj()
    if not isinstance(backend, Backend):
        raise TypeError(f"{spec} must produce an attnfast.base.Backend, got {type(backend).__name__}")
    return backend
