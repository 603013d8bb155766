"""Spare workers: a slot of the pool whose worker crashed, hung or was replaced takes one already started.

A worker's start costs seconds (Python, torch, the checker, the ``load`` of its backends), and a run with crashing
kernels restarts many (``default`` on six kernels on one H100: 76 restarts of ~5 s).  :class:`Spares` keeps
``per_placement`` workers started and loaded in the background for each *placement*: the environment, backends,
interpreter and start-up deadline of the slot that asked (a spare has the ``CUDA_VISIBLE_DEVICES``,
``OMP_NUM_THREADS``, ... of the slot it replaces, so it is interchangeable with the worker the slot would start).

Lazy: nothing starts until a slot needs a *new* worker (its first start is its own: runs without a restart pay
nothing).  Then :meth:`Spares.take` (a :class:`~conformance.running.worker_client.WorkerClient`'s ``spares`` hook)
fills that placement up to ``per_placement`` spares, hands the slot a ready one (else the one that started
first, once it is ready: never later than a fresh start), and starts its replacement at once.  A spare that died
while it waited, or could not start, is discarded (the next one is tried; with none, or after ``per_placement + 1``
spares that could not start in one take, the slot starts its own, as without spares, and a worker that cannot
start is reported as before: a machine where no worker starts never loops on spares).  ``per_placement`` 0: no spares.

Alone: :meth:`Spares.drain` kills every spare and keeps none from then on (a later take returns None: the slot
starts its own).  The runner drains before its CUDA OOM retry phase, whose workers must each be alone on their
GPU: a spare holds a CUDA context and allocator cache there as any worker does.

Shutdown: :meth:`Spares.close` kills every spare, waiting or starting, and refuses any later take (a slot then
starts no worker either: the run is ending); the runner calls it at the end of a run, on Ctrl-C and on errors.
A spare started by a killed parent exits within a second (the worker's parent watchdog, stdin's EOF).  Spares
never respawn themselves (``respawn`` off): one that dies during its ``load`` is discarded, not restarted.

Counts (:meth:`Spares.stats`, the profile's ``spares``): started, taken, discarded, unused (killed at the end).
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from conformance.running.worker_client import WorkerClient, WorkerStartError

__all__ = ["DEFAULT_SPARES", "MAX_SPARES", "Spares", "spares_for"]

#: Spares per placement by default (``--spare-workers auto``, 0 with ``--time``): see docs/concepts/performance.md.
DEFAULT_SPARES = 2
#: The most ``--spare-workers`` takes: each spare is a process holding torch.
MAX_SPARES = 16


def spares_for(given: int | None, timed: bool) -> int:
    """Spares per placement for ``--spare-workers``: ``given``, else (auto) :data:`DEFAULT_SPARES`, or 0 with
    ``--time`` (a spare's start-up would share the CPU with the kernels being timed)."""
    if given is not None:
        return given
    return 0 if timed else DEFAULT_SPARES


@dataclass(eq=False)
class _Spare:
    client: WorkerClient
    #: set when its start ended, ``ok`` or not
    done: threading.Event = field(default_factory=threading.Event)
    ok: bool = False


def _placement(client: WorkerClient) -> Hashable:
    env = tuple(sorted(client.env.items(), key=lambda kv: kv[0]))
    return client.python, env, tuple(client.preload), client.startup_timeout


class Spares:
    """Started, loaded workers waiting for a slot, per placement; thread-safe (see the module docstring)."""

    def __init__(self, per_placement: int, factory: Callable[..., WorkerClient] = WorkerClient) -> None:
        self.per_placement = per_placement
        self._factory = factory  # makes a client as WorkerClient(startup_timeout=, python=, env=) does
        self._lock = threading.Lock()
        self._waiting: dict[Hashable, collections.deque[_Spare]] = {}
        self._picked: set[_Spare] = set()  # taken off a queue, its start still awaited by a slot
        self._threads: list[threading.Thread] = []
        self._closed = False
        self._drained = False
        self.started = 0
        self.taken = 0
        self.discarded = 0
        self.unused = 0

    @property
    def closed(self) -> bool:
        return self._closed

    def _fill(self, key: Hashable, like: WorkerClient) -> None:
        """Start spares of ``like``'s placement until it has ``per_placement`` (the lock held)."""
        queue = self._waiting.setdefault(key, collections.deque())
        self._threads = [t for t in self._threads if t.is_alive()]
        while len(queue) < self.per_placement and not self._closed:
            client = self._factory(startup_timeout=like.startup_timeout, python=like.python, env=like.env)
            client.preload = list(like.preload)
            client.respawn = False
            client.spawn()  # the process starts now, under the lock: close() cannot miss it
            spare = _Spare(client)
            self.started += 1
            queue.append(spare)
            thread = threading.Thread(target=self._start, args=(spare,), name="attnconf-spare", daemon=True)
            self._threads.append(thread)
            thread.start()

    @staticmethod
    def _start(spare: _Spare) -> None:
        try:
            spare.client.start()  # its ready line, then the load of its backends
            spare.ok = True
        except BaseException:  # noqa: BLE001 - a spare that cannot start is discarded by take()
            spare.client.kill()
        finally:
            spare.done.set()

    def take(self, slot: WorkerClient) -> WorkerClient | None:
        """A started worker of ``slot``'s placement (its ``load`` done), or None (no spares: the slot starts
        its own); a replacement spare is started.  :class:`WorkerStartError` once :meth:`close` ran."""
        if self.per_placement <= 0:
            return None
        key = _placement(slot)
        failed = 0
        while True:
            with self._lock:
                if self._closed:
                    raise WorkerStartError("the run is ending: no new worker")
                if self._drained:
                    return None
                queue = self._waiting.setdefault(key, collections.deque())
                dead = [s for s in queue if s.done.is_set() and not (s.ok and s.client.alive)]
                for s in dead:
                    queue.remove(s)
                self._fill(key, slot)
                ready = [s for s in queue if s.done.is_set()]
                pick = ready[0] if ready else (queue[0] if queue else None)
                if pick is None:
                    return None
                queue.remove(pick)
                self._picked.add(pick)
                self.discarded += len(dead)
                self._fill(key, slot)  # its replacement starts now
            for s in dead:
                s.client.kill()
            pick.done.wait()
            with self._lock:
                self._picked.discard(pick)
                if self._closed:
                    pick.client.kill()
                    raise WorkerStartError("the run is ending: no new worker")
                if pick.ok and pick.client.alive:
                    self.taken += 1
                    return pick.client
                self.discarded += 1
            pick.client.kill()
            failed += 1
            if failed > self.per_placement:  # no spare of this placement starts: the slot's own start says why
                return None

    def drain(self) -> None:
        """Kill every spare and keep none from now on (later takes return None: the slot starts its own
        worker); unlike :meth:`close`, the run goes on.  Meant for a moment with no take in flight (between the
        runner's phases): a take awaiting a spare then finds it dead and returns None.  :meth:`stats` still gives
        the ``per_placement`` asked for."""
        self._stop(close=False)

    def close(self) -> None:
        """Kill every spare (waiting, starting or awaited by a slot); later takes raise.  Idempotent."""
        self._stop(close=True)

    def _stop(self, *, close: bool) -> None:
        """Kill every spare, waiting, starting or awaited by a slot, and mark the pool closed (``close``) or
        drained; waits up to 10 s for the start threads."""
        with self._lock:
            if close:
                self._closed = True
            else:
                self._drained = True
            left = [s for q in self._waiting.values() for s in q]
            self._waiting.clear()
            self.unused += len(left)
            doomed = left + list(self._picked)
            threads, self._threads = self._threads, []
        for spare in doomed:
            spare.client.kill()
        deadline = time.monotonic() + 10
        for thread in threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))

    def stats(self) -> dict[str, int]:
        """For the profile: spares per placement, and how many were started, taken, discarded, left unused."""
        return {
            "per_placement": self.per_placement,
            "started": self.started,
            "taken": self.taken,
            "discarded": self.discarded,
            "unused": self.unused,
        }
