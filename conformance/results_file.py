"""The results file: its JSON-lines form and how it is read (how it is appended to: :mod:`conformance.results_writer`).

A results file is JSON lines: one ``header`` record (environment, suite, backends), then one
``result`` record per (case, backend), appended as soon as it is known; a resumed file has one more header per
resume, and never a (case, backend) pair twice (:func:`record_key`).  Every record carries
``schema``; readers ignore keys they do not know and fill missing ones with defaults, so files
written by older and newer versions stay readable.  A gzipped file (by content: it starts with 1f 8b) is read
member by member, and writers append one complete gzip member per fsync'ed batch (:class:`Appender`).

Two readers: :func:`load_results` is strict (a missing, unreadable or empty file, lines that are not records
unless allowed, a pair recorded twice unless dropped, raise :class:`ResultsFileError` naming the file and the
reason; skipped lines are kept with their numbers) and serves whatever decides from a file (compare, report,
merge, ``ledger audit``, ``--resume``); :func:`read_records` skips what it cannot read without a word.  Both read
line by line and refuse a line longer than :data:`MAX_LINE` (a file without newlines) instead of filling memory.

Size: one format's two readers, which share the bounded line reader, its gzip member walk and its messages.
"""

from __future__ import annotations

import dataclasses
import json
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conformance.results_writer import _GZIP_MAGIC
from conformance.records import SCHEMA, CheckResult, Header

__all__ = [
    "ResultsFile",
    "ResultsFileError",
    "SkippedLine",
    "load_results",
    "read_records",
    "refuse_duplicates",
    "scan_results",
    "record_key",
    "MAX_LINE",
]


def read_records(path: Path | str) -> tuple[list[Header], list[CheckResult]]:
    """Every header and result of a results file (gzip too), lenient: a line that is not a record (a truncated
    last line of a killed writer, say) is skipped without a word, and a pair recorded twice stays twice.  Readers
    that decide something from a file (compare, report, merge, a gate, ``--resume``) use :func:`load_results`,
    which counts and names what it skipped and refuses duplicates.  :class:`ResultsFileError` for a line longer
    than :data:`MAX_LINE` or corrupt gzip data."""
    scanned = scan_results(Path(path))
    return list(scanned.headers), list(scanned.results)


class ResultsFileError(ValueError):
    """A results file that cannot be used; ``str()`` is one line naming the file and the reason."""

    def __init__(self, path: Path | str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = str(path)
        self.reason = reason


@dataclass(frozen=True)
class SkippedLine:
    """A non-blank line of a results file that is not a record this version can read."""

    line: int  # 1-based
    reason: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.reason}"


def record_key(r: CheckResult) -> tuple[str, str] | None:
    """The (case id, backend) pair a record judges, which one results file holds once; None for a fuzz campaign's
    records (``extra["fuzz"]``): several failures shrink to one minimal case, so a campaign repeats pairs by
    design (:mod:`conformance.fuzz.persist`)."""
    if isinstance(r.extra, dict) and "fuzz" in r.extra:
        return None
    return (r.case_id, r.backend)


