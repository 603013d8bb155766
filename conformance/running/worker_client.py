"""The parent's side of the worker protocol (:mod:`conformance.running.worker` is the worker's side and
documents the requests and replies).

:class:`WorkerClient` starts ``python -m conformance.running.worker``, sends one request, waits for the
reply with a deadline, and turns a dead or silent worker into a :class:`Reply` of kind ``crash`` or
``timeout`` (the worker is killed, and a fresh one starts for the next request).  :meth:`WorkerClient.request`
is one request and its reply; :meth:`WorkerClient.submit` and :meth:`WorkerClient.collect` split it for
pipelining.  :class:`WorkerStartError`: a worker died or stayed silent before it was ready.

A restart (a start after the first) may take an already started worker instead of waiting for a new one: the
``spares`` hook (:class:`conformance.running.spares.Spares`) hands one over, which the client adopts
(:meth:`WorkerClient.adopt`).  ``starts``, ``start_s`` count the workers that served this client, adopted ones
included; ``wait_s`` is what the caller waited for each, ``adopted`` how many came from the hook.

A worker's Python keeps the bytecode it compiles (:func:`bytecode_cache`): where torch was installed without
``.pyc`` files and the interpreter writes none (``PYTHONDONTWRITEBYTECODE``, usual in CI images), every worker would
compile torch's sources again (docs/concepts/performance.md).
"""

from __future__ import annotations

import collections
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import IO, Any

__all__ = [
    "BYTECODE_PACKAGES",
    "PYCACHE_ENV",
    "Reply",
    "WorkerClient",
    "WorkerStartError",
    "bytecode_cache",
    "use_bytecode_cache",
]

#: the folder Python compiles modules into instead of each source's ``__pycache__`` (and reads them from)
PYCACHE_ENV = "PYTHONPYCACHEPREFIX"


@dataclass
class Reply:
    """What became of one request: ``ok`` (``data`` holds the reply), ``crash`` or ``timeout``."""

    kind: str
    data: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    wall_s: float = 0.0


class WorkerStartError(RuntimeError):
    """The worker died or stayed silent before it said it was ready."""


_REPO = Path(__file__).resolve().parents[2]


