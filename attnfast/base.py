"""The adapter protocol every kernel family implements (one file per family in this package).

An adapter translates an :class:`~conformance.cases.case.AttentionCase` and its
:class:`~conformance.cases.inputs.CaseInputs` into the kernel's own call, and the kernel's outputs back
into the reference's conventions:

* ``out``: varlen layout ``(total_q, h, dv)`` (any float dtype);
* ``lse``: ``(h, total_q)`` float32, natural log, ``-inf`` for a fully masked row (or the sink's
  value with sinks), ALiBi in the symmetric form; ``None`` when the kernel cannot return it;
* ``lse_slack``: ``None``, or ``(h, total_q)`` finite and ``>= 0``: per row, LSE error the kernel's own LSE
  convention cannot avoid and the adapter's conversion cannot undo, which the verdict adds to that row's LSE bound
  (FA2's causal ALiBi: :func:`attnfast._fa_common.alibi_causal_lse_slack`).  Declared only with a derivation from
  the kernel's arithmetic; a composition that builds its own output from several calls leaves it out (stricter).

Features listed in :data:`~conformance.cases.case.OPT_IN_FEATURES` (quantization, MLA ``qv``,
V padding, FA3 scheduler metadata) are refused unless the adapter names them in ``accepts``: an
adapter written before they existed must not be fed tensors it does not know how to read
(``CaseInputs.quant``, ``CaseInputs.qv``).

``supports(case, device)`` answers before anything runs; a refusal carries the reason and the
runner records it as ``unsupported`` (never a silent skip).  Its first step, the declarations (``devices``,
``refused``, ``accepts``), is :func:`declared_support`, the one rule that also reads a backend's describe-info
(:func:`declared_support_of_info`: the header's backend entry, which the fuzzer reads in the parent process
without importing a kernel).  ``prepare`` does all the per-case
work that is not the kernel (layout conversions, metadata) and returns a zero-argument callable
that runs only the kernel, so timing measures the kernel alone.  The callable must be idempotent:
calling it twice gives the same result (a kvcache append rewrites the same slots).  It may carry a
``notes`` attribute (strings): translation facts a reader of the record needs, such as a dtype the
adapter converted an argument to; the check copies them into the record's ``extra["notes"]``.

``prepare_graph(case, inputs)`` (adapters declaring the opt-in ``graph``): the call CUDA-graph mode captures
once and replays for every batch of a bucket, reading the batch from the bucket's static buffers.

``prepare_backward(case, inputs)`` (adapters declaring the opt-in ``backward``): the forward and backward of a
training call, returning the gradients (:class:`GradOutput`).

``compile_key(case)`` (optional) names the kernel a JIT backend compiles for the case (FA4: one per
dtype, head dims, mask kind, paged loader, ...), so a parallel run keeps cases of one kernel on one
worker instead of compiling it in each.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch

from conformance.cases.case import FEATURES, OPT_IN_FEATURES, AttentionCase
from conformance.cases.inputs import CaseInputs

__all__ = [
    "Support",
    "KernelOutput",
    "GradOutput",
    "BackwardCall",
    "Backend",
    "OK",
    "NOT_DECLARED",
    "REFUSES_PREFIX",
    "declared_support",
    "declared_support_of_info",
    "info_devices",
    "refuse_features",
    "refused_features",
    "runs_on",
]


@dataclass(frozen=True)
class Support:
    """Whether something is supported, and why not."""

    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


OK = Support(True)

#: Reason given for an opt-in feature the adapter does not list in ``accepts``.
NOT_DECLARED = "not declared by this adapter (an opt-in feature: list it in Backend.accepts to receive it)"


@dataclass(frozen=True)
class KernelOutput:
    """What a forward call returns (conventions in the module docstring)."""

    out: torch.Tensor
    lse: torch.Tensor | None = None
    lse_slack: torch.Tensor | None = None


@dataclass(frozen=True)
class GradOutput:
    """What a backward call returns: the forward's ``out``/``lse`` (as :class:`KernelOutput`) and the gradients of
    ``sum(out * dout)`` in the inputs' varlen layouts: ``dq (total_q, h, d)``, ``dk (total_k, hk, d)``,
    ``dv (total_k, hk, dv)`` (any float dtype), ``dsinks (h,)`` when the case has sinks and the kernel learns them
    (None otherwise), and the forward's ``lse_slack`` (as :class:`KernelOutput`'s)."""

    out: torch.Tensor
    lse: torch.Tensor | None
    dq: torch.Tensor
    dk: torch.Tensor
    dv: torch.Tensor
    dsinks: torch.Tensor | None = None
    lse_slack: torch.Tensor | None = None


class BackwardCall(Protocol):
    """The callable :meth:`Backend.prepare_backward` returns.

    Calling it runs the forward and the backward kernels and returns a :class:`GradOutput`; ``backward_only``
    (None when the kernel cannot rerun its backward alone) reruns only the backward of the last forward, with the
    same ``dout``, for timing.  Like ``prepare``'s callable it is idempotent and may carry ``notes`` and ``variant``
    (the kernel variant of its forward and backward, read after the call into the backward record's
    ``extra["variant"]``; a GPU adapter names it: the entry point and ``deterministic``, SDPA the backend torch
    picks for the call with gradients on)."""

    @property
    def backward_only(self) -> Callable[[], GradOutput] | None: ...

    def __call__(self) -> GradOutput: ...


def refuse_features(case: AttentionCase, refused: Mapping[str, str]) -> Support:
    """First refused feature of the case, with its reason; OK when none is refused."""
    for name in sorted(case.features()):
        if name in refused:
            return Support(False, f"{name}: {refused[name]}")
    return OK


def runs_on(devices: Sequence[str] | None, device: str) -> Support:
    """Whether the device type of ``device`` (``cuda:1`` is ``cuda``) is among the declared ``devices`` (None: no
    declaration, nothing to check): the first step of :func:`declared_support`."""
    if devices is not None and device.split(":")[0] not in devices:
        return Support(False, f"runs on {'/'.join(devices)}, not {device}")
    return OK


def declared_support(
    case: AttentionCase, device: str, devices: Sequence[str] | None, refused: Mapping[str, str]
) -> Support:
    """Whether a backend's declarations let it run ``case`` on ``device``, before any shape limit: the device type
    (``cuda:1`` is ``cuda``) among ``devices`` (None: no device declaration to check), then the case's features
    against ``refused`` (``feature -> reason``, the opt-in features not accepted included: :meth:`Backend.refusals`).
    A V-padded case is first refused for ``v_pad`` itself, then judged as the padded, equal-dims call the kernel
    sees.  The one rule :meth:`Backend.supports` and :func:`declared_support_of_info` apply."""
    where = runs_on(devices, device)
    if not where:
        return where
    if case.v_padded:  # the kernel sees the padded, equal-dims call
        if "v_pad" in refused:
            return Support(False, f"v_pad: {refused['v_pad']}")
        case = case.padded_v_call()
    return refuse_features(case, refused)


#: Key prefix of a declared refusal in a backend's describe-info (the header's backend entry,
#: ``conformance.running.env.backend_info``): ``"refuses.<feature>": reason``.  Kept flat so that the entry stays
#: the ``dict[str, str]`` that :class:`conformance.records.Header` declares.
REFUSES_PREFIX = "refuses."


def refused_features(info: Mapping[str, str]) -> dict[str, str]:
    """The ``feature -> reason`` refusals recorded in one describe-info (header backend entry)."""
    return {k[len(REFUSES_PREFIX) :]: v for k, v in info.items() if k.startswith(REFUSES_PREFIX)}


def info_devices(info: Mapping[str, str]) -> tuple[str, ...] | None:
    """The device types a describe-info records (``"devices": "cpu,cuda"``); None when it records none (no
    ``devices`` entry, or an empty one), which :func:`declared_support` does not check."""
    devices = tuple(d for d in info.get("devices", "").split(",") if d)
    return devices or None


def declared_support_of_info(case: AttentionCase, info: Mapping[str, str], device: str) -> Support:
    """:func:`declared_support` read from a backend's describe-info (its recorded ``devices`` and ``refuses.*``)
    instead of the adapter: what the backend's :meth:`Backend.supports` answers before its shape limits, known
    without importing the adapter."""
    return declared_support(case, device, info_devices(info), refused_features(info))


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
    #: opt-in features (``OPT_IN_FEATURES``) this backend handles; every other opt-in feature is refused.
    accepts: ClassVar[frozenset[str]] = frozenset()
    #: the kernel argument through which the kernel promises batch invariance: ``"num_splits"`` when its call
    #: passes the case's split count (pinned to 1, a request's output does not depend on the rest of its batch:
    #: vLLM's batch-invariant mode, SGLang's deterministic inference); None when the kernel takes no such
    #: argument, so the batch variance it shows is reported, not failed (:meth:`pins_splits`).
    batch_invariance_via: ClassVar[str | None] = None

    def refusals(self) -> dict[str, str]:
        """``refused`` plus every opt-in feature not in ``accepts`` (with :data:`NOT_DECLARED`)."""
        out = {f: NOT_DECLARED for f in OPT_IN_FEATURES - self.accepts}
        out.update(self.refused)
        return out

    def version(self) -> str:
        """Version of the kernel package (``importlib.metadata``), or ``"n/a"``."""
        return "n/a"

    def is_available(self) -> Support:
        """Whether the kernel can run here at all (package importable, device present)."""
        return OK

    def capabilities(self) -> dict[str, Support]:
        """Declared support of every feature (for the capability matrix)."""
        refused = self.refusals()
        return {f: Support(False, refused[f]) if f in refused else OK for f in FEATURES}

    def supports(self, case: AttentionCase, device: str) -> Support:
        """Whether this case runs here; override to add shape limits (call ``super()`` first).  The declarations:
        :func:`declared_support` of ``devices`` and :meth:`refusals`."""
        return declared_support(case, device, self.devices, self.refusals())

    def pins_splits(self, case: AttentionCase) -> bool:
        """Whether the kernel call of ``case`` passes the case's ``num_splits`` (the argument
        :attr:`batch_invariance_via` declares), so the split count is the case's and not the kernel's heuristic:
        declared and ``num_splits`` set.  What the invariance and graph verdicts read to decide what the kernel
        promised (:mod:`conformance.graphs.invariance`); an adapter whose entry points do not all take the argument
        narrows it to those that do (FA2)."""
        return self.batch_invariance_via == "num_splits" and case.num_splits is not None

    @abc.abstractmethod
    def prepare(self, case: AttentionCase, inputs: CaseInputs) -> Callable[[], KernelOutput]:
        """Translate the case; return a callable running only the kernel.

        The callable may carry ``variant``, a dict of JSON scalars naming the kernel variant that ran (the entry
        point, the arguments that select a variant, what the kernel's own dispatcher picked: SDPA's backend,
        FA4's compile key and tile, the split counts FA2, FA3 and FlashMLA decide, :mod:`attnfast.decisions`); the
        verdict reads it once after the call (outside the timed region: reading it may read the device) into the
        record's ``extra["variant"]``, which the report groups by and ``attnconf compare`` diffs."""

    def prepare_graph(self, case: AttentionCase, inputs: CaseInputs) -> Callable[[], KernelOutput]:
        """The graph-safe call of CUDA-graph mode (the opt-in feature ``graph``; :mod:`conformance.graphs`).

        ``case`` is the call the graph captures: every request at the bucket's capacity (what an engine passes as
        ``max_seqlen_k`` at capture); ``inputs`` holds the bucket's static buffers, which the harness refills in
        place before every replay: the live key counts in ``inputs.seqlens_k`` (int32 ``(batch,)``, padded
        requests at the engine's fill value) and ``inputs.cu_seqlens_k``, the block table, the caches, ``q``.
        The callable must read the batch from those tensors only (a length copied to the host or into a new
        tensor here would be frozen into the graph) and return a ``KernelOutput``; it may have a ``refresh()``
        method, which the harness calls before every replay outside the graph (host-side metadata such as FA3's
        scheduler metadata, written into a buffer the call reads).  Adapters that declare ``graph`` in
        ``accepts`` override this."""
        raise NotImplementedError(f"{self.name} has no graph mode (it does not declare 'graph')")

    def prepare_backward(self, case: AttentionCase, inputs: CaseInputs) -> BackwardCall:
        """The training call of a backward case (the opt-in feature ``backward``; :mod:`conformance.backward`).

        ``inputs`` holds q, k, v (varlen, contiguous keys) and the upstream gradient ``inputs.dout``; the callable
        runs the kernel's forward then its backward for ``sum(out * dout)`` and returns a :class:`GradOutput`
        (see :class:`BackwardCall`).  With ``case.deterministic`` (the opt-in ``bwd_deterministic``) it passes the
        kernel's deterministic option.  Adapters that declare ``backward`` in ``accepts`` override this."""
        raise NotImplementedError(f"{self.name} has no backward (it does not declare 'backward')")

    def alibi_bias_dtype(self, case: AttentionCase) -> torch.dtype | None:
        """The dtype the adapter hands ``case``'s ALiBi to the kernel in, as an additive bias each row of which is
        shifted by its largest entry (``attnfast.sdpa.bias_for_kernel``), or None: the kernel forms ALiBi itself
        from the fp32 slopes (the default).  The backward verdict's baseline rounds ALiBi the same way
        (:mod:`conformance.backward.gradients`): a rounding of the kernel's input, not of its arithmetic."""
        return None

    def compile_key(self, case: AttentionCase) -> Hashable | None:
        """What the kernel JIT-compiles once per process for ``case``: cases with equal keys run one compiled
        kernel, so the runner sends them to one worker (compile affinity, ``conformance/running/pool.py``).
        None (the default): the backend does not JIT per case.  Must be cheap, deterministic across
        processes (its ``repr`` is compared), computed from the case alone, and import no kernel."""
        return None

    def describe(self) -> dict[str, str]:
        return {"name": self.name, "family": self.family, "version": self.version(), "description": self.description}


def package_version(*dists: str, module: str | None = None) -> str:
    """Version of the first installed distribution among ``dists``; else ``module.__version__`` (a package
    unpacked without its metadata, such as the GPU kit's vLLM kernels); else ``"not installed"``."""
    from importlib import metadata

    for dist in dists:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    if module is not None:
        try:
            import importlib

            return str(importlib.import_module(module).__version__)
        except Exception:  # not importable, or no __version__
            pass
    return "not installed"