@dataclass(frozen=True)
class ResultsFile:
    """What :func:`load_results` read: the records, and every line it skipped (with its line number)."""

    path: Path
    headers: tuple[Header, ...]
    results: tuple[CheckResult, ...]
    skipped: tuple[SkippedLine, ...] = ()
    #: records of a ``type`` this version does not know (a newer writer's): ignored, as the format promises
    other_records: int = 0
    #: the line of each of :attr:`results`, and the index in :attr:`headers` of the header it follows (-1: none)
    result_lines: tuple[int, ...] = ()
    result_headers: tuple[int, ...] = ()
    #: the newest ``schema`` a record states (0: none does); above :data:`SCHEMA`, a newer attnconf wrote it
    schema: int = 0
    #: the file is gzipped (by content)
    gzip: bool = False
    #: bytes of the file up to the end of its last complete line (plain) or gzip member: what ``--resume`` keeps
    keep: int = 0
    #: the last of :attr:`skipped` is a killed writer's cut tail (a last line without its newline that is not
    #: JSON, or a cut last gzip member) that cutting the file to :attr:`keep` removes
    cut_tail: bool = False
    #: the kept content does not end with a newline: an appender must start with one (never with nothing kept)
    needs_newline: bool = False
    #: result records dropped as duplicates of a later one (``drop_duplicates``)
    dropped_duplicates: int = 0

    def skipped_summary(self, shown: int = 3) -> str:
        """``2 lines skipped (line 4: not JSON; line 9: ...)``; empty when nothing was skipped."""
        if not self.skipped:
            return ""
        listed = "; ".join(str(s) for s in self.skipped[:shown])
        more = f"; +{len(self.skipped) - shown} more" if len(self.skipped) > shown else ""
        n = len(self.skipped)
        return f"{n} line{'s' if n != 1 else ''} skipped ({listed}{more})"

    @property
    def newer(self) -> bool:
        """A newer attnconf wrote some record (its ``schema`` is above :data:`SCHEMA`)."""
        return self.schema > SCHEMA

    def notes(self) -> list[str]:
        """What a deciding reader says on stderr about an accepted file, one line each (without the path): a newer
        writer's schema, records of unknown types, duplicates dropped."""
        out = []
        if self.newer:
            out.append(
                f"written by a newer attnconf (schema {self.schema} > {SCHEMA}); fields this version does not know "
                "are ignored"
            )
        if self.other_records:
            n = self.other_records
            out.append(f"{n} record{'s' * (n != 1)} of a type this version does not know ignored")
        if self.dropped_duplicates:
            n = self.dropped_duplicates
            out.append(
                f"{n} duplicated (case, backend) record{'s' * (n != 1)} dropped (--drop-duplicates: the last record "
                "of each pair kept)"
            )
        return out


def load_results(
    path: Path | str,
    *,
    allow_skipped: bool = False,
    need_header: bool = True,
    need_results: bool = True,
    drop_duplicates: bool = False,
) -> ResultsFile:
    """Read a results file strictly; :class:`ResultsFileError` (one line: the file and the reason) when it is
    missing, unreadable (a line longer than :data:`MAX_LINE`, text that is not UTF-8, corrupt gzip data), empty
    or holds no records, holds lines that are not records (unless ``allow_skipped``: they are then counted in
    :attr:`ResultsFile.skipped`; a cut last gzip member is one such line), has no header line (``need_header``)
    or no result record (``need_results``), or records one (case, backend) pair twice (:func:`record_key`;
    unless ``drop_duplicates``: the last record of each pair is kept and the others counted in
    :attr:`ResultsFile.dropped_duplicates`).

    Lenient where the format promises it: unknown keys are ignored and missing ones take their defaults, so
    records of a newer schema keep loading (:attr:`ResultsFile.newer`, :meth:`ResultsFile.notes`: the reader
    says so), and records of an unknown ``type`` are counted, not refused.
    """
    path = Path(path)
    try:
        exists = path.exists()  # Python < 3.12 raises here for a name too long (ENAMETOOLONG)
        is_dir = exists and path.is_dir()
    except OSError as exc:
        raise ResultsFileError(path, f"cannot be read: {exc.strerror or exc}") from None
    if not exists:
        raise ResultsFileError(path, "no such file")
    if is_dir:
        raise ResultsFileError(path, "is a directory, not a results file")
    try:
        scanned = scan_results(path)
        size = path.stat().st_size
    except OSError as exc:
        raise ResultsFileError(path, f"cannot be read: {exc.strerror or exc}") from None
    if not scanned.headers and not scanned.results:
        if scanned.gzip and scanned.cut_tail and len(scanned.skipped) == 1:
            raise ResultsFileError(path, f"not a complete gzip file ({scanned.skipped[0].reason})")
        what = "empty file" if size == 0 else "holds no records"
        if scanned.skipped:
            what += f": {scanned.skipped_summary()}"
        raise ResultsFileError(path, what + " (not a results file of attnconf run)")
    if scanned.skipped and not allow_skipped:
        raise ResultsFileError(path, scanned.skipped_summary())
    if need_header and not scanned.headers:
        raise ResultsFileError(path, "no header line (not a results file of attnconf run)")
    if need_results and not scanned.results:
        raise ResultsFileError(path, "no result records (only a header: the run recorded nothing)")
    return _deduplicated(scanned) if drop_duplicates else refuse_duplicates(scanned)


