"""The worker process that runs kernels on behalf of :mod:`conformance.running.runner`.

Run as ``python -m conformance.running.worker``; it talks JSON lines: requests on stdin, replies on the *protocol
channel*, which is the process's original stdout.  Before anything else is imported, that stdout is duplicated to a
private file descriptor and fd 1 is pointed at stderr, so a stray ``print`` (or a C++ ``printf`` in a kernel) can
never corrupt the protocol.

A kernel that kills (segfault, ``abort``, CUDA illegal memory access) or hangs the worker leaves the parent to
record ``crash`` or ``timeout`` and start a fresh worker.  The worker persists across cases and keeps the last
case's context (inputs, reference, baseline) so several backends of one case share one reference computation.  It
runs in a session of its own and ignores SIGINT: Ctrl-C is the parent's to handle
(:mod:`conformance.running.runner`), which stops its workers itself.

Requests and replies (one JSON object per line):

* on start the worker sends ``{"op": "ready", "pid": ...}``;
* ``{"op": "describe", "backends": [spec...], "device": d}`` ->
  ``{"ok": true, "env": {...}, "backends": {spec: info}, "errors": {spec: message}, "jit": [spec...]}``
  (``jit``: the backends with a :meth:`~attnfast.base.Backend.compile_key`);
* ``{"op": "keys", "backends": [spec...], "cases": [{...}...], "device": d}`` ->
  ``{"ok": true, "keys": [[key or null per backend] per case]}``: each compile key's ``repr``, or null;
* ``{"op": "load", "backends": [spec...]}`` -> ``{"ok": true, "errors": {...}}``: import the
  adapters now, so a fresh worker's imports do not count against the first case's timeout;
* ``{"op": "check", "case": {...}, "backend": spec, "seed": n, "device": d, "available": bool, "tol": [...],
  "tol_file": path|null, "time": bool}`` -> ``{"ok": true, "result": CheckResult JSON}``, or
  ``{"ok": false, "error": text}`` when the harness itself (inputs, reference) failed;
* ``{"op": "compile", "case": {...}, "backend": spec, "seed": n, "device": d}`` -> ``{"ok": true,
  "compiled": bool, "key": repr|null, "inputs_s": s, "compile_s": s, "error": text|null}``: build the case's
  inputs and call the backend's kernel once, unjudged, so a JIT backend compiles (and, with FA4's disk cache,
  stores) the kernel of the case's compile key; a refusal or an exception is ``compiled: false`` with the
  reason in ``error``, never a failed reply.

Every reply also carries ``worker_s`` (the worker's own time on the request) and ``idle_s`` (its wait for it); a
check's reply adds ``phases`` (each listed in ``docs/concepts/running.md``, *The worker's reply timings*).  Replies
come in request order, so the parent may send the next request before the previous reply arrives.

Backends are named by registry name or ``module:Class`` (:func:`conformance.running.env.resolve_backend`).
This module is the worker's side (:func:`main`, the handlers); the parent's side is
:class:`~conformance.running.worker_client.WorkerClient` (with :class:`Reply`, :class:`WorkerStartError`: re-exported).
"""

from __future__ import annotations

import functools
import json
import os
import signal
import sys
import threading
import time
import traceback
from typing import IO, Any

from conformance.running.worker_client import Reply, WorkerClient, WorkerStartError

__all__ = ["Reply", "WorkerClient", "WorkerStartError", "load_overrides", "main"]


def load_overrides(texts: list[str], tol_file: str | None) -> tuple[Any, ...]:
    """Tolerance overrides: the ``--tol-file`` layer first, then each ``--tol KEY=VALUE`` on top."""
    from conformance.verdict import tolerance

    layers: list[Any] = list(tolerance.load_toml(tol_file)) if tol_file else []
    layers.extend(tolerance.parse_override(t) for t in texts)
    return tuple(layers)


