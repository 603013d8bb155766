"""Parallel workers for one sweep: how many (``--jobs``), where (``--gpus``), and the loop each one runs.

A sweep on one GPU is bound by the CPU (inputs, the reference, baselines, comparisons, JIT compiles run
in Python), so ``attnconf run`` keeps several crash-isolated workers busy at once.  The parent stays the
only writer of the results file; each worker is driven by one :func:`serve` thread of the parent.

Placement (:func:`plan_workers`): ``--jobs`` is the *total* number of workers; with GPUs they go
round-robin over the listed GPUs (worker ``i`` on GPU ``gpus[i % len(gpus)]``), each with
``CUDA_VISIBLE_DEVICES`` set to that one GPU, so it runs on ``cuda`` (= ``cuda:0``) and a CUDA error
that poisons its context touches no other worker.  With more than one worker each one gets
``OMP_NUM_THREADS`` (and ``MKL_NUM_THREADS``, ``TORCHINDUCTOR_COMPILE_THREADS``) = its share of the
cores, unless the caller's environment already sets them.

Default ``--jobs`` (:func:`default_jobs`), over the cores the run may use (:func:`usable_cpus`: the CPU
affinity, so ``taskset -c 0-15`` on a 64-core machine counts 16): on ``cpu``, one worker per core (at
most 16), each with one thread: the harness's tensors are small, and one process per core beats threads
within one; on ``cuda``, one worker per core but one (the parent's), at most 16 per GPU and 32 in all
(:data:`MAX_CUDA_JOBS`), at least one per GPU; with ``--time``, one per GPU (or one on ``cpu``) so timed kernels
do not share a device.

GPU discovery (:func:`visible_gpus`) is injectable: ``$ATTNCONF_FAKE_GPUS=N`` pretends N GPUs are
visible (placement only: the kernels still run on ``--device``), which is how placement is tested on a
machine without a GPU; otherwise ``$CUDA_VISIBLE_DEVICES`` when set, else ``torch.cuda.device_count()``
(which creates no CUDA context in the parent).

Compile affinity (:class:`WorkFeed`): a JIT backend (FA4) compiles one kernel per *compile key*
(:meth:`attnfast.base.Backend.compile_key`) in each process that meets it, so a case goes preferably to
a worker that already compiled its keys: a worker takes units of the keys it holds; with none left, the
largest group of a key no worker holds yet; then units without keys; then the oldest unit (FIFO).  Every
worker also gets ``FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1`` (FA4's persistent kernel cache on disk)
and ``FLASH_ATTENTION_CUTE_DSL_CACHE_DIR`` = the directory FA4 would pick in the parent,
``<tempdir>/<user>/flash_attention_cute_dsl_cache`` (:func:`fa4_cache_dir`), unless the caller set them,
so every worker of a run (whatever its own environment would make of the temporary directory) reads and
writes one cache: a kernel one worker compiled is loaded, not compiled, by the others and by the next run.
"""

from __future__ import annotations

import collections
import os
import queue
import threading
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "FA4_CACHE_DIR_ENV",
    "FA4_CACHE_ENV",
    "FAKE_GPUS_ENV",
    "GPU_SHARING_ENV",
    "PIPELINE_DEPTH",
    "Outcome",
    "Placement",
    "PlacementError",
    "WorkFeed",
    "default_jobs",
    "fa4_cache_dir",
    "parse_gpus",
    "parse_jobs",
    "plan_workers",
    "serve",
    "usable_cpus",
    "visible_gpus",
]

