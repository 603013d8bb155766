"""Every file a command writes, written so that nothing is lost.

The contract, for every output of every subcommand (reports, summaries, merges, a run's ``--json``; the results
file a run appends to follows the same path rules, :mod:`conformance.running.outfile`):

* **Checked before any work** (:func:`check_output`, :func:`check_outputs`): a path that names one of the
  command's own inputs (also through a symbolic link or a second hard link), another output of the same command,
  or that exists and is not a regular file (a directory, a device node such as ``/dev/full``, a FIFO, a socket)
  is refused with one line (:class:`UsageError`, exit 2), root or not; a directory that cannot be created or
  written (a file is created and removed there to be sure, so root is told too), or a read-only file, is an
  :class:`OutputError` (exit 3).
* **Written whole or not at all** (:func:`write_text`, :func:`write_bytes`, :func:`write_many`): into a
  temporary file beside the target, flushed and fsync'ed, then renamed over it; a full disk or an I/O error
  removes the temporary file, leaves the path as it was and raises :class:`OutputError` (exit 3).
  :func:`write_many` writes every temporary file of a command's outputs before it renames any, so a full disk
  leaves none of them changed.
* **Never over a file the command did not write**: an existing file at the path is replaced only when it is an
  output of the same kind written by attnconf (it carries :func:`marker` for that kind; results files never
  do, and a symbolic link never counts as one); anything else, a results file or a user's own file, first moves
  to the first free numbered backup (``NAME.1.EXT``, ``NAME.2.EXT``, ...: :func:`backup_path`, never
  overwritten), and the command says so on stderr.

Kinds and their markers: a text output has a line that is exactly ``<!-- attnconf-output: KIND -->`` among its
first three (:func:`with_marker` puts it first; HTML puts it right after the doctype), invisible when rendered;
a JSON summary carries the top-level key ``"attnconf_output": KIND``; a PNG a ``tEXt`` chunk ``Software`` =
``attnconf-output: KIND`` before its image data.  :func:`is_own` reads them.
"""

from __future__ import annotations

import errno
import glob
import json
import os
import re
import stat
import struct
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Union

from conformance.exits import OutputError, UsageError

__all__ = [
    "MARKER",
    "Output",
    "backup_path",
    "check_output",
    "check_outputs",
    "is_own",
    "marker",
    "move_aside",
    "same_file",
    "with_marker",
    "write_bytes",
    "write_many",
    "write_text",
]

#: The text every output of attnconf carries in its first lines (text), ``attnconf_output`` key (JSON) or
#: ``Software`` chunk (PNG).
MARKER = "attnconf-output"
#: How much of an existing file :func:`is_own` reads to find a text or PNG marker.
_HEAD = 4096
#: JSON summaries larger than this are not parsed to find their marker (they are backed up instead).
_JSON_MAX = 256 * 2**20
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def marker(kind: str, syntax: str = "text") -> str:
    """The marker of an output of ``kind``: ``html`` gives an HTML comment (also right for Markdown), ``text`` the
    bare words (a PNG's ``Software`` chunk); JSON outputs carry ``{"attnconf_output": kind}`` instead.
    :class:`ValueError` for any other ``syntax``."""
    if syntax == "html":
        return f"<!-- {MARKER}: {kind} -->"
    if syntax == "text":
        return f"{MARKER}: {kind}"
    raise ValueError(f"marker syntax {syntax!r}: not 'html' or 'text'")


def with_marker(text: str, kind: str) -> str:
    """``text`` (Markdown) with the marker of ``kind`` as its first line (an HTML comment: invisible rendered)."""
    return f"{marker(kind, 'html')}\n{text}"


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