class _Worker:
    """Per-process state: resolved backends, the last case context, the timer."""

    def __init__(self) -> None:
        self.backends: dict[str, Any] = {}
        self.ctx_key: str | None = None
        self.ctx: Any = None
        self.timers: dict[str, Any] = {}
        self.overrides: dict[str, tuple[Any, ...]] = {}
        #: (spec, repr of a compile key) whose kernel this process has called: the next call is no compile
        self.compiled: set[tuple[str, str]] = set()
        #: bytes of CUDA allocator cache this worker may keep between cases (its share of the GPU), once known
        self.cuda_cap: int | None = None

    def trim_cuda_cache(self, device: str) -> bool:
        """Between two cases: give the allocator's unused cached blocks back to the GPU when this worker holds more
        than its share of the GPU's memory (90 % of it over the workers sharing the GPU, ``ATTNCONF_GPU_SHARING``);
        True when it did.  The previous case's tensors must be released first."""
        if not device.startswith("cuda"):
            return False
        import torch

        if self.cuda_cap is None:
            from conformance.running.pool import GPU_SHARING_ENV

            try:
                sharing = max(1, int(os.environ.get(GPU_SHARING_ENV, "1")))
            except ValueError:
                sharing = 1
            total = torch.cuda.get_device_properties(torch.device(device)).total_memory
            self.cuda_cap = int(total * 0.9 / sharing)
        if torch.cuda.memory_reserved(torch.device(device)) <= self.cuda_cap:
            return False
        torch.cuda.empty_cache()
        return True

    def compile_key(self, spec: str, case: Any) -> str | None:
        """``repr`` of the backend's compile key for ``case``; None when it has none (or computing it fails)."""
        from attnfast.base import Backend

        backend = self.backend(spec)
        if type(backend).compile_key is Backend.compile_key:
            return None
        try:
            key = backend.compile_key(case)
        except Exception:  # noqa: BLE001 - accounting only: the check reports what the backend does
            return None
        return None if key is None else repr(key)

    def backend(self, spec: str) -> Any:
        if spec not in self.backends:
            from conformance.running.env import resolve_backend

            backend = resolve_backend(spec)
            # check_backend asks every record for the package version; importlib.metadata scans every
            # installed distribution per call (3 ms with 119 of them, 94 ms for a name that is missing and
            # falls back to importing the module, as vLLM's kernels unpacked without metadata do).  The
            # package cannot change under a running worker, so it is asked once.
            backend.version = functools.lru_cache(maxsize=1)(backend.version)
            self.backends[spec] = backend
        return self.backends[spec]

    def describe(self, req: dict[str, Any]) -> dict[str, Any]:
        from conformance.running.env import backend_info, host_env

        infos: dict[str, dict[str, str]] = {}
        errors: dict[str, str] = {}
        for spec in req["backends"]:
            try:
                infos[spec] = backend_info(self.backend(spec), spec)
            except Exception as exc:  # noqa: BLE001 - reported to the user as a usage error
                errors[spec] = f"{type(exc).__name__}: {exc}"
        from attnfast.base import Backend

        # The backends that JIT-compile per compile key (they override Backend.compile_key) and are available
        # here: the parent asks for their keys (op "keys") to send cases of one kernel to one worker and to
        # compile each key once first.  An unavailable one compiles nothing (its pairs are all refused), and
        # its compile tasks would each fail and replace a worker (1,403 of them for FA4 not installed: minutes).
        jit = [
            s
            for s in infos
            if infos[s].get("available") == "yes" and type(self.backend(s)).compile_key is not Backend.compile_key
        ]
        return {
            "ok": True,
            "env": host_env(req.get("device", "cpu")),
            "backends": infos,
            "errors": errors,
            "jit": jit,
        }

    def keys(self, req: dict[str, Any]) -> dict[str, Any]:
        """Each case's compile key per backend (``repr`` of it, or None: no JIT, or refused here)."""
        from conformance.cases.case import AttentionCase

        device = req.get("device", "cpu")
        backends = [self.backend(s) for s in req["backends"]]
        rows = []
        for case_json in req["cases"]:
            case = AttentionCase.from_json(case_json)
            row: list[str | None] = []
            for backend in backends:
                try:
                    key = backend.compile_key(case) if backend.supports(case, device) else None
                except Exception:  # noqa: BLE001 - a key is a scheduling hint; without it the case runs anyway
                    key = None
                row.append(None if key is None else repr(key))
            rows.append(row)
        return {"ok": True, "keys": rows}

    def check(self, req: dict[str, Any]) -> dict[str, Any]:
        from conformance.cases.case import AttentionCase
        from conformance.verdict.check import check_backend, prepare_context, refusal

        phases: dict[str, float] = {}
        device, seed = req.get("device", "cpu"), int(req.get("seed", 0))
        key = json.dumps([req["case"], seed, device], sort_keys=True)
        if key != self.ctx_key:
            # A backend that refuses the case is answered from the case alone: a case no backend runs never
            # costs inputs, a reference or a baseline.
            t0 = time.perf_counter()
            refused = refusal(
                AttentionCase.from_json(req["case"]),
                self.backend(req["backend"]),
                device,
                seed,
                was_available=bool(req.get("available")),
            )
            if refused is not None:
                phases["check_s"] = time.perf_counter() - t0
                return {"ok": True, "result": refused.to_json(), "phases": phases}
            t0 = time.perf_counter()
            self.ctx, self.ctx_key = None, None  # free the previous case's tensors first
            self.trim_cuda_cache(device)
            self.ctx = prepare_context(AttentionCase.from_json(req["case"]), seed=seed, device=device)
            self.ctx_key = key
            phases["context_s"] = time.perf_counter() - t0
        tol_key = json.dumps([req.get("tol", []), req.get("tol_file")])
        if tol_key not in self.overrides:
            self.overrides[tol_key] = load_overrides(list(req.get("tol", [])), req.get("tol_file"))
        timer = None
        if req.get("time"):
            if device not in self.timers:
                from conformance.perf.timing import make_timer

                self.timers[device] = make_timer(device)  # one per device: it caches the copy bandwidth
            case_timer, case = self.timers[device], self.ctx.case
            # make_timer's timer takes (case, fn) for the roofline; check_backend calls timer(fn).
            timer = lambda fn: case_timer(case, fn)
        if "context_s" in phases:
            phases.update(self.ctx.phases)
        spec = req["backend"]
        ckey = self.compile_key(spec, self.ctx.case)
        split: dict[str, float] = {}
        t0 = time.perf_counter()
        result = check_backend(
            self.ctx, self.backend(spec), overrides=self.overrides[tol_key], timer=timer, phases=split
        )
        phases["check_s"] = time.perf_counter() - t0
        if self.ctx.corrupted:  # a kernel wrote into the context (check_backend's guard): the next backend's is new
            self.ctx, self.ctx_key = None, None
        kernel = split.get("kernel_s", 0.0)
        if ckey is not None and (spec, ckey) not in self.compiled and kernel > 0:
            self.compiled.add((spec, ckey))
            phases["compile_s"] = kernel
        else:
            phases["kernel_s"] = kernel
        phases["verdict_s"] = split.get("verdict_s", 0.0)
        if split.get("bench_s"):
            phases["bench_s"] = split["bench_s"]
        phases["prepare_s"] = max(0.0, phases["check_s"] - kernel - phases["verdict_s"] - split.get("bench_s", 0.0))
        t0 = time.perf_counter()
        encoded = result.to_json()
        phases["encode_s"] = time.perf_counter() - t0
        return {"ok": True, "result": encoded, "phases": phases}

    def compile(self, req: dict[str, Any]) -> dict[str, Any]:
        """Call the backend's kernel once on the case's inputs, unjudged (the ``compile`` op)."""
        from conformance.cases.case import AttentionCase
        from conformance.cases.inputs import make_inputs
        from conformance.verdict.check import composition_of, declared_support, sync

        spec, device, seed = req["backend"], req.get("device", "cpu"), int(req.get("seed", 0))
        case = AttentionCase.from_json(req["case"])
        key = self.compile_key(spec, case)
        out: dict[str, Any] = {"ok": True, "compiled": False, "key": key, "inputs_s": 0.0, "compile_s": 0.0}
        self.ctx, self.ctx_key = None, None  # free the last case's tensors: this one's inputs take their place
        try:
            backend = self.backend(spec)
            composition = composition_of(case)
            support = declared_support(case, backend, device)
            if not support:
                out["error"] = f"unsupported: {support.reason}"
                return out
            t0 = time.perf_counter()
            inputs = make_inputs(case, seed, device)
            sync(device)
            t1 = time.perf_counter()
            fn = (
                backend.prepare(case, inputs)
                if composition is None
                else composition.prepare(case, inputs, backend, device)
            )
            fn()
            sync(device)
            out["inputs_s"], out["compile_s"] = t1 - t0, time.perf_counter() - t1
        except Exception as exc:  # noqa: BLE001 - the pair is judged (and fails) in the check phase as usual
            out["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
            return out
        if key is not None:
            self.compiled.add((spec, key))
        out["compiled"] = True
        return out

    def load(self, req: dict[str, Any]) -> dict[str, Any]:
        errors: dict[str, str] = {}
        for spec in req["backends"]:
            try:
                self.backend(spec)
            except Exception as exc:  # noqa: BLE001
                errors[spec] = f"{type(exc).__name__}: {exc}"
        return {"ok": not errors, "errors": errors}

    def handle(self, req: dict[str, Any]) -> dict[str, Any]:
        op = req.get("op")
        try:
            if op == "load":
                return self.load(req)
            if op == "describe":
                return self.describe(req)
            if op == "check":
                return self.check(req)
            if op == "keys":
                return self.keys(req)
            if op == "compile":
                return self.compile(req)
            return {"ok": False, "error": f"unknown op {op!r}"}
        except Exception as exc:  # noqa: BLE001 - the parent records it; the worker keeps serving
            return {
                "ok": False,
                "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc(limit=8),
            }


def _claim_stdout() -> IO[str]:
    """Move the protocol channel off fd 1 and send fd 1 (and ``sys.stdout``) to stderr."""
    sys.stdout.flush()
    proto_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return os.fdopen(proto_fd, "w", encoding="utf-8", buffering=1)


def _send(channel: IO[str], message: dict[str, Any]) -> None:
    channel.write(json.dumps(message, allow_nan=True) + "\n")
    channel.flush()


def _watch_parent(period_s: float = 1.0) -> None:
    """Exit when the parent dies: a killed runner must not leave a worker hung in a kernel forever.

    (EOF on stdin covers a worker that is waiting for a request; this covers one that is busy.)
    """
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(period_s)
            if os.getppid() != parent:
                os._exit(3)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


def main() -> int:
    """Serve requests until stdin closes (the parent exited or is done).  SIGINT is ignored: the parent alone
    decides when a worker stops (it closes stdin or kills it), so a Ctrl-C, which reaches the parent, never turns
    the pair in flight into a ``crash`` record nor prints a worker's traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    channel = _claim_stdout()
    import faulthandler

    # A segfault or abort prints the Python stack to stderr, which the parent quotes in "crash";
    # SIGUSR1 prints it on demand, which the parent asks for before killing a hung worker.
    faulthandler.enable(file=sys.stderr)
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    _watch_parent()
    # torch, the reference and the checker load before "ready": the parent's startup deadline
    # covers them, not the first case's timeout.
    import conformance.verdict.check  # noqa: F401

    worker = _Worker()
    _send(channel, {"op": "ready", "pid": os.getpid()})
    replied = time.perf_counter()
    for line in sys.stdin:
        t_read = time.perf_counter()
        if not line.strip():
            continue
        try:
            reply = worker.handle(json.loads(line))
        except json.JSONDecodeError as exc:
            reply = {"ok": False, "error": f"bad request line: {exc}"}
        reply["idle_s"] = t_read - replied
        reply["worker_s"] = time.perf_counter() - t_read
        try:
            _send(channel, reply)
        except BrokenPipeError:
            return 0  # the parent is gone; nobody is left to tell
        replied = time.perf_counter()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stderr.flush()
    # Skip the interpreter's teardown (1.4 s with torch loaded): every reply is already flushed, and the
    # parent waits for this exit at the end of each run and for each worker of a pool.
    os._exit(code)
