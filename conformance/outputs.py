"""Every file a command writes, written so that nothing is lost.

The contract, for every output of every subcommand (reports, summaries, merges, a run's ``--json``; the results
file a run appends to follows the same path rules, :mod:`conformance.running.outfile`):

* **Checked before any work** (:func:`check_output`): a path that names one of the command's own inputs (also
  through a symbolic link or a second hard link), or that exists and is not a regular file (a directory, a
  device node such as ``/dev/full``, a FIFO, a socket) is refused with one line (:class:`UsageError`, exit 2),
  root or not; a directory that cannot be created or written is an :class:`OutputError` (exit 3).
* **Written whole or not at all** (:func:`write_text`, :func:`write_bytes`): into a temporary file beside the
  target, flushed and fsync'ed, then renamed over it; a full disk or an I/O error removes the temporary file,
  leaves the path as it was and raises :class:`OutputError` (exit 3).
* **Never over a file the command did not write**: an existing file at the path is replaced only when it is an
  output of the same kind written by attnconf (it carries :func:`marker` for that kind; results files never
  do); anything else, a results file or a user's own file, first moves to the first free numbered backup
  (``NAME.1.EXT``, ``NAME.2.EXT``, ...: :func:`backup_path`, never overwritten), and the command says so on
  stderr.

Kinds and their markers: a text output's first line carries ``attnconf-output: KIND`` (an HTML comment in
Markdown and HTML, invisible when rendered); a JSON summary carries the key ``"attnconf_output": KIND``; a PNG
its ``Software`` text chunk.  :func:`is_own` reads them.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

from conformance.exits import OutputError, UsageError

__all__ = [
    "MARKER",
    "backup_path",
    "check_output",
    "is_own",
    "marker",
    "move_aside",
    "same_file",
    "write_bytes",
    "write_text",
]

#: The text every output of attnconf carries in its first line (text) or ``attnconf_output`` key (JSON).
MARKER = "attnconf-output"
#: How much of an existing file :func:`is_own` reads to find a text or PNG marker.
_HEAD = 4096
#: JSON summaries larger than this are not parsed to find their marker (they are backed up instead).
_JSON_MAX = 256 * 2**20


def marker(kind: str, syntax: str = "text") -> str:
    """The marker of an output of ``kind``: ``html`` gives an HTML comment (also right for Markdown), ``text`` the
    bare words; JSON outputs carry ``{"attnconf_output": kind}`` instead."""
    if syntax == "html":
        return f"<!-- {MARKER}: {kind} -->"
    return f"{MARKER}: {kind}"


def _what(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def same_file(a: Path | str, b: Path | str) -> bool:
    """Whether ``a`` and ``b`` name one file (one inode, through links too); a path that does not exist is the
    same as another only when both resolve to one name."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def check_output(
    path: Path | str, flag: str, inputs: Iterable[Path | str] = (), *, make_parent: bool = True
) -> Path:
    """Refuse ``path`` as the output ``flag`` before the command does any work; returns it as a :class:`Path`.

    :class:`UsageError` (exit 2) when it names one of ``inputs`` or exists as anything but a regular file;
    :class:`OutputError` (exit 3) when its directory cannot be created or is not writable, or the file itself is
    read-only.  ``make_parent``: create the directory (as the command would)."""
    path = Path(path)
    for source in inputs:
        if same_file(path, source):
            raise UsageError(f"{flag} {path}: is an input of this command ({source}); choose another path")
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:
        raise OutputError(f"{flag} {path}: cannot be examined: {exc.strerror or exc}") from None
    if mode is not None and not stat.S_ISREG(mode):
        raise UsageError(f"{flag} {path}: is {_what(mode)}, not a regular file; give a file path")
    parent = path.parent
    if make_parent:
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputError(f"{flag} {path}: cannot create its directory: {exc.strerror or exc}") from None
    if parent.exists() and not parent.is_dir():
        raise OutputError(f"{flag} {path}: {parent} is not a directory")
    if parent.exists() and not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(f"{flag} {path}: its directory {parent} is not writable")
    if mode is not None and not os.access(path, os.W_OK):
        raise OutputError(f"{flag} {path}: is read-only")
    return path


_JSON_KEY = re.compile(rb'"attnconf_output"\s*:\s*"([^"]*)"')


