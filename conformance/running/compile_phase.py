"""The compile phase of a sweep: every distinct JIT kernel compiled once, spread over the workers, before the checks.

A JIT backend (one with :meth:`attnfast.base.Backend.compile_key`; FA4) compiles one kernel per compile key, on
the first call in a process (1.5-15 s each for FA4, on the CPU).  Left to the checks, those compiles land on
whichever worker meets a key first, while the other workers wait on their own compiles or run out of work at
the end.  Before the checks, :func:`run_compile_phase` hands each distinct ``(backend, key)`` of the selected
pairs to one worker (all workers, all GPUs, one task at a time each): the worker's ``compile`` op builds the
inputs of the key's smallest case (a case without an engine, graph or backward composition when the key has
one) and calls the kernel once, unjudged.  FA4's persistent disk cache (every worker gets
``FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1`` and one ``FLASH_ATTENTION_CUTE_DSL_CACHE_DIR``,
:class:`~conformance.running.pool.Placement`) then holds every kernel, so a check's first call of a key in
another worker is a load, not a compile.

A compile that fails (the kernel refuses the case, raises, crashes the worker or runs past ``--timeout``) is
counted and named in the stats, never fatal: the worker is replaced when it died (or, on CUDA, raised), and
the key's pairs run in the checks as they would have without the phase, where they fail or crash with their
own record.  The records of a sweep are the same with and without the phase; only where the time goes
differs.  ``attnconf warmup`` (``run --compile-only``) runs this phase alone, to bake the cache into an image.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CompileStats", "CompileTask", "compile_first", "plan_compiles", "run_compile_phase"]


@dataclass(frozen=True)
class CompileTask:
    """One kernel to compile: the backend spec, its compile key (``repr``), the case whose call compiles it and
    how many selected cases share the key."""

    spec: str
    key: str
    case: Any
    cases: int


@dataclass
class CompileStats:
    """What the compile phase did: kernels (distinct keys), compiled, failed (with the reason), seconds."""

    keys: int = 0
    compiled: int = 0
    failed: list[dict[str, str]] = field(default_factory=list)
    wall_s: float = 0.0
    #: the workers' time in ``compile`` requests (a crash or timeout: the wait for it)
    worker_s: float = 0.0
    #: per task, the kernel call's seconds (the compile itself; a disk-cache load when the key was there)
    compile_s: list[float] = field(default_factory=list)
    workers: int = 0
    interrupted: bool = False
    #: (spec, key) -> the index of the worker that compiled it (the checks send it the key's cases first)
    owner: dict[tuple[str, str], int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "keys": self.keys,
            "compiled": self.compiled,
            "failed": len(self.failed),
            "failures": self.failed,
            "wall_s": round(self.wall_s, 3),
            "worker_s": round(self.worker_s, 3),
            "compile_s": round(sum(self.compile_s), 3),
            "workers": self.workers,
        }

    def line(self) -> str:
        """One line for the end of a run (an interrupted phase says how far it got)."""
        longest = f", longest {max(self.compile_s):.1f} s" if self.compile_s else ""
        stopped = (
            f"; interrupted after {self.compiled + len(self.failed)} of {self.keys}, the rest not tried"
            if self.interrupted
            else ""
        )
        return (
            f"compile phase: {self.keys} kernel(s) by {self.workers} worker(s) in {self.wall_s:.1f} s "
            f"({self.worker_s:.1f} worker-s{longest}): {self.compiled} compiled, {len(self.failed)} failed{stopped}"
        )


def plan_compiles(
    units: Sequence[Sequence[Any]],
    unit_keys: dict[str, tuple[tuple[str, Hashable], ...]],
    size: Callable[[Any], float],
) -> list[CompileTask]:
    """One task per distinct ``(spec, key)`` of ``unit_keys`` (case id -> its pairs' keys): the key's smallest
    case by ``size`` (one without a composition when there is one), most-shared keys first."""
    best: dict[tuple[str, Hashable], tuple[tuple[bool, float, int], Any]] = {}
    count: collections.Counter = collections.Counter()
    order = 0
    for unit in units:
        case = unit[0].case
        for spec, key in unit_keys.get(case.id, ()):
            count[spec, key] += 1
            composed = bool(case.engine or case.graph or case.invariance or case.backward)
            rank = (composed, size(case), order)
            order += 1
            if (spec, key) not in best or rank < best[spec, key][0]:
                best[spec, key] = (rank, case)
    tasks = [CompileTask(spec, str(key), case, count[spec, key]) for (spec, key), (_, case) in best.items()]
    return sorted(tasks, key=lambda t: -t.cases)  # stable: first seen first among equals


def run_compile_phase(
    clients: Sequence[Any],
    tasks: Sequence[CompileTask],
    *,
    seed: int,
    device: str,
    timeout: float,
    on_done: Callable[[CompileTask, dict[str, Any]], None] | None = None,
    stats: CompileStats | None = None,
) -> CompileStats:
    """Compile ``tasks`` on ``clients`` (:class:`~conformance.running.worker_client.WorkerClient`), one task at a
    time per worker, until none is left; ``on_done(task, outcome)`` after each (the progress bar).  ``stats``, when
    given, is filled in place (and returned), so that a caller still holds what was compiled when Ctrl-C arrives.

    Ctrl-C stops the workers (killed, so that a long compile does not hold the run), marks ``stats`` interrupted
    and propagates."""
    if stats is None:
        stats = CompileStats()
    stats.keys, stats.workers = len(tasks), min(len(clients), len(tasks))
    if not tasks:
        return stats
    queue_ = collections.deque(tasks)
    lock = threading.Lock()
    stop = threading.Event()
    errors: list[BaseException] = []
    t0 = time.perf_counter()

    def work(index: int, client: Any) -> None:
        try:
            while not stop.is_set():
                with lock:
                    if not queue_:
                        return
                    task = queue_.popleft()
                reply = client.request(
                    {"op": "compile", "case": task.case.to_json(), "backend": task.spec, "seed": seed,
                     "device": device},
                    timeout=timeout,
                )  # fmt: skip
                if stop.is_set():
                    return
                outcome = _outcome(reply)
                if reply.kind != "ok" or (outcome["error"] and device.startswith("cuda")):
                    client.kill()  # dead, silent, or its CUDA context may be poisoned: a fresh worker next
                with lock:
                    stats.worker_s += reply.data.get("worker_s", reply.wall_s) if reply.kind == "ok" else reply.wall_s
                    if outcome["compiled"]:
                        stats.compiled += 1
                        stats.owner[task.spec, task.key] = index
                        stats.compile_s.append(outcome["compile_s"])
                    else:
                        stats.failed.append({"backend": task.spec, "key": task.key, "case_id": task.case.id,
                                             "reason": outcome["error"]})  # fmt: skip
                if on_done is not None:
                    on_done(task, outcome)
        except BaseException as exc:  # noqa: BLE001 - a worker that cannot start: handed to the caller
            errors.append(exc)
            stop.set()

    threads = [
        threading.Thread(target=work, args=(i, c), name=f"attnconf-compile-{i}", daemon=True)
        for i, c in enumerate(clients[: stats.workers])
    ]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            while thread.is_alive():
                thread.join(timeout=0.2)
    except KeyboardInterrupt:
        stop.set()
        for client in clients[: stats.workers]:
            client.kill()
        for thread in threads:
            thread.join(timeout=10)
        stats.interrupted = True
        raise
    finally:
        stats.wall_s = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return stats


def _outcome(reply: Any) -> dict[str, Any]:
    """``{"compiled": bool, "compile_s": s, "error": text}`` of a ``compile`` reply, a crash or a timeout."""
    if reply.kind != "ok":
        first = (reply.reason or "").strip().splitlines()
        return {"compiled": False, "compile_s": 0.0, "error": f"{reply.kind}: {first[0] if first else ''}"}
    data = reply.data
    if not data.get("ok"):
        return {"compiled": False, "compile_s": 0.0, "error": str(data.get("error", "worker error"))}
    return {
        "compiled": bool(data.get("compiled")),
        "compile_s": float(data.get("compile_s", 0.0)),
        "error": data.get("error") or "",
    }


def compile_first(
    clients: Sequence[Any],
    units: Sequence[Sequence[Any]],
    unit_keys: dict[str, tuple[tuple[str, Hashable], ...]],
    *,
    seed: int,
    device: str,
    timeout: float,
    progress: bool,
    stats: CompileStats | None = None,
) -> CompileStats:
    """The compile phase of a run: :func:`plan_compiles` over the units' keys, :func:`run_compile_phase` on
    ``clients`` (filling ``stats`` in place when given), with a progress bar on stderr (``progress``)."""
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

    from conformance.console import progress as progress_display
    from conformance.running.schedule import case_size

    tasks = plan_compiles(units, unit_keys, case_size)
    bar = progress_display(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        disable=not progress or not tasks,
        unit="kernels",
    )
    with bar:
        task_id = bar.add_task(f"compiling kernels ({min(len(clients), len(tasks))} workers)", total=len(tasks))
        return run_compile_phase(
            clients,
            tasks,
            seed=seed,
            device=device,
            timeout=timeout,
            on_done=lambda task, outcome: bar.update(task_id, advance=1),
            stats=stats,
        )