#: Environment variable naming a number of pretend GPUs (placement tests on a CPU machine).
FAKE_GPUS_ENV = "ATTNCONF_FAKE_GPUS"
#: Requests sent to one worker ahead of its replies: one running, one queued, so the worker never
#: waits while the parent writes the previous record.
PIPELINE_DEPTH = 2
#: At most this many workers share one GPU by default (each holds a CUDA context and its case's tensors): ``default``
#: on five kernels on an H100 with 16 cores took 120 s with 15 workers and 173 s with 12 (same machine, one call;
#: reports/h100-2026-11-26-speed), the GPU's memory shared through :data:`GPU_SHARING_ENV`.
MAX_JOBS_PER_GPU = 16
#: At most this many workers in all by default on ``cuda``, however many GPUs and cores: on two 4 x H100 hosts of 64
#: cores, 63 workers ran ``default`` on five kernels slower than 48 (83.0 s against 72.2 s, one host) and than 32
#: (73.6 s against 65.9 s, the other): each worker's CPU work grew faster than the workers
#: (reports/h100x4-2026-11-28-scale, reports/h100x4-2026-11-28-bytecode).
MAX_CUDA_JOBS = 32
#: At most this many workers by default on ``cpu`` (each is a Python process with torch loaded: ~0.4 GB).
MAX_CPU_JOBS = 16
_THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "TORCHINDUCTOR_COMPILE_THREADS")
#: FA4's persistent JIT cache (``flash_attn/cute/cache_utils.py``): on in every worker unless the caller set it.
FA4_CACHE_ENV = "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"
#: How many workers share this worker's GPU: the worker keeps its allocator cache below its share of the GPU's
#: memory (:class:`conformance.running.worker` empties it between cases when it is over), so memory one worker
#: freed after a large case is not held back from the others (34 CUDA OOMs, each retried alone at the end of the
#: run, in ``default`` with 12 workers on one H100 without it).
GPU_SHARING_ENV = "ATTNCONF_GPU_SHARING"
#: Where that cache lives (``flash_attn/cute/cache_utils.py``: this variable, else ``<tempdir>/<user>/...``).
FA4_CACHE_DIR_ENV = "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"


def fa4_cache_dir() -> str | None:
    """FA4's default cache directory as this process computes it (None when the user name is unknown)."""
    import getpass
    import tempfile

    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        return None
    return os.path.join(tempfile.gettempdir(), user, "flash_attention_cute_dsl_cache")


class PlacementError(ValueError):
    """A ``--jobs``/``--gpus`` combination that cannot be placed (the runner reports it as a usage error)."""


#: The most workers ``--jobs`` starts: each is a process holding torch (hundreds of MB), and ``auto`` never exceeds
#: 16 per GPU or 16 on a CPU, so more is a typo (``--jobs 10**12`` spent minutes allocating before a MemoryError).
MAX_JOBS = 1024


def parse_jobs(text: str) -> int | None:
    """``--jobs``: ``auto`` (None: :func:`default_jobs`) or an integer in [1, :data:`MAX_JOBS`]."""
    if text == "auto":
        return None
    try:
        jobs = int(text)
    except ValueError:
        raise PlacementError(f"--jobs must be auto or a whole number in [1, {MAX_JOBS}], got {text[:40]!r}") from None
    if not 1 <= jobs <= MAX_JOBS:
        raise PlacementError(f"--jobs must be auto or a whole number in [1, {MAX_JOBS}], got {jobs}")
    return jobs


def parse_gpus(text: str) -> tuple[int, ...] | None:
    """``--gpus``: ``all`` (None: every visible GPU) or distinct indices ``0,1,...`` as ``cuda:N`` counts them."""
    if text.strip() == "all":
        return None
    parts = [p.strip() for p in text.split(",")]
    if not parts or not all(p.isascii() and p.isdigit() and len(p) <= 4 and int(p) < MAX_JOBS for p in parts):
        raise PlacementError(
            f"--gpus must be all or comma-separated GPU indices below {MAX_JOBS} such as 0,1, got {text[:40]!r}"
        )
    gpus = tuple(int(p) for p in parts)
    if len(set(gpus)) != len(gpus):
        raise PlacementError(f"--gpus names a GPU twice: {text!r} (use --jobs for several workers per GPU)")
    return gpus


def visible_gpus(environ: Mapping[str, str] | None = None) -> list[str]:
    """The GPUs this process may use, as ``CUDA_VISIBLE_DEVICES`` tokens (index ``i`` is ``cuda:i`` here)."""
    environ = os.environ if environ is None else environ
    fake = environ.get(FAKE_GPUS_ENV)
    if fake is not None:
        if not fake.strip().isdigit():
            raise PlacementError(f"${FAKE_GPUS_ENV} must be a whole number, got {fake!r}")
        return [str(i) for i in range(int(fake))]
    if "CUDA_VISIBLE_DEVICES" in environ:
        return [t.strip() for t in environ["CUDA_VISIBLE_DEVICES"].split(",") if t.strip()]
    try:
        import torch

        return [str(i) for i in range(torch.cuda.device_count())]
    except Exception:  # noqa: BLE001 - no usable CUDA runtime means no GPU to place on
        return []


