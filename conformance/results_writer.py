"""Appending to a results file: the line format of every record and the writer that appends batches durably, in
the file's own format (plain JSON lines, or one complete gzip member per batch).  Reading it back:
:mod:`conformance.results_file`."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

from conformance.records import CheckResult, Header

__all__ = ["Appender", "append_record", "is_gzip", "record_line"]


_GZIP_MAGIC = b"\x1f\x8b"
#: zlib level of the gzip members a writer appends (6, zlib's default: level 9 takes twice the time for ~3% less)
_GZIP_LEVEL = 6


def is_gzip(path: Path | str) -> bool:
    """Whether ``path`` is (or, new or empty, will be) a gzipped results file: by content when it has any (it
    starts with 1f 8b), else by name (``*.gz``).  OSError when it exists but cannot be read."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            head = fh.read(2)
    except FileNotFoundError:
        return path.name.endswith(".gz")
    return head == _GZIP_MAGIC if head else path.name.endswith(".gz")


def record_line(record: CheckResult | Header) -> str:
    """One record as its JSON line (newline included): the line format of every results file.  Non-finite
    statistics are written as JSON's ``NaN`` / ``Infinity`` (``json.dumps``' default), never refused."""
    return json.dumps(record.to_json(), sort_keys=True) + "\n"


class Appender:
    """Appends records to a results file in the format it has, durably, batch by batch.

    Plain JSON lines stay plain; a gzipped file (by content: :func:`is_gzip`; a new or empty one named ``*.gz``)
    gets one complete gzip member per :meth:`sync` (gzip readers, Python's and ``zcat``, read the members as one
    stream), so after every sync the file is whole, and a writer killed mid-write leaves only a cut last line or
    gzip member, which the reader reports and ``--resume`` drops (:func:`conformance.running.outfile.repair_tail`).
    :meth:`write` buffers a record; :meth:`sync` writes the batch and flushes it to the operating system (a killed
    process loses nothing after it), and fsyncs it unless told not to (a crash of the machine loses nothing after
    that); :meth:`close` syncs.  One writer per file: :mod:`conformance.lock` keeps others out."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.gzip = is_gzip(self.path)
        self._fh = open(self.path, "ab")
        self._batch: list[str] = []

    def write(self, record: CheckResult | Header) -> None:
        self._batch.append(record_line(record))

    def sync(self, fsync: bool = True) -> None:
        if self._batch:
            data = "".join(self._batch).encode()  # UTF-8
            self._batch.clear()
            if self.gzip:
                data = gzip.compress(data, compresslevel=_GZIP_LEVEL, mtime=0)
            self._fh.write(data)
        self._fh.flush()
        if fsync:
            os.fsync(self._fh.fileno())

    def fileno(self) -> int:
        return self._fh.fileno()

    def close(self) -> None:
        if not self._fh.closed:
            try:
                self.sync()
            finally:
                self._fh.close()

    def __enter__(self) -> "Appender":
        return self

    def __exit__(self, kind: object, *exc: object) -> None:
        if kind is None:
            self.close()
            return
        try:  # an error is on its way out (a failed write, Ctrl-C): keep what can be kept, raise nothing new
            self.close()
        except OSError:
            pass


def append_record(path: Path | str, record: CheckResult | Header) -> None:
    """Append one record (a line, or a gzip member: :class:`Appender`) and fsync it (a crash after this loses
    nothing)."""
    with Appender(path) as out:
        out.write(record)


# --------------------------------------------------------------------------------------------- reading
