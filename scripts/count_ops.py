"""How many torch ops and host waits a check costs, phase by phase (issue 30: with 15 workers on one GPU every op
launch and every host read of one worker waits behind the others, so their number matters more than CPU time).

Runs the worker's own ``check`` op (:class:`conformance.running.worker._Worker`) in this process over a sample of a
suite, in the runner's order (a case's backends one after the other: the case context is built once), under a
``TorchDispatchMode`` that counts every aten op by the phase that dispatched it:

    PYTHONPATH=. python scripts/count_ops.py --suite peer-fa2-kvcache --every 500 --backend sdpa-cpu --out ops
    PYTHONPATH=. python scripts/count_ops.py --suite peer-fa2-kvcache --every 500 --backend fa2 --device cuda

Phases (entered by wrapping the functions that do them, innermost wins): ``support`` (the worker's refusal check
before a context), ``inputs``, ``reference``, ``baseline`` (the case context; ``context`` for the rest of it, an
engine's or a composition's), ``guard`` (the context fingerprint and the kernel output's digest:
:mod:`conformance.verdict.fingerprint`), ``copies`` (the kernel's clones of the inputs), ``prepare`` (the adapter's
``prepare``), ``kernel`` (the prepared call: the backend's, not the harness's), ``compare``
(:func:`conformance.verdict.compare.compare_details` or ``compare_pending``), ``read`` (the one host read of the
comparison's statistics with the fingerprints, where the check makes one), ``record`` (the record's fields) and
``encode`` (its JSON); ``check`` is the rest of :func:`conformance.verdict.check.check_backend` (tolerance,
support, bookkeeping).

Counted per phase (``PhaseCounts``):

* ``ops``: every aten op dispatched; ``launches``: those that run a kernel on the device (not a view, an
  allocation or a scalar read, nor an op on host tensors alone: each is one launch queued behind the other
  processes on a GPU).  A tensor is on the host when a factory made it without a ``device`` (``torch.arange(n)``,
  ``torch.tensor(data)``) or an op made it from host tensors alone, until the case inputs' move to the device: so
  a CPU run counts what a GPU run would;
* ``reads``: host reads of a tensor's values (``.item()``, ``bool()``, ``int()``, ``float()``: aten
  ``_local_scalar_dense``; ``.tolist()``, ``.numpy()``, ``.cpu()``; ops whose output size depends on the data:
  ``nonzero``, ``masked_select``, ``unique``, ``repeat_interleave`` of a tensor of counts) of a device tensor,
  each a wait for the device there; reads of host tensors (and every read in ``inputs``, drawn on the host) count
  as ``host_reads``;
* ``h2d``: the waits of host-to-device copies: the case inputs' move to the device as a GPU run makes it (one per
  blocking copy, one for all the copies from pinned memory: ``conformance.cases.inputs.copies_async``), and
  ``torch.tensor(data, device=...)`` (a blocking copy from pageable memory);
* ``syncs``: explicit device synchronisations (:func:`conformance.verdict.check.sync`, which times the phases: a
  no-op on CPU, counted as a GPU run makes them);
* ``waits``: ``reads + h2d + syncs``, what a GPU worker waits for; on CUDA ``cuda_syncs`` adds what
  ``torch.cuda.set_sync_debug_mode`` reports (the truth there, against which the others are a model);
* ``ms``: CPU milliseconds spent in the phase (own time, nested phases excluded), from a separate pass without the
  counting mode (which slows every op).

Counts are deterministic (the same case, seed and code give the same numbers), times are not.  Writes ``OUT.json``
(per-check means and totals per phase and backend, and per case) and prints a table.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import time
import warnings
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

PHASES = (
    "support",
    "inputs",
    "reference",
    "baseline",
    "context",
    "check",
    "copies",
    "prepare",
    "kernel",
    "guard",
    "compare",
    "read",
    "record",
    "encode",
)
#: the phases that are the harness's (all but the kernel's own call and the adapter's preparation)
HARNESS = tuple(p for p in PHASES if p not in ("kernel", "prepare"))

#: aten ops that read values to the host (a device wait) or whose output size depends on the values
_READ_OPS = {
    "_local_scalar_dense",
    "nonzero",
    "masked_select",
    "_unique",
    "_unique2",
    "unique_dim",
    "unique_consecutive",
}
#: the factories whose tensors, made without a ``device``, are on the host on every run (their reads wait for
#: nothing; ops on host tensors alone launch nothing on a GPU)
_FACTORIES = ("arange", "zeros", "ones", "full", "empty", "randn", "rand", "randint", "randperm", "as_tensor")
#: aten ops that launch nothing: allocations and metadata
_NO_LAUNCH = {"empty", "empty_strided", "empty_like", "detach", "lift_fresh", "alias", "resize_", "set_"}


@dataclass
class PhaseCounts:
    ops: int = 0
    launches: int = 0
    reads: int = 0
    host_reads: int = 0
    h2d: int = 0
    syncs: int = 0
    cuda_syncs: int = 0
    ms: float = 0.0
    #: aten op name -> count
    by_op: Counter = field(default_factory=Counter)

    @property
    def waits(self) -> int:
        return self.reads + self.h2d + self.syncs

    def add(self, other: PhaseCounts) -> None:
        for k in ("ops", "launches", "reads", "host_reads", "h2d", "syncs", "cuda_syncs"):
            setattr(self, k, getattr(self, k) + getattr(other, k))
        self.ms += other.ms
        self.by_op.update(other.by_op)


class Tally:
    """Counts by phase; :meth:`phase` enters one (a stack: the innermost phase gets the counts)."""

    def __init__(self) -> None:
        self.stack: list[str] = ["check"]
        self.counts: dict[str, PhaseCounts] = defaultdict(PhaseCounts)
        self._t = time.perf_counter()

    @property
    def current(self) -> PhaseCounts:
        return self.counts[self.stack[-1]]

    def _switch(self) -> None:
        now = time.perf_counter()
        self.current.ms += (now - self._t) * 1e3
        self._t = now

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self._switch()
        self.stack.append(name)
        try:
            yield
        finally:
            self._switch()
            self.stack.pop()

    def read(self, host: bool = False) -> None:
        if host or self.stack[-1] == "inputs":
            self.current.host_reads += 1
        else:
            self.current.reads += 1

    def take(self) -> dict[str, PhaseCounts]:
        self._switch()
        out, self.counts = dict(self.counts), defaultdict(PhaseCounts)
        return out


class _Counting(TorchDispatchMode):
    def __init__(self, tally: Tally) -> None:
        super().__init__()
        self.tally = tally

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        c = self.tally.current
        c.ops += 1
        c.by_op[name] += 1
        inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        # the case inputs are drawn on the host by design (conformance.cases.inputs), then moved
        host = self.tally.stack[-1] == "inputs" or (bool(inputs) and all(_is_host(t) for t in inputs))
        if name in _READ_OPS or (name == "repeat_interleave" and isinstance(args[0], torch.Tensor) and not kwargs):
            self.tally.read(host)
        elif not func.is_view and name not in _NO_LAUNCH and not host:
            c.launches += 1
        out = func(*args, **(kwargs or {}))
        if host:
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    _mark_host(t)
        return out


def _is_host(t: torch.Tensor) -> bool:
    return bool(getattr(t, "_count_ops_host", False))


def _mark_host(t: torch.Tensor, host: bool = True) -> None:
    try:
        t._count_ops_host = host  # type: ignore[attr-defined]
    except (AttributeError, RuntimeError):
        pass


class _Delegate:
    """A prepared kernel call run in the ``kernel`` phase; every other attribute is the wrapped callable's (the
    verdict reads ``notes``, ``variant``, ``extra``, ``problems`` from it)."""

    def __init__(self, fn: Callable[[], Any], tally: Tally) -> None:
        self._fn, self._tally = fn, tally

    def __call__(self) -> Any:
        with self._tally.phase("kernel"):
            return self._fn()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fn, name)


@contextlib.contextmanager
def instrumented(tally: Tally) -> Iterator[None]:
    """Wrap the harness's functions so that each runs in its phase, and the host reads and copies that do not go
    through the dispatcher on a CPU tensor (``tolist``, ``numpy``, ``cpu``, ``torch.tensor(..., device=...)``,
    the inputs' move to the device) are counted."""
    import conformance.cases.inputs as inputs_mod
    import conformance.running.worker  # noqa: F401 - the worker's imports first
    import conformance.verdict.check as check_mod
    from conformance.records import CheckResult

    saved: list[tuple[Any, str, Any]] = []

    def patch(owner: Any, attr: str, new: Any) -> None:
        saved.append((owner, attr, getattr(owner, attr)))
        setattr(owner, attr, new)

    def in_phase(owner: Any, attr: str, name: str) -> None:
        fn = getattr(owner, attr)

        @functools.wraps(fn)
        def wrapped(*a, **k):
            with tally.phase(name):
                return fn(*a, **k)

        patch(owner, attr, wrapped)

    for attr, name in (  # the names of today's check_backend and of its earlier versions (to measure both)
        ("refusal", "support"),
        ("prepare_context", "context"),
        ("make_inputs", "inputs"),
        ("reference", "reference"),
        ("baseline", "baseline"),
        ("_fresh_inputs", "copies"),
        ("_first_read", "guard"),
        ("context_fingerprint", "guard"),
        ("fingerprints", "guard"),
        ("fingerprints_pending", "guard"),
        ("compare_details", "compare"),
        ("compare_pending", "compare"),
        ("read_host", "read"),
        ("_result", "record"),
    ):
        if hasattr(check_mod, attr):
            in_phase(check_mod, attr, name)
    in_phase(CheckResult, "to_json", "encode")
    sync = check_mod.sync

    def counted_sync(device: str) -> None:
        tally.current.syncs += 1  # a wait on a GPU (a no-op on the CPU), counted as a GPU run makes it
        sync(device)

    patch(check_mod, "sync", counted_sync)
    to = inputs_mod._to

    copies_async = getattr(inputs_mod, "copies_async", None)  # (a tree before it copied every tensor blocking)

    def counted_to(inputs, device):
        # what the move costs on a GPU, whatever the device here: a wait per blocking copy, one for the async ones
        holders = (inputs, inputs.quant) if inputs.quant is not None else (inputs,)
        tensors = [v for holder in holders for v in vars(holder).values() if isinstance(v, torch.Tensor)]
        async_ = sum(1 for v in tensors if copies_async is not None and copies_async(v))
        tally.current.h2d += len(tensors) - async_ + (1 if async_ else 0)
        moved = to(inputs, device)
        for holder in (moved, moved.quant) if moved.quant is not None else (moved,):
            for v in vars(holder).values():
                if isinstance(v, torch.Tensor):
                    _mark_host(v, False)  # on the device now (a CPU run's move returns the same tensor)
        return moved

    patch(inputs_mod, "_to", counted_to)
    for meth in ("tolist", "numpy", "cpu"):
        original = getattr(torch.Tensor, meth)

        def reading(self, *a, _original=original, **k):
            tally.read(_is_host(self))
            return _original(self, *a, **k)

        patch(torch.Tensor, meth, reading)
    tensor = torch.tensor

    def counted_tensor(data, *a, **k):
        if k.get("device") is not None and tally.stack[-1] != "inputs":
            tally.current.h2d += 1
        out = tensor(data, *a, **k)
        _mark_host(out, k.get("device") is None)
        return out

    patch(torch, "tensor", counted_tensor)
    for factory in _FACTORIES:  # made without a device: on the host, wherever the run's device is
        original = getattr(torch, factory)

        def made(*a, _original=original, **k):
            out = _original(*a, **k)
            if k.get("device") is None and isinstance(out, torch.Tensor):
                _mark_host(out)
            return out

        patch(torch, factory, made)
    try:
        yield
    finally:
        for owner, attr, value in reversed(saved):
            setattr(owner, attr, value)


def _wrap_prepare(worker: Any, spec: str, tally: Tally) -> None:
    """Run the backend's ``prepare`` in the ``prepare`` phase and its prepared call in ``kernel`` (of ``tally``)."""
    backend = worker.backend(spec)
    prepare = backend.__dict__.get("_count_ops_prepare", backend.prepare)

    def wrapped(case, inputs):
        with tally.phase("prepare"):
            fn = prepare(case, inputs)
        return _Delegate(fn, tally)

    backend._count_ops_prepare = prepare
    backend.prepare = wrapped


def count_checks(
    cases: list[Any], backends: list[str], device: str = "cpu", *, count: bool = True, worker: Any = None
) -> list[dict[str, Any]]:
    """One row per (case, backend) check: ``{"case", "backend", "status", "phases": {phase: PhaseCounts}}``, in the
    runner's order.  ``count=False`` times the phases only (no dispatch mode)."""
    from conformance.running.worker import _Worker

    worker = worker if worker is not None else _Worker()
    tally = Tally()
    rows = []
    sync_mode = device.startswith("cuda") and count
    with instrumented(tally), warnings.catch_warnings():
        if sync_mode:
            warnings.simplefilter("always")
            shown = warnings.showwarning

            def hook(message, category, filename, lineno, file=None, line=None):
                if "synchroniz" in str(message):
                    tally.current.cuda_syncs += 1
                else:
                    shown(message, category, filename, lineno, file, line)

            warnings.showwarning = hook
            torch.cuda.set_sync_debug_mode("warn")
        try:
            for case in cases:
                case_json = case.to_json()
                for spec in backends:
                    _wrap_prepare(worker, spec, tally)
                    tally.take()
                    req = {"case": case_json, "backend": spec, "device": device, "seed": 0, "available": True}
                    with _Counting(tally) if count else contextlib.nullcontext():
                        reply = worker.check(req)
                    if not reply.get("ok"):
                        raise RuntimeError(f"{case.id} on {spec}: {reply.get('error')}")
                    rows.append(
                        {
                            "case": case.id,
                            "backend": spec,
                            "status": reply["result"]["status"],
                            "phases": tally.take(),
                        }
                    )
        finally:
            if sync_mode:
                torch.cuda.set_sync_debug_mode("default")
    return rows


def summarize(rows: list[dict[str, Any]]) -> dict[str, dict[str, PhaseCounts]]:
    """Per backend, the phases' counts summed over its rows (``"harness"`` and ``"total"`` added)."""
    out: dict[str, dict[str, PhaseCounts]] = defaultdict(lambda: defaultdict(PhaseCounts))
    for row in rows:
        for phase, c in row["phases"].items():
            out[row["backend"]][phase].add(c)
            out[row["backend"]]["total"].add(c)
            if phase in HARNESS:
                out[row["backend"]]["harness"].add(c)
    return out


def table(summary: dict[str, dict[str, PhaseCounts]], checks: Counter) -> str:
    """Markdown: per backend and phase, the means per check."""
    lines = []
    for spec, phases in summary.items():
        n = checks[spec]
        lines.append(f"\n{spec}: {n} checks, means per check\n")
        lines.append("| phase | ops | launches | host reads (device) | h2d | syncs | waits | cuda syncs | CPU ms |")
        lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for phase in (*PHASES, "harness", "total"):
            if phase not in phases:
                continue
            c = phases[phase]
            lines.append(
                f"| {phase} | {c.ops / n:.1f} | {c.launches / n:.1f} | {c.reads / n:.2f} | {c.h2d / n:.2f} | "
                f"{c.syncs / n:.2f} | {c.waits / n:.2f} | {c.cuda_syncs / n:.2f} | {c.ms / n:.2f} |"
            )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--suite", default="default")
    p.add_argument("--every", type=int, default=100, help="every Nth case of the suite")
    p.add_argument("--offset", type=int, default=0)
    p.add_argument("--case", action="append", default=[], help="a case id glob (instead of --every)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--backend", action="append", default=[])
    p.add_argument("--out", default=None, help="write OUT.json")
    p.add_argument("--ops", type=int, default=0, help="print the N most dispatched aten ops per phase")
    args = p.parse_args()
    import fnmatch

    from conformance.suites.registry import get_suite

    cases = get_suite(args.suite)
    if args.case:
        cases = [c for c in cases if any(fnmatch.fnmatchcase(c.id, g) for g in args.case)]
    else:
        cases = cases[args.offset :: args.every]
    backends = args.backend or ["sdpa-cpu"]
    from conformance.running.worker import _Worker

    worker = _Worker()
    # warm-up (imports, first calls): the first case at another seed, uncounted
    warm = count_checks(cases[:1], backends, args.device, count=False, worker=worker)
    worker.ctx, worker.ctx_key = None, None
    del warm
    timed = count_checks(cases, backends, args.device, count=False, worker=worker)
    worker.ctx, worker.ctx_key = None, None
    counted = count_checks(cases, backends, args.device, count=True, worker=worker)
    for t, c in zip(timed, counted):  # times from the uncounted pass
        for phase, pc in c["phases"].items():
            pc.ms = t["phases"].get(phase, PhaseCounts()).ms
    checks = Counter(r["backend"] for r in counted)
    summary = summarize(counted)
    print(f"{args.suite}: {len(cases)} cases, device {args.device}")
    print(table(summary, checks))
    if args.ops:
        for spec, phases in summary.items():
            for phase in PHASES:
                if phase in phases:
                    top = ", ".join(f"{k} {v / checks[spec]:.1f}" for k, v in phases[phase].by_op.most_common(args.ops))
                    print(f"{spec} {phase}: {top}")
    if args.out:

        def js(c: PhaseCounts) -> dict[str, Any]:
            d = asdict(c)
            d["waits"] = c.waits
            d["by_op"] = dict(c.by_op)
            return d

        data = {
            "suite": args.suite,
            "device": args.device,
            "cases": len(cases),
            "checks": dict(checks),
            "summary": {s: {p: js(c) for p, c in ph.items()} for s, ph in summary.items()},
            "rows": [{**r, "phases": {p: js(c) for p, c in r["phases"].items()}} for r in counted],
        }
        with open(args.out + ".json", "w") as f:
            json.dump(data, f, indent=1)


if __name__ == "__main__":
    main()