def refuse_duplicates(f: ResultsFile) -> ResultsFile:
    """``f``, unless it records a (case, backend) pair twice (:func:`record_key`): then :class:`ResultsFileError`
    naming the file, how many records repeat a pair, and the first pair with its two lines."""
    first: dict[tuple[str, str], int] = {}
    extra = 0
    example = ""
    for r, line in zip(f.results, f.result_lines):
        key = record_key(r)
        if key is None:
            continue
        if key in first:
            extra += 1
            if not example:
                example = f"{r.case_id} on {r.backend} (lines {first[key]} and {line})"
        else:
            first[key] = line
    if extra:
        raise ResultsFileError(
            f.path,
            f"records {extra} (case, backend) pair{'s' * (extra != 1)} twice, the first {example} (two runs wrote "
            "it at once?); pass --drop-duplicates to keep the last record of each pair",
        )
    return f


def _deduplicated(f: ResultsFile) -> ResultsFile:
    last: dict[tuple[str, str], int] = {}
    for i, r in enumerate(f.results):
        key = record_key(r)
        if key is not None:
            last[key] = i
    keep = [i for i, r in enumerate(f.results) if (key := record_key(r)) is None or last[key] == i]
    if len(keep) == len(f.results):
        return f
    return dataclasses.replace(
        f,
        results=tuple(f.results[i] for i in keep),
        result_lines=tuple(f.result_lines[i] for i in keep),
        result_headers=tuple(f.result_headers[i] for i in keep),
        dropped_duplicates=len(f.results) - len(keep),
    )


#: The longest line a results file may hold, newline included (a record is a few KB, one with a worker's stderr
#: tail or a long case a few hundred): a longer line, or a file without newlines, is refused before it fills memory.
MAX_LINE = 64 * 2**20
#: bytes read (and, from gzip, decompressed) at a time
_BLOCK = 2**20