def is_own(path: Path | str, kind: str) -> bool:
    """Whether the file at ``path`` is an attnconf output of ``kind`` (it carries that kind's marker)."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            head = fh.read(_HEAD)
            if head.lstrip().startswith(b"{"):
                if path.stat().st_size > _JSON_MAX:
                    return False
                fh.seek(0)
                data = json.loads(fh.read().decode("utf-8"))
                return isinstance(data, dict) and data.get("attnconf_output") == kind
    except (OSError, ValueError):
        return False
    first = head.split(b"\n", 3)[:3]  # the marker sits in the first line, or after a doctype or PNG header
    want = marker(kind).encode()
    return any(want in line for line in first) or (head.startswith(b"\x89PNG") and want in head)


_NUMBERED = re.compile(r"\.(\d+)$")


def _split(name: str) -> tuple[str, str]:
    """(stem, suffix) with a compound ``.jsonl.gz`` / ``.md`` kept whole: ``r.jsonl.gz`` -> (``r``, ``.jsonl.gz``)."""
    for compound in (".jsonl.gz", ".json.gz", ".tar.gz"):
        if name.endswith(compound) and len(name) > len(compound):
            return name[: -len(compound)], compound
    stem, dot, ext = name.rpartition(".")
    return (stem, "." + ext) if dot and stem else (name, "")


def backup_path(path: Path | str) -> Path:
    """The first free numbered backup of ``path`` (``r.jsonl`` -> ``r.1.jsonl``, then ``r.2.jsonl``, ...; a
    ``.jsonl.gz`` keeps its double suffix): one past the highest number there, so a backup is never overwritten
    and the highest number is the newest."""
    path = Path(path)
    stem, suffix = _split(path.name)
    taken = [0]
    for p in path.parent.glob(f"{glob_escape(stem)}.*{glob_escape(suffix)}"):
        middle = p.name[len(stem) : len(p.name) - len(suffix)] if suffix else p.name[len(stem) :]
        m = _NUMBERED.fullmatch(middle) if middle.startswith(".") else None
        if m and p.name.startswith(stem) and (not suffix or p.name.endswith(suffix)):
            taken.append(int(m.group(1)))
    return path.with_name(f"{stem}.{max(taken) + 1}{suffix}")


def glob_escape(text: str) -> str:
    """``text`` with the glob metacharacters ``*?[`` escaped (a path named ``r[1].jsonl`` globs as itself)."""
    return re.sub(r"([*?\[])", r"[\1]", text)


def move_aside(path: Path | str, flag: str = "--out") -> Path:
    """Move the file at ``path`` to its first free numbered backup (:func:`backup_path`); returns the backup.
    ``os.link`` + unlink, so a backup that appeared meanwhile is never overwritten; :class:`OutputError` when
    the move fails."""
    path = Path(path)
    for _ in range(100):
        backup = backup_path(path)
        try:
            os.link(path, backup)
        except FileExistsError:
            continue  # another process took that number first
        except OSError as exc:
            if exc.errno in (errno.EPERM, errno.EXDEV, errno.ENOTSUP, errno.EMLINK):  # no hard links here
                if backup.exists():
                    continue
                try:
                    path.rename(backup)
                except OSError as exc2:
                    raise OutputError(f"{flag} {path}: cannot move it to {backup}: {exc2.strerror or exc2}") from None
                return backup
            raise OutputError(f"{flag} {path}: cannot move it to {backup}: {exc.strerror or exc}") from None
        try:
            path.unlink()
        except OSError as exc:
            raise OutputError(f"{flag} {path}: backed up to {backup} but cannot be removed: {exc.strerror}") from None
        return backup
    raise OutputError(f"{flag} {path}: no free numbered backup name found")


def write_bytes(path: Path | str, data: bytes, *, kind: str | None, flag: str = "--out", quiet: bool = False) -> Path:
    """Write ``data`` to ``path`` whole or not at all (see the module docstring); returns the path.

    ``kind``: the output kind whose marker ``data`` carries; an existing file is replaced only when it carries the
    same one (None: any existing file is backed up first).  The backup is said on stderr unless ``quiet``."""
    path = Path(path)
    check_output(path, flag)
    tmp_fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        try:
            with os.fdopen(tmp_fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp_name, 0o666 & ~_umask())
        except OSError as exc:
            raise OutputError(f"{flag} {path}: cannot write: {exc.strerror or exc}") from None
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            mode = None
        except OSError as exc:
            raise OutputError(f"{flag} {path}: cannot be examined: {exc.strerror or exc}") from None
        if mode is not None and not stat.S_ISREG(mode):  # appeared since check_output: never replace a device
            raise UsageError(f"{flag} {path}: is {_what(mode)}, not a regular file; give a file path")
        if mode is not None and not (kind is not None and is_own(path, kind)):
            backup = move_aside(path, flag)
            if not quiet:
                print(f"attnconf: {flag} {path} held a file this command did not write; kept it as {backup}",
                      file=sys.stderr)
        try:
            os.replace(tmp_name, path)
        except OSError as exc:
            raise OutputError(f"{flag} {path}: cannot write: {exc.strerror or exc}") from None
        tmp_name = ""
    finally:
        if tmp_name:
            try:
                os.unlink(tmp_name)
            except OSError:
                pass
    return path


def write_text(path: Path | str, text: str, *, kind: str | None, flag: str = "--out", quiet: bool = False) -> Path:
    """:func:`write_bytes` of ``text`` in UTF-8."""
    return write_bytes(path, text.encode("utf-8"), kind=kind, flag=flag, quiet=quiet)


def _umask() -> int:
    """The process's umask, read without changing it (``os.umask`` would, for every thread, for a moment)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022