def _refuse_special(path: Path, flag: str) -> int | None:
    """The mode of what ``path`` names (through links), None when nothing; :class:`UsageError` for anything but
    a regular file."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ENOTDIR:
            raise UsageError(f"{flag} {path}: cannot create its directory: a part of the path is a file") from None
        if exc.errno == errno.ELOOP:
            raise UsageError(f"{flag} {path}: too many levels of symbolic links") from None
        raise OutputError(f"{flag} {path}: cannot be examined: {exc.strerror or exc}") from None
    if not stat.S_ISREG(mode):
        raise UsageError(f"{flag} {path}: is {_what(mode)}, not a regular file; give a file path")
    return mode


def _probe(parent: Path, path: Path, flag: str) -> None:
    """Create and remove a file in ``parent``: the one test of writability that holds for root too."""
    try:
        fd, name = tempfile.mkstemp(prefix=".attnconf-probe.", dir=parent)
    except OSError as exc:
        raise OutputError(f"{flag} {path}: its directory {parent} is not writable ({exc.strerror or exc})") from None
    os.close(fd)
    try:
        os.unlink(name)
    except OSError:
        pass


def check_output(path: Path | str, flag: str, inputs: Iterable[Path | str] = (), *, make_parent: bool = True) -> Path:
    """Refuse ``path`` as the output ``flag`` before the command does any work; returns it as a :class:`Path`.

    :class:`UsageError` (exit 2) when it names one of ``inputs`` or exists as anything but a regular file;
    :class:`OutputError` (exit 3) when its directory cannot be created or is not writable, or the file itself is
    read-only.  ``make_parent``: create the directory (as the command would)."""
    path = Path(path)
    if path.name in ("", ".."):  # pathlib never leaves "." as a name ("x/." is "x", "." has none)
        raise UsageError(f"{flag} {path}: names a directory, not a file; give a file path")
    for source in inputs:
        if same_file(path, source):
            raise UsageError(f"{flag} {path}: is an input of this command ({source}); choose another path")
    mode = _refuse_special(path, flag)
    parent = path.parent
    if make_parent:
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):  # a link to nothing (a file is refused by the stat above)
            raise UsageError(
                f"{flag} {path}: cannot create its directory: a part of the path is a file or a link to nothing"
            ) from None
        except OSError as exc:
            raise OutputError(f"{flag} {path}: cannot create its directory: {exc.strerror or exc}") from None
    if parent.exists():  # a file there was refused by the stat above (ENOTDIR)
        if not os.access(parent, os.W_OK | os.X_OK):
            raise OutputError(f"{flag} {path}: its directory {parent} is not writable")
        _probe(parent, path, flag)
    if mode is not None and not os.access(path, os.W_OK):
        raise OutputError(f"{flag} {path}: is read-only")
    return path


def check_outputs(
    outputs: Sequence[tuple[Path | str | None, str]], inputs: Iterable[Path | str] = ()
) -> list[Path | None]:
    """:func:`check_output` of every ``(path, flag)`` (None, or ``-`` for stdout, is skipped), and a
    :class:`UsageError` when two of them name one file; the paths, in order."""
    inputs = list(inputs)
    checked: list[tuple[Path, str]] = []
    paths: list[Path | None] = []
    for path, flag in outputs:
        if path is None or str(path) == "-":
            paths.append(None)
            continue
        p = check_output(path, flag, inputs)
        for other, other_flag in checked:
            if same_file(p, other):
                raise UsageError(f"{flag} {p}: is also {other_flag} ({other}); give each output its own path")
        checked.append((p, flag))
        paths.append(p)
    return paths


_JSON_KEY = "attnconf_output"


def _png_software(head: bytes) -> list[bytes]:
    """The ``Software`` ``tEXt`` values of a PNG's chunks before its image data (within ``head``)."""
    found = []
    pos = len(_PNG_SIGNATURE)
    # no mutate: exactly 8 bytes left is a header without data, which adds nothing, so `+ 9` or `<` read the same
    while pos + 8 <= len(head):  # pragma: no mutate
        length, ctype = struct.unpack(">I4s", head[pos : pos + 8])
        if ctype in (b"IDAT", b"IEND"):
            break
        data = head[pos + 8 : pos + 8 + length]
        if ctype == b"tEXt" and len(data) == length:
            # no mutate: a marker has no NUL, so only data with one NUL can match, where rpartition is the same
            key, _, value = data.partition(b"\x00")  # pragma: no mutate
            if key == b"Software":
                found.append(value)
        pos += 12 + length
    return found


