"""One writer per results file: an exclusive lock on its path, held for the whole command.

``attnconf run`` (fresh or ``--resume``), ``attnconf fuzz`` (its campaign file) and ``attnconf merge`` (its
``--out``, while it writes) hold :func:`hold` on the file they write; a second command on the same path refuses
at once, before it reads, repairs, moves or writes anything, with one line naming the file and the holder's pid
(:class:`~conformance.exits.UsageError`, exit 2).  Readers (report, compare, ``ledger audit``) take no lock.

How: ``fcntl.flock(LOCK_EX | LOCK_NB)`` on a sidecar file ``.NAME.lock`` beside the results file (``NAME`` its
name, in its real directory: symbolic links are resolved), which holds the holder's pid, host and start time.
The lock is on the sidecar, that is on the path, not on the results file's inode, so it stays valid when an
existing file is renamed to its numbered backup or a merge replaces the file atomically.  The kernel drops it
when the holder's process ends, however it ends: a SIGKILLed run leaves its sidecar behind, unlocked, and the
next command simply takes it (the pid in it is then stale, and overwritten).

The sidecar is removed on release (a finished command leaves no ``.lock`` file), by the safe-unlink pattern: the
holder unlinks it while it still holds the lock; a command that opened the old sidecar meanwhile checks, once it
holds the lock, that its inode is still the one at the path, and starts over otherwise, so two commands never
hold two locks of one path.  Deleting the sidecar of a running command by hand defeats the lock: don't.

Scope: POSIX systems with ``fcntl`` (Linux, macOS).  Windows is not supported: :func:`hold` refuses there.  On
NFS, Linux emulates flock with POSIX byte-range locks, which hold across clients (NFSv4); other network file
systems may not lock at all.  Two names of one file (a hard link) are two paths and two locks.
"""

from __future__ import annotations

import datetime as _dt
import os
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from conformance.exits import OutputError, UsageError

if sys.platform == "win32":  # no fcntl: hold() refuses
    fcntl = None
else:
    import fcntl

__all__ = ["hold", "sidecar"]


def sidecar(path: Path | str) -> Path:
    """The lock file of the results file ``path``: ``.NAME.lock`` in its real directory."""
    real = Path(os.path.realpath(path))
    return real.with_name(f".{real.name}.lock")


def _holder(fd: int) -> str:
    try:
        text = os.pread(fd, 1024, 0).decode("utf-8", "replace").strip()
    except OSError:
        text = ""
    return text or "pid unknown: it is starting"


def _same(fd: int, lock: Path) -> bool:
    try:
        mine, there = os.fstat(fd), os.stat(lock)
    except OSError:
        return False
    return (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino)


def _acquire(path: Path, lock: Path, flag: str) -> int:
    if fcntl is None:
        raise UsageError(
            f"{flag} {path}: results files are locked with fcntl, which this system lacks (Windows is not supported)"
        )
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"{flag} {path}: cannot create its directory: {exc.strerror or exc}") from None
    for _ in range(100):
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise OutputError(f"{flag} {path}: cannot create its lock file {lock}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise UsageError(
                f"{flag} {path}: in use by another attnconf command ({holder}; lock {lock}); wait for it to end or "
                f"choose another {flag}"
            ) from None
        except OSError as exc:
            os.close(fd)
            raise OutputError(f"{flag} {path}: cannot lock {lock}: {exc.strerror or exc}") from None
        if _same(fd, lock):
            since = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
            info = f"pid {os.getpid()} on {socket.gethostname()} since {since}\n".encode()
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, info, 0)
            except OSError:
                pass  # the pid is a courtesy to the next command; the lock holds without it
            return fd
        os.close(fd)  # released and removed (or replaced) between our open and our lock: start over
    raise OutputError(f"{flag} {path}: cannot take its lock {lock} (it keeps being replaced)")


@contextmanager
def hold(path: Path | str, flag: str = "--out") -> Iterator[Path]:
    """Hold the exclusive lock of the results file ``path`` (see the module docstring) for the ``with`` block;
    yields the sidecar's path.  :class:`UsageError` (exit 2) when another command holds it, naming the holder's
    pid; :class:`OutputError` (exit 3) when the sidecar cannot be created (a read-only directory) or locked."""
    path = Path(path)
    lock = sidecar(path)
    fd = _acquire(path, lock, flag)
    try:
        yield lock
    finally:
        try:
            if _same(fd, lock):
                os.unlink(lock)  # while still locked: see the module docstring
        except OSError:
            pass
        finally:
            os.close(fd)