class _Lines:
    """The lines of a results file as bytes (newline kept; the last may lack it), each with the index of the gzip
    member its newline was in (0 for plain text); gzip by content, member by member, so that a file that ends
    inside a member (a killed writer's last batch) is told apart from corrupt data.

    After the iteration: :attr:`cut_at` is the offset of the member the file ends inside of (None: every member
    is complete), :attr:`keep` the bytes up to the end of the last complete member (plain text: every byte).
    :class:`ResultsFileError` for a line longer than :data:`MAX_LINE` or data that is not gzip."""

    def __init__(self, path: Path, fh: Any, gzipped: bool) -> None:
        self.path, self.fh, self.gzipped = path, fh, gzipped
        self.cut_at: int | None = None
        # read only once cut_at is set, which sets it too: its first value is never read
        self.cut_member = -1  # pragma: no mutate
        self.keep = 0
        self.keep_ends_line = True  # the text up to :attr:`keep` ends with a newline (or is empty)

    def __iter__(self) -> Iterator[tuple[bytes, int]]:
        return self._gzip() if self.gzipped else self._plain()

    def _too_long(self, line: int) -> ResultsFileError:
        return ResultsFileError(
            self.path,
            f"line {line} is longer than {MAX_LINE // 2**20} MiB (a record is one line of a few KB): not a results "
            "file of attnconf run",
        )

    def _plain(self) -> Iterator[tuple[bytes, int]]:
        n = 0
        while raw := self.fh.readline(MAX_LINE + 1):  # a byte more than a line may hold: over the limit
            n += 1
            if len(raw) > MAX_LINE:
                raise self._too_long(n)
            self.keep += len(raw)
            yield raw, 0

    def _gzip(self) -> Iterator[tuple[bytes, int]]:
        buf = bytearray()  # the line being decoded
        n = 0  # lines yielded
        pos = 0  # compressed bytes consumed
        member = -1
        d: Any = None  # the current member's decompressor; None between members
        # no mutate (the three below): data and more are only tested for truth before they are first set, and start
        # is only read while a member is open (d is not None), which sets it; any false value or number does the same
        data = b""  # pragma: no mutate (compressed bytes not yet decompressed)
        start = 0  # pragma: no mutate (where the current member starts)
        more = False  # pragma: no mutate (the last call stopped at _BLOCK bytes of output: call again before reading)
        while True:
            if not data and not more:
                data = self.fh.read(_BLOCK)
                if not data:
                    break
            if d is None:
                stripped = data.lstrip(b"\0")  # zero padding between or after members, as gzip allows
                pos += len(data) - len(stripped)
                data = stripped
                if not data:
                    continue
                if member >= 0 and not _GZIP_MAGIC.startswith(data[:2]):  # (one byte left: its first)
                    raise ResultsFileError(
                        self.path,
                        f"holds bytes that are not gzip data after its gzip member ending at byte {pos} (plain text "
                        "appended to a gzipped file?)",
                    )
                d = zlib.decompressobj(16 + zlib.MAX_WBITS)
                member += 1
                start = pos
            try:
                out = d.decompress(data, _BLOCK)
            except zlib.error as exc:
                raise ResultsFileError(
                    self.path, f"corrupt gzip data in the member starting at byte {start} ({exc})"
                ) from None
            more = len(out) == _BLOCK
            rest = d.unused_data if d.eof else d.unconsumed_tail
            pos += len(data) - len(rest)
            data = rest
            i = 0
            while (j := out.find(b"\n", i)) >= 0:
                n += 1
                if buf:
                    buf += out[i : j + 1]
                    if len(buf) > MAX_LINE:
                        raise self._too_long(n)
                    yield bytes(buf), member
                    buf.clear()
                else:
                    if j + 1 - i > MAX_LINE:
                        raise self._too_long(n)
                    yield out[i : j + 1], member
                i = j + 1
            buf += out[i:]
            if len(buf) > MAX_LINE:
                raise self._too_long(n + 1)
            if d.eof:
                self.keep, self.keep_ends_line = pos, not buf
                d, more = None, False
        if d is not None:
            self.cut_at, self.cut_member = start, member
        if buf:
            yield bytes(buf), max(member, 0)


def _bad_header(h: Header) -> str:
    for name, kind in (("backends", dict), ("env", dict), ("sweep", dict), ("argv", list)):
        if not isinstance(getattr(h, name), kind):
            return f"{name} must be a JSON {'object' if kind is dict else 'array'}"
    if not all(isinstance(v, dict) for v in h.backends.values()):
        return "backends must map names to objects"
    return ""


def _bad_result(r: CheckResult) -> str:
    for name in ("case_id", "backend", "family"):
        if not isinstance(getattr(r, name), str):
            return f"{name} must be a string"
    for name in ("case", "extra"):
        if not isinstance(getattr(r, name), dict):
            return f"{name} must be a JSON object"
    return ""