def is_own(path: Path | str, kind: str) -> bool:
    """Whether the file at ``path`` is an attnconf output of ``kind`` (it carries that kind's marker); a symbolic
    link never is."""
    path = Path(path)
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return False
        with open(path, "rb") as fh:
            head = fh.read(_HEAD)
            if head.lstrip().startswith(b"{"):
                size = os.fstat(fh.fileno()).st_size
                first, _, rest = head.partition(b"\n")
                try:  # one object per line (a results file's header, say): decided by its first line
                    # no mutate: "UTF-8" names the same codec as "utf-8"
                    line = json.loads(first.decode("utf-8"))  # pragma: no mutate
                except ValueError:
                    # no mutate: any non-dict ("" as much as None) sends the file to the whole parse below
                    line = None  # pragma: no mutate
                if isinstance(line, dict):
                    return line.get(_JSON_KEY) == kind and size <= len(head) and not rest.strip()
                if size > _JSON_MAX:
                    return False
                fh.seek(0)
                # no mutate: "UTF-8" names the same codec as "utf-8"
                data = json.loads(fh.read().decode("utf-8"))  # pragma: no mutate
                return isinstance(data, dict) and data.get(_JSON_KEY) == kind
    except (OSError, ValueError):
        return False
    if head.startswith(_PNG_SIGNATURE):
        return marker(kind).encode() in _png_software(head)
    want = marker(kind, "html").encode()
    # no mutate: the first three lines are the same whatever the maxsplit beyond 2 (none, 3, 4)
    return any(line.strip() == want for line in head.split(b"\n", 3)[:3])  # pragma: no mutate


_NUMBERED = re.compile(r"\.([0-9]+)")
#: Suffixes a backup keeps whole: ``r.jsonl.gz`` -> ``r.1.jsonl.gz``.
_COMPOUND = (".jsonl.gz", ".json.gz", ".tar.gz")


def _split(name: str) -> tuple[str, str]:
    """(stem, suffix) with a compound ``.jsonl.gz`` kept whole: ``r.jsonl.gz`` -> (``r``, ``.jsonl.gz``)."""
    for compound in _COMPOUND:
        if name.endswith(compound) and len(name) > len(compound):
            return name[: -len(compound)], compound
    stem, dot, ext = name.rpartition(".")
    return (stem, "." + ext) if dot and stem else (name, "")


def backup_path(path: Path | str) -> Path:
    """The first free numbered backup of ``path`` (``r.jsonl`` -> ``r.1.jsonl``, then ``r.2.jsonl``, ...; a
    ``.jsonl.gz`` keeps its double suffix: ``r.1.jsonl.gz``): one past the highest number there, so a backup is
    never overwritten and the highest number is the newest.  Glob metacharacters in the name are literal."""
    path = Path(path)
    stem, suffix = _split(path.name)
    taken = [0]
    for p in path.parent.glob(f"{glob.escape(stem)}.*{glob.escape(suffix)}"):
        name = p.name
        if not (name.startswith(stem) and name.endswith(suffix)) or (
            # no mutate: a name no longer than stem + suffix leaves an empty middle, which never matches _NUMBERED
            len(name) <= len(stem) + len(suffix)  # pragma: no mutate
        ):
            continue
        m = _NUMBERED.fullmatch(name[len(stem) : len(name) - len(suffix)])
        if m:
            taken.append(int(m.group(1)))
    return path.with_name(f"{stem}.{max(taken) + 1}{suffix}")


def move_aside(path: Path | str, flag: str = "--out") -> Path:
    """Move what is at ``path`` (a file, or a symbolic link itself) to its first free numbered backup
    (:func:`backup_path`); returns the backup.  ``os.link`` + unlink, so a backup that appeared meanwhile is
    never overwritten; :class:`UsageError` when ``path`` is a directory, device, FIFO or socket (never moved),
    :class:`OutputError` when the move fails."""
    path = Path(path)
    try:
        mode = os.lstat(path).st_mode
    except OSError as exc:
        raise OutputError(f"{flag} {path}: cannot be examined: {exc.strerror or exc}") from None
    if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
        raise UsageError(f"{flag} {path}: is {_what(mode)}, not a regular file; give a file path")
    for _ in range(100):
        backup = backup_path(path)
        try:
            # no mutate: None is False here, and Linux's link(2) (follow_symlinks=True) never follows a link either
            os.link(path, backup, follow_symlinks=False)  # pragma: no mutate
        except FileExistsError:
            continue  # another process took that number first
        except OSError as exc:
            if exc.errno in (errno.EPERM, errno.EXDEV, errno.ENOTSUP, errno.EMLINK):  # no hard links here
                if os.path.lexists(backup):
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