def usable_cpus() -> int:
    """The cores this process may run on: its CPU affinity (``taskset``, a container's cpuset, a batch
    scheduler's binding), not the machine's count, which ``os.cpu_count()`` gives whatever the binding.
    Workers inherit the parent's affinity, so this is what a run's workers share."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # no affinity call on this platform (macOS, Windows)
        return os.cpu_count() or 1


def default_jobs(device: str, gpus: int, cpus: int, timed: bool = False) -> int:
    """Workers a machine sustains (see the module docstring for the rule)."""
    if not device.startswith("cuda"):
        return 1 if timed else max(1, min(cpus, MAX_CPU_JOBS))
    per_device = max(1, gpus)
    if timed:
        return per_device
    return max(per_device, min(max(1, cpus - 1), MAX_JOBS_PER_GPU * per_device, MAX_CUDA_JOBS))


@dataclass(frozen=True)
class Placement:
    """One worker of a pool: its index, its GPU (a ``CUDA_VISIBLE_DEVICES`` token, or None: the caller's
    devices) and its CPU thread budget (None: the library defaults)."""

    worker: int
    gpu: str | None = None
    threads: int | None = None
    #: workers placed on this worker's GPU (itself included)
    sharing: int = 1

    def env(self, environ: Mapping[str, str] | None = None) -> dict[str, str | None]:
        """Environment changes of this worker's process (variables the caller already set are kept)."""
        environ = os.environ if environ is None else environ
        env: dict[str, str | None] = {}
        if self.gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.gpu
        env[GPU_SHARING_ENV] = str(self.sharing)
        if self.threads is not None:
            env.update({k: str(self.threads) for k in _THREAD_VARS if k not in environ})
        if FA4_CACHE_ENV not in environ:
            env[FA4_CACHE_ENV] = "1"  # a kernel compiled by one worker is loaded by the others (and next run)
        if FA4_CACHE_DIR_ENV not in environ:
            cache = fa4_cache_dir()  # one directory for every worker, FA4's own default
            if cache is not None:
                env[FA4_CACHE_DIR_ENV] = cache
        return env

    def to_json(self) -> dict[str, Any]:
        return {"worker": self.worker, "gpu": self.gpu, "threads": self.threads}