def scan_results(path: Path | str) -> ResultsFile:
    """Every line of ``path``, parsed, with no policy (the readers above apply theirs, ``--resume`` its own:
    :func:`conformance.running.outfile.read_for_resume`); gzip by content.  OSError propagates;
    :class:`ResultsFileError` for a line longer than :data:`MAX_LINE`, data that is not gzip, and text that is
    not UTF-8 (but in a cut tail)."""
    path = Path(path)
    headers: list[Header] = []
    results: list[CheckResult] = []
    result_lines: list[int] = []
    result_headers: list[int] = []
    skipped: list[SkippedLine] = []
    other = 0
    schema = 0
    mark: tuple[int, ...] = (-1, 0, 0, 0, 0, 0)  # (member, line, headers, results, skipped, other) at its start
    bad_text: tuple[int, str] | None = None  # (line, detail) of the first line that is not UTF-8
    n = 0
    offset = 0  # of the line in the (decompressed) text
    last = b""
    with open(path, "rb") as fh:
        gzipped = fh.read(2) == _GZIP_MAGIC
        fh.seek(0)
        lines = _Lines(path, fh, gzipped)
        for raw, member in lines:
            n += 1
            if member != mark[0]:
                mark = (member, n, len(headers), len(results), len(skipped), other)
            last = raw
            offset += len(raw)
            cut = not raw.endswith(b"\n")  # only the last line can lack its newline
            stripped = raw.strip()  # ASCII whitespace: a control byte (a cut gzip magic, 1f) is not blank
            if not stripped:
                continue
            try:
                text = stripped.decode("utf-8")
            except UnicodeDecodeError as exc:
                if cut:
                    skipped.append(SkippedLine(n, "not UTF-8 text (the last line, cut short)"))
                else:
                    skipped.append(SkippedLine(n, f"not UTF-8 text ({exc.reason})"))
                    if bad_text is None:
                        at = offset - len(raw) + len(raw) - len(raw.lstrip()) + exc.start
                        bad_text = (n, f"byte {at}: {exc.reason}")
                continue
            try:
                line = json.loads(text)
            except (ValueError, RecursionError):
                skipped.append(SkippedLine(n, "not JSON" + (" (the last line, cut short)" if cut else "")))
                continue
            kind = line.get("type") if isinstance(line, dict) else None
            if kind is None:
                skipped.append(SkippedLine(n, "not a record (a JSON object with a 'type' field)"))
                continue
            stated = line.get("schema")
            if type(stated) is int and stated > schema:
                schema = stated
            try:
                if kind == "header":
                    h = Header.from_json(line)
                    bad = _bad_header(h)
                    if not bad:
                        headers.append(h)
                elif kind == "result":
                    r = CheckResult.from_json(line)
                    bad = _bad_result(r)
                    if not bad:
                        results.append(r)
                        result_lines.append(n)
                        result_headers.append(len(headers) - 1)
                else:
                    other += 1
                    continue
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                bad = f"{type(exc).__name__}: {exc}"
            if bad:
                skipped.append(SkippedLine(n, f"a {kind} record this version cannot read ({bad})"[:300]))
    keep = lines.keep
    cut_tail = False
    needs_newline = False
    if lines.cut_at is not None:  # a killed writer's last gzip member: what it held is not read
        first = n + 1
        if mark[0] == lines.cut_member:
            first, nh, nr, ns, other = mark[1], mark[2], mark[3], mark[4], mark[5]
            del headers[nh:], results[nr:], result_lines[nr:], result_headers[nr:], skipped[ns:]
        if bad_text is not None and bad_text[0] >= first:
            bad_text = None
        size = path.stat().st_size
        skipped.append(
            SkippedLine(
                first,
                f"the last gzip member is cut short (from byte {lines.cut_at} to the end at byte {size}: a killed "
                "writer's last batch)",
            )
        )
        cut_tail = True
        needs_newline = not lines.keep_ends_line
    elif last:
        if skipped and skipped[-1].line == n and skipped[-1].reason.endswith("(the last line, cut short)"):
            if not gzipped:  # inside a complete gzip member it cannot be cut off
                keep -= len(last)
                cut_tail = True
            else:
                needs_newline = True
        else:
            needs_newline = not last.endswith(b"\n")
    if bad_text is not None:
        hint = "" if gzipped else "; a gzipped file starts with 1f 8b"
        raise ResultsFileError(path, f"not UTF-8 text ({bad_text[1]}, line {bad_text[0]}{hint})")
    return ResultsFile(
        path,
        tuple(headers),
        tuple(results),
        tuple(skipped),
        other,
        tuple(result_lines),
        tuple(result_headers),
        schema,
        gzipped,
        keep,
        cut_tail,
        needs_newline,
    )