#: What an :class:`Output` holds: the bytes, or a function that writes them to a binary file (streamed).
Data = Union[bytes, Callable[[BinaryIO], None]]


@dataclass(frozen=True)
class Output:
    """One file a command writes: its ``path``, its ``data``, its ``kind`` (None: never replaced, any existing
    file is backed up: results files) and the ``flag`` that named it (for messages)."""

    path: Path
    data: Data
    kind: str | None
    flag: str = "--out"


def _write_temp(out: Output) -> str:
    """``out``'s data in a fsync'ed temporary file beside its path; the temporary file's name."""
    path = Path(out.path)
    try:
        fd, name = tempfile.mkstemp(prefix=f".{path.name[:80]}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise OutputError(f"{out.flag} {path}: cannot write: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            if callable(out.data):
                out.data(fh)
            else:
                fh.write(out.data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(name, 0o666 & ~_umask())
    except OSError as exc:
        _unlink(name)
        raise OutputError(f"{out.flag} {path}: cannot write: {exc.strerror or exc}") from None
    except BaseException:
        _unlink(name)
        raise
    return name


def _commit(out: Output, tmp: str, quiet: bool) -> None:
    """Rename ``tmp`` over ``out.path``, first moving a file that is not ``out``'s own kind to a backup."""
    path = Path(out.path)
    _refuse_special(path, out.flag)  # appeared since check_output: never replace a device
    if os.path.lexists(path) and not (out.kind is not None and is_own(path, out.kind)):
        backup = move_aside(path, out.flag)
        if not quiet:
            print(
                f"attnconf: {out.flag} {path} held a file this command does not replace; kept it as {backup}",
                file=sys.stderr,
            )
    try:
        os.replace(tmp, path)
    except OSError as exc:
        raise OutputError(f"{out.flag} {path}: cannot write: {exc.strerror or exc}") from None
    try:  # the rename itself durable too (best effort: not every file system lets a directory be fsync'ed)
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


def write_many(outputs: Sequence[Output], *, quiet: bool = False) -> list[Path]:
    """Write every output whole or not at all (see the module docstring): each is checked
    (:func:`check_output`), every temporary file is written and fsync'ed, and only then is each renamed into
    place (an existing file that is not that output's own kind first moved to a numbered backup, said on stderr
    unless ``quiet``).  A failure while writing leaves every path as it was; returns the paths."""
    for out in outputs:
        check_output(out.path, out.flag)
    temps: list[str] = []
    committed = 0  # temporary files renamed into place: the rest are removed on a failure
    try:
        for out in outputs:
            temps.append(_write_temp(out))
        for out, tmp in zip(outputs, temps):
            _commit(out, tmp, quiet)
            committed += 1
    finally:
        for name in temps[committed:]:
            _unlink(name)
    return [Path(out.path) for out in outputs]


def write_bytes(path: Path | str, data: Data, *, kind: str | None, flag: str = "--out", quiet: bool = False) -> Path:
    """Write ``data`` to ``path`` whole or not at all (see the module docstring); returns the path.

    ``kind``: the output kind whose marker ``data`` carries; an existing file is replaced only when it carries the
    same one (None: any existing file is backed up first).  The backup is said on stderr unless ``quiet``."""
    return write_many([Output(Path(path), data, kind, flag)], quiet=quiet)[0]


def write_text(path: Path | str, text: str, *, kind: str | None, flag: str = "--out", quiet: bool = False) -> Path:
    """:func:`write_bytes` of ``text`` in UTF-8."""
    # no mutate: "UTF-8" names the same codec as "utf-8"
    data = text.encode("utf-8")  # pragma: no mutate
    return write_bytes(path, data, kind=kind, flag=flag, quiet=quiet)


def _unlink(name: str) -> None:
    try:
        os.unlink(name)
    except OSError:
        pass


#: Where Linux (4.7 and later) states a process's umask, on a ``Umask:`` line.
_STATUS = "/proc/self/status"


def _umask() -> int:
    """The process's umask, read from :data:`_STATUS` without changing it (``os.umask`` would, for every thread,
    for a moment); 0o022, the usual one, where that file does not state it.  Read as bytes: the file's ``Name:``
    line is the process name, which may be any bytes, not ASCII text."""
    try:
        with open(_STATUS, "rb") as fh:
            for line in fh:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022
