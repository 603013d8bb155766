"""attnfast: one adapter per attention-kernel family, each declaring what it supports.

See :mod:`attnfast.base` for the protocol and :mod:`attnfast.registry` for discovery.
"""

from .base import OK, Backend, KernelOutput, Support
from .registry import available_names, get_backend

__all__ = ["OK", "Backend", "KernelOutput", "Support", "available_names", "get_backend"]