@lru_cache(maxsize=None)
def _has_bytecode(module: str) -> bool:
    """Whether ``module`` (a top-level package) was installed with its bytecode beside its source (pip compiles it
    unless told not to); True when it cannot be told (not installed, not from source): nothing to add then."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return True
    origin = spec.origin if spec is not None else None
    if not origin or not origin.endswith(".py"):
        return True
    source = Path(origin)
    # not importlib.util.cache_from_source: it follows sys.pycache_prefix, which use_bytecode_cache sets in this
    # process, and the question is what the install itself holds
    return (source.parent / "__pycache__" / f"{source.stem}.{sys.implementation.cache_tag}.pyc").exists()


#: the packages whose modules make most of a worker's imports: torch, sympy (torch's compiler stack imports it at
#: the first call of a custom op), flash-attn's Python (FA2, FA4) and the CuTe DSL FA4 compiles with
BYTECODE_PACKAGES = ("torch", "sympy", "flash_attn", "cutlass")


def bytecode_cache(environ: Mapping[str, str]) -> str | None:
    """The folder the workers' Python compiles into, ``<attnconf cache>/pycache``, or None: leave Python as it is.

    Used when one of :data:`BYTECODE_PACKAGES` has no bytecode beside its sources (an install made with ``pip
    --no-compile``, or unpacked, and read by an interpreter told not to write any, ``PYTHONDONTWRITEBYTECODE=1``,
    or one that cannot write there): then each worker compiles those modules again, seconds of every fresh
    worker (docs/concepts/performance.md has the measurements).  With the folder, the first worker writes the
    bytecode and every later one, in this run and the next, reads it.  None when ``$PYTHONPYCACHEPREFIX`` is set
    (the caller's folder is kept), when every one of them has its bytecode (or is not installed), or when the
    attnconf cache is off (``ATTNCONF_CACHE_DIR=off``, :func:`conformance.suites.cache.cache_dir`)."""
    if environ.get(PYCACHE_ENV) or all(_has_bytecode(name) for name in BYTECODE_PACKAGES):
        return None
    from conformance.suites.cache import cache_dir

    base = cache_dir()
    return None if base is None else str(base / "pycache")


def use_bytecode_cache() -> str | None:
    """This process compiles into the workers' folder too (:func:`bytecode_cache`), so the command's own
    ``import torch`` fills it before the first worker starts; to be called before anything imports torch (the CLI
    does, once its command line is parsed).  Returns the folder, or None when nothing changed (no folder needed,
    or this interpreter already has a ``sys.pycache_prefix``)."""
    folder = bytecode_cache(os.environ)
    if folder is None or sys.pycache_prefix is not None:
        return None
    sys.pycache_prefix = folder
    sys.dont_write_bytecode = False  # it writes into that folder only, never beside a source
    return folder


_TAIL_CHARS = 3000


def _exit_text(returncode: int | None) -> str:
    if returncode is None:
        return "worker closed its channel but is still running"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"worker killed by {name} (exit status {returncode})"
    return f"worker exited with status {returncode}"


class WorkerClient:
    """The parent's handle on one worker process; a new one is started after a crash or timeout.

    Replies are read by a thread into a queue (each stamped with its arrival time) so the parent can
    wait with a deadline; stderr is drained by another thread into a bounded tail (an undrained pipe
    would block the worker), which is quoted in crash and timeout reasons.

    ``env`` adds (or, with value None, removes) environment variables of every worker this client
    starts: the runner's pool places a worker on a GPU with ``CUDA_VISIBLE_DEVICES`` and gives it its
    share of the CPU cores with ``OMP_NUM_THREADS``.
    """

    def __init__(
        self,
        *,
        startup_timeout: float = 180.0,
        python: str = sys.executable,
        env: dict[str, str | None] | None = None,
    ) -> None:
        self.startup_timeout = startup_timeout
        self.python = python
        self.env: dict[str, str | None] = dict(env or {})
        #: backend specs every fresh worker imports before its first request (set once they resolved).
        self.preload: list[str] = []
        self.proc: subprocess.Popen[str] | None = None
        self.starts = 0
        #: per start: seconds from spawning the process to its ``ready`` line, plus the ``load`` of ``preload``
        self.start_s: list[float] = []
        self._spawned = 0.0
        self._replies: queue.Queue[tuple[float, dict[str, Any] | None]] = queue.Queue()
        self._tail: collections.deque[str] = collections.deque(maxlen=200)
        self._err_thread: threading.Thread | None = None
        self._sent: collections.deque[float] = collections.deque()  # send times of the requests in flight
        self._last_arrival = 0.0
        self._unready = False  # spawned, its ready line not read yet
        #: per start: seconds the caller waited in :meth:`start` for a ready (and loaded) worker
        self.wait_s: list[float] = []
        #: a source of started workers for a restart (None, or a hook returning None: start one here)
        self.spares: Callable[[WorkerClient], WorkerClient | None] | None = None
        #: starts that adopted a worker from :attr:`spares`
        self.adopted = 0
        #: False: a worker that died is never replaced by this client (a spare: discarded instead)
        self.respawn = True
        self._benched = 0.0  # an adopted worker's wait for its first request, before it was adopted

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def in_flight(self) -> int:
        """Requests sent to the current worker whose replies were not collected yet."""
        return len(self._sent)

    def _environment(self) -> dict[str, str]:
        env = dict(os.environ)
        # The worker must import this checkout and whatever `module:Class` backends the parent can.
        paths = [str(_REPO), os.getcwd()] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        env["PYTHONUNBUFFERED"] = "1"
        pycache = bytecode_cache(env)
        if pycache is not None:
            env[PYCACHE_ENV] = pycache  # Python writes its bytecode there and nowhere else, so
            env.pop("PYTHONDONTWRITEBYTECODE", None)  # no source folder gets a __pycache__
        for key, value in self.env.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        return env

    def spawn(self) -> None:
        """Start a worker process without waiting for it; the next request (or :meth:`start`) waits for its
        ``ready`` line.  A pool spawns all of its workers at once, so their imports overlap."""
        if self._unready:
            return
        self.proc = subprocess.Popen(
            [self.python, "-m", "conformance.running.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            encoding="utf-8",
            errors="replace",
            bufsize=1,
            start_new_session=True,  # a terminal's Ctrl-C reaches the parent, which cleans up
            env=self._environment(),
        )
        self.starts += 1
        self._spawned = time.perf_counter()
        self._unready = True
        self._benched = 0.0
        replies: queue.Queue[tuple[float, dict[str, Any] | None]] = queue.Queue()
        tail: collections.deque[str] = collections.deque(maxlen=200)
        self._replies, self._tail = replies, tail
        self._sent.clear()
        threading.Thread(target=self._read_replies, args=(self.proc.stdout, replies, tail), daemon=True).start()
        self._err_thread = threading.Thread(target=self._read_stderr, args=(self.proc.stderr, tail), daemon=True)
        self._err_thread.start()

    def start(self) -> None:
        """Start a worker (or take the one :meth:`spawn` started, or, on a restart, one of :attr:`spares`) and
        wait for its ``ready`` line and its ``load``."""
        t0 = time.perf_counter()
        if not self._unready and self.starts and self.spares is not None:
            spare = self.spares(self)
            if spare is not None:
                self.adopt(spare)
                self.wait_s.append(time.perf_counter() - t0)
                return
        if not self._unready:
            self.spawn()
        assert self.proc is not None
        self._unready = False
        try:
            arrived, ready = self._replies.get(timeout=self.startup_timeout)
        except queue.Empty:
            arrived, ready = time.perf_counter(), None
        if not ready or ready.get("op") != "ready":
            self.kill()
            raise WorkerStartError(f"worker did not start: {_exit_text(self.proc.returncode)}\n{self.stderr_tail()}")
        self._last_arrival = time.perf_counter()
        startup = arrived - self._spawned
        if self.preload:
            reply = self.request({"op": "load", "backends": self.preload}, timeout=self.startup_timeout)
            if reply.kind != "ok" or not reply.data.get("ok"):
                self.kill()
                raise WorkerStartError(
                    f"worker could not load {self.preload}: {reply.reason or reply.data.get('errors')}"
                )
            startup += reply.wall_s
        self.start_s.append(startup)
        self.wait_s.append(time.perf_counter() - t0)

    def adopt(self, other: WorkerClient) -> None:
        """Take over ``other``'s started worker (ready, its backends loaded, nothing in flight) as this client's
        next one; ``other`` is left without a worker.  Counted as a start of this client (its start time is the
        one ``other`` measured)."""
        if self._sent or other._sent or other._unready or other.proc is None:
            raise RuntimeError("adopt(): both clients must be idle and the other's worker started")
        self.kill()  # the dead one this client had, if any
        self.proc, other.proc = other.proc, None
        self._replies, self._tail, self._err_thread = other._replies, other._tail, other._err_thread
        self._spawned, self._last_arrival = other._spawned, other._last_arrival
        self._benched = max(0.0, time.perf_counter() - other._last_arrival)
        self.starts += 1
        self.adopted += 1
        self.start_s.append(other.start_s[-1] if other.start_s else 0.0)

    @staticmethod
    def _read_replies(stream: IO[str], replies: queue.Queue, tail: collections.deque) -> None:
        for line in stream:
            try:
                replies.put((time.perf_counter(), json.loads(line)))
            except json.JSONDecodeError:
                tail.append("[not a protocol message] " + line.rstrip())
        replies.put((time.perf_counter(), None))  # EOF: the worker is gone

    @staticmethod
    def _read_stderr(stream: IO[str], tail: collections.deque) -> None:
        for line in stream:
            tail.append(line.rstrip("\n"))

    def stderr_tail(self, lines: int = 25) -> str:
        """The last lines the worker wrote to stderr (bounded, for a record's reason)."""
        text = "\n".join(list(self._tail)[-lines:])
        return text[-_TAIL_CHARS:] if text else "(worker stderr was empty)"

    def request(self, message: dict[str, Any], timeout: float) -> Reply:
        """Send one request; wait at most ``timeout`` seconds for its reply."""
        if self._sent:
            raise RuntimeError(f"request() with {len(self._sent)} pipelined requests in flight: collect() them first")
        self.submit(message)
        return self.collect(timeout)

    def submit(self, message: dict[str, Any]) -> None:
        """Send one request without waiting for its reply (:meth:`collect` returns replies in order).

        A worker is started when none is running and nothing is in flight.  With requests in flight a
        dead worker is not replaced here: their :meth:`collect` reports the crash first, and the caller
        resends what it still wants after :meth:`kill`.
        """
        if not self._sent and (self._unready or not self.alive):
            if not self.respawn and not self._unready and self.proc is not None:
                raise WorkerStartError(f"worker died before it was ready: {_exit_text(self.proc.poll())}")
            self.start()
        assert self.proc is not None and self.proc.stdin is not None
        self._sent.append(time.perf_counter())
        try:
            self.proc.stdin.write(json.dumps(message, allow_nan=True) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass  # the worker is dead (or its stdin closed); the reader thread reports EOF to collect()

    def collect(self, timeout: float) -> Reply:
        """The reply to the oldest request in flight, waiting until ``timeout`` seconds after the worker
        could start it (its send, or the previous reply's arrival when it was queued behind that one).

        ``wall_s`` of the reply is that wait: the time from when the worker could take the request up to
        when its reply arrived.  A crash or timeout kills the worker; the other requests in flight are
        dropped (:attr:`in_flight` becomes 0) and must be resent.
        """
        if not self._sent:
            raise RuntimeError("collect() with no request in flight")
        began = max(self._sent.popleft(), self._last_arrival)
        try:
            arrived, reply = self._replies.get(timeout=max(0.0, began + timeout - time.perf_counter()))
        except queue.Empty:
            self._dump_stacks()
            self.kill()
            return Reply(
                "timeout",
                reason=f"no reply within {timeout:g} s; worker killed\n{self.stderr_tail()}",
                wall_s=time.perf_counter() - began,
            )
        if reply is None:
            self._sent.clear()
            return Reply("crash", reason=f"{self._reap()}\n{self.stderr_tail()}", wall_s=arrived - began)
        self._last_arrival = arrived
        if self._benched:
            # an adopted worker waited for its first request before this client had it: not the run's idle time
            reply["idle_s"] = max(0.0, float(reply.get("idle_s", 0.0)) - self._benched)
            self._benched = 0.0
        return Reply("ok", data=reply, wall_s=arrived - began)

    def _dump_stacks(self) -> None:
        """Ask a hung worker for its Python stacks (faulthandler on SIGUSR1) before killing it."""
        if self.alive and hasattr(signal, "SIGUSR1"):
            assert self.proc is not None
            try:
                os.kill(self.proc.pid, signal.SIGUSR1)
                time.sleep(0.5)
            except OSError:
                pass

    def _reap(self) -> str:
        assert self.proc is not None
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()
        if self._err_thread is not None:
            self._err_thread.join(timeout=2)  # let the last stderr lines (faulthandler's) arrive
        return _exit_text(self.proc.returncode)

    def kill(self) -> None:
        """Kill the worker (and anything it started) without waiting for it to cooperate."""
        self._sent.clear()
        self._unready = False
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                self.proc.kill()
        self.proc.wait()
        if self._err_thread is not None:
            self._err_thread.join(timeout=2)

    def close_input(self) -> None:
        """Tell the worker to exit (stdin EOF) without waiting; :meth:`close` then waits.  Closing every
        worker of a pool this way first lets them exit together."""
        if self.proc is not None and self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except OSError:
                pass

    def close(self) -> None:
        """Ask the worker to exit (stdin EOF); kill it if it does not within a few seconds."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.close_input()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self.kill()