def plan_workers(
    device: str,
    jobs: int | None,
    gpus: tuple[int, ...] | None,
    *,
    gpus_given: bool,
    timed: bool = False,
    cpus: int | None = None,
    discover: Callable[[], list[str]] = visible_gpus,
    environ: Mapping[str, str] | None = None,
) -> list[Placement]:
    """The workers of a run.  ``gpus``/``gpus_given``: the parsed ``--gpus`` and whether it was given
    (not given: every visible GPU when ``device`` is ``cuda``, the first ``jobs`` of them when there are
    fewer workers than GPUs; none for ``cuda:N`` and ``cpu``)."""
    environ = os.environ if environ is None else environ
    cpus = cpus or usable_cpus()
    fake = FAKE_GPUS_ENV in environ
    tokens: list[str] | None = None
    if gpus_given:
        if not device.startswith("cuda") and not fake:
            raise PlacementError(f"--gpus places workers on CUDA devices, but --device is {device}")
        if device.startswith("cuda:"):
            raise PlacementError(
                f"--gpus picks the GPUs itself: give --device cuda, not {device} (each worker sees its GPU as cuda:0)"
            )
        seen = discover()
        if not seen:
            raise PlacementError("--gpus: no CUDA device is visible (torch.cuda.device_count() is 0)")
        if gpus is None:
            tokens = seen
        else:
            bad = [g for g in gpus if g >= len(seen)]
            if bad:
                raise PlacementError(f"--gpus {bad} not visible: {len(seen)} GPU(s) here, indices 0-{len(seen) - 1}")
            tokens = [seen[g] for g in gpus]
    elif device == "cuda":
        tokens = discover() or None
    n_gpus = len(tokens) if tokens else (1 if device.startswith("cuda") else 0)
    if jobs is None:
        jobs = default_jobs(device, n_gpus, cpus, timed)
    if tokens and jobs < len(tokens) and not gpus_given:
        tokens = tokens[:jobs]  # --jobs 2 on a 4-GPU machine: the first two GPUs
    if tokens and jobs < len(tokens):
        raise PlacementError(
            f"--jobs {jobs} is fewer than the {len(tokens)} GPUs to use: give --jobs >= {len(tokens)} or fewer --gpus"
        )
    threads = max(1, cpus // jobs) if jobs > 1 else None
    placed = [tokens[i % len(tokens)] if tokens else None for i in range(jobs)]
    return [Placement(i, gpu, threads, placed.count(gpu)) for i, gpu in enumerate(placed)]


class WorkFeed:
    """The cases still to run, each as the list of its (case, backend) pairs still to run; a worker takes a
    whole case, so the case's reference is computed once.

    ``keys(unit)`` gives a unit's compile keys (hashable; the runner's are ``(backend spec, compile key)``
    of its JIT backends; none: no affinity, plain FIFO).  :meth:`take` with a worker id hands out, in this
    order: a unit with a key that worker already holds (it compiled that kernel), the oldest unit of the
    largest group of a key no worker holds yet (the worker now holds it), the oldest unit without keys,
    the oldest unit.  Every key of a unit a worker takes is then held by it.  So while unclaimed keys
    remain, no key is compiled by two workers; at the end, idle workers take over the groups still left
    (FA4's disk cache makes that a load, not a compile).  Deterministic given the units' order and the
    sequence of ``take`` calls; amortised O(1) per take (each unit leaves each queue once), plus a scan
    of the unclaimed keys when a worker claims one; thread-safe.

    ``cost(unit)`` (seconds, :mod:`conformance.running.schedule`; units given longest first): the largest
    group is then the one whose units left cost most, and a unit without keys that costs more than that
    group's next unit goes first (a long case must not wait behind every kernel's group).  Without it every
    unit weighs 1.
    """

    def __init__(
        self,
        units: Iterable[list[Any]],
        keys: Callable[[list[Any]], Iterable[Hashable]] | None = None,
        cost: Callable[[list[Any]], float] | None = None,
    ) -> None:
        self._units = [u for u in units if u]
        self._cost = [float(cost(u)) if cost else 1.0 for u in self._units]
        self._weighed = cost is not None
        self._keys = [tuple(dict.fromkeys(k for k in keys(u) if k is not None)) if keys else () for u in self._units]
        self._taken = [False] * len(self._units)
        self._left = len(self._units)
        self._fifo = collections.deque(range(len(self._units)))
        self._keyless = collections.deque(i for i, k in enumerate(self._keys) if not k)
        self._by_key: dict[Hashable, collections.deque[int]] = {}
        for i, ks in enumerate(self._keys):
            for k in ks:
                self._by_key.setdefault(k, collections.deque()).append(i)
        self._count = {k: len(q) for k, q in self._by_key.items()}  # units not taken yet, per key
        self._weight = {k: sum(self._cost[i] for i in q) for k, q in self._by_key.items()}  # their cost
        self._unclaimed = dict.fromkeys(self._by_key)  # keys no worker holds, in order of first appearance
        self._held: dict[Any, collections.deque[Hashable]] = {}  # per worker: its keys that may have units left
        self._holds: dict[Any, set[Hashable]] = {}
        #: key -> the worker that claimed it first (for tests and diagnostics)
        self.owner: dict[Hashable, Any] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self._left

    def _pop(self, q: collections.deque[int]) -> int | None:
        while q and self._taken[q[0]]:
            q.popleft()
        return q.popleft() if q else None

    def _hand(self, i: int, worker: Any) -> list[Any]:
        self._taken[i] = True
        self._left -= 1
        for k in self._keys[i]:
            self._count[k] -= 1
            self._weight[k] -= self._cost[i]
            if worker is None:
                continue
            self._unclaimed.pop(k, None)
            self.owner.setdefault(k, worker)
            holds = self._holds.setdefault(worker, set())
            if k not in holds:
                holds.add(k)
                self._held.setdefault(worker, collections.deque()).append(k)
        return self._units[i]

    def hold(self, worker: Any, key: Hashable) -> None:
        """Let ``worker`` hold ``key`` before any take (it compiled that kernel in the compile phase), so it is
        handed the key's units first.  A key no unit has is ignored; a key held already stays with its holder."""
        with self._lock:
            if key not in self._by_key or key in self.owner:
                return
            self._unclaimed.pop(key, None)
            self.owner[key] = worker
            self._holds.setdefault(worker, set()).add(key)
            self._held.setdefault(worker, collections.deque()).append(key)

    def take(self, worker: Any = None) -> list[Any] | None:
        """The next unit for ``worker`` (None: FIFO, no affinity), or None when all were handed out."""
        with self._lock:
            if not self._left:
                return None
            if worker is not None:
                held = self._held.get(worker)
                while held:
                    i = self._pop(self._by_key[held[0]])
                    if i is not None:
                        return self._hand(i, worker)
                    held.popleft()  # that key's group is used up
                best = None
                for k in list(self._unclaimed):
                    if not self._count[k]:
                        del self._unclaimed[k]  # taken up by workers that held other keys of its units
                    elif best is None or self._weight[k] > self._weight[best]:
                        best = k
                if best is not None:
                    group = self._by_key[best]
                    while group and self._taken[group[0]]:
                        group.popleft()
                    assert group
                    if self._weighed:
                        while self._keyless and self._taken[self._keyless[0]]:
                            self._keyless.popleft()
                        if self._keyless and self._cost[self._keyless[0]] > self._cost[group[0]]:
                            return self._hand(self._keyless.popleft(), worker)
                    return self._hand(group.popleft(), worker)
                i = self._pop(self._keyless)
                if i is not None:
                    return self._hand(i, worker)
            i = self._pop(self._fifo)
            assert i is not None
            return self._hand(i, worker)


@dataclass(frozen=True)
class Outcome:
    """What a worker thread hands the writer: a finished record, an exception, or its end."""

    worker: int
    record: Any = None
    reply: Any = None
    error: BaseException | None = None
    end: bool = False


def serve(
    worker: int,
    client: Any,
    feed: WorkFeed,
    outcomes: queue.Queue[Outcome],
    judge: Callable[[Any, Any, int], tuple[Any, bool]],
    timeout: float,
    stop: threading.Event,
    depth: int = PIPELINE_DEPTH,
) -> None:
    """Drive one worker until the feed is empty: keep ``depth`` requests in flight, turn each reply into a
    record with ``judge(pair, reply, worker) -> (record, restart)``, put it on ``outcomes``.

    ``pair`` objects carry ``.request``.  ``restart`` (a crash, a timeout, or a CUDA error that may have
    poisoned the context) kills this worker; the requests it had queued are sent again to a fresh one.
    Always ends with an ``Outcome(end=True)``; an exception (a worker that cannot start) is handed over.
    """
    mine: collections.deque[Any] = collections.deque()  # taken from the feed, not sent yet
    sent: collections.deque[Any] = collections.deque()  # sent, reply not collected yet
    try:
        while not stop.is_set():
            while len(sent) < depth and not stop.is_set():
                if not mine:
                    unit = feed.take(worker)
                    if unit is None:
                        break
                    mine.extend(unit)
                pair = mine.popleft()
                client.submit(pair.request)
                sent.append(pair)
            if not sent:
                break
            pair = sent.popleft()
            reply = client.collect(timeout)
            if stop.is_set():
                break
            record, restart = judge(pair, reply, worker)
            if restart or reply.kind != "ok":
                client.kill()
                mine.extendleft(reversed(sent))
                sent.clear()
            outcomes.put(Outcome(worker, record=record, reply=reply))
    except BaseException as exc:  # noqa: BLE001 - handed to the writer thread, which re-raises it
        outcomes.put(Outcome(worker, error=exc))
    finally:
        outcomes.put(Outcome(worker, end=True))
