"""The adapter protocol every kernel family implements (one file per family in this package).

An adapter translates an :class:`~conformance.cases.case.AttentionCase` and its
:class:`~conformance.cases.inputs.CaseInputs` into the kernel's own call, and the kernel's outputs back
into the reference's conventions:

* ``out``: varlen layout ``(total_q, h, dv)`` (any float dtype);
* ``lse``: ``(h, total_q)`` float32, natural log, ``-inf`` for a fully masked row (or the sink's
  value with sinks), ALiBi in the symmetric form; ``None`` when the kernel cannot return it.

``supports(case, device)`` answers before anything runs; a refusal carries the reason and the
runner records it as ``unsupported`` (never a silent skip).  ``prepare`` does all the per-case
work that is not the kernel (layout conversions, metadata) and returns a zero-argument callable
that runs only the kernel, so timing measures the kernel alone.  The callable must be idempotent:
calling it twice gives the same result (a kvcache append rewrites the same slots).
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch

from conformance.cases.case import FEATURES, AttentionCase
from conformance.cases.inputs import CaseInputs

__all__ = ["Support", "KernelOutput", "Backend", "OK", "refuse_features"]


@dataclass(frozen=True)
class Support:
    """Whether something is supported, and why not."""

    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


OK = Support(True)


@dataclass(frozen=True)
class KernelOutput:
    out: torch.Tensor
    lse: torch.Tensor | None = None


def refuse_features(case: AttentionCase, refused: dict[str, str]) -> Support:
    """First refused feature of the case, with its reason; OK when none is refused."""
    for name in sorted(case.features()):
        if name in refused:
            return Support(False, f"{name}: {refused[name]}")
    return OK


class Backend(abc.ABC):
    """Base class of an adapter.  Subclasses set the class attributes and the abstract methods."""

    #: registry name, e.g. ``"fa2"``; unique.
    name: ClassVar[str]
    #: family used to join records across versions in ``attnconf compare``, e.g. ``"flash-attn-2"``.
    family: ClassVar[str]
    #: device types the backend runs on.
    devices: ClassVar[tuple[str, ...]] = ("cuda",)
    #: one line for ``attnconf backends``.
    description: ClassVar[str] = ""
    #: features this backend cannot express, with the reason (the capability matrix).
    refused: ClassVar[dict[str, str]] = {}

    def version(self) -> str:
        """Version of the kernel package (``importlib.metadata``), or ``"n/a"``."""
        return "n/a"

    def is_available(self) -> Support:
        """Whether the kernel can run here at all (package importable, device present)."""
        return OK

    def capabilities(self) -> dict[str, Support]:
        """Declared support of every feature (for the capability matrix)."""
        return {f: Support(False, self.refused[f]) if f in self.refused else OK for f in FEATURES}

    def supports(self, case: AttentionCase, device: str) -> Support:
        """Whether this case runs here; override to add shape limits (call ``super()`` first)."""
        if device.split(":")[0] not in self.devices:
            return Support(False, f"runs on {'/'.join(self.devices)}, not {device}")
        return refuse_features(case, self.refused)

    @abc.abstractmethod
    def prepare(self, case: AttentionCase, inputs: CaseInputs) -> Callable[[], KernelOutput]:
        """Translate the case; return a callable running only the kernel."""

    def describe(self) -> dict[str, str]:
        return {"name": self.name, "family": self.family, "version": self.version(), "description": self.description}


def package_version(*dists: str) -> str:
    """Version of the first installed distribution among ``dists``, else ``"not installed"``."""
    from importlib import metadata

    for dist in dists:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "not installed"
