"""The results file's writer (``conformance/results_writer.py``) at the edges a mutation run can change without a
wider test noticing: the format a file is appended in (by content, else by name), the line of a record (sorted
keys, NaN written), one gzip member per batch as the appender writes it (level 6, mtime 0), a sync that flushes
and fsyncs unless told not to, a close that syncs once, and an error on close raised unless another one is on its
way out.  Each test names the mutants it kills (mutmut's names in the ``mut2`` cache; docs/guides/mutation-testing.md
lists them with the equivalent ones)."""

from __future__ import annotations

import errno
import gzip
import json
import math
import os
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.records import CheckResult, ErrorStats, Header, Status
from conformance.results_file import load_results
from conformance.results_writer import Appender, append_record, is_gzip, record_line

MAGIC = b"\x1f\x8b"
HEADER = Header(suite="smoke", backends={"kern-x": {"name": "kern-x"}}, env={"run": {"seed": 0}})


def _result(case_id: str, stats: ErrorStats | None = None) -> CheckResult:
    return CheckResult(
        case_id=case_id, backend="kern-x", family="kern", status=Status.FAIL, case={"b": 1, "a": 2}, stats=stats
    )


def _member(text: str) -> bytes:
    """A batch as the appender writes it: one gzip member, zlib level 6, mtime 0 (the bytes depend only on the
    records, and level 6 is the writer's documented trade of time for size)."""
    return zlib.compress(text.encode(), level=6, wbits=31)


# ------------------------------------------------------------------------------------------------------ is_gzip


@settings(max_examples=80)
@given(
    data=st.one_of(st.binary(max_size=8), st.binary(max_size=8).map(lambda b: MAGIC + b)),
    name=st.sampled_from(["r.jsonl", "r.jsonl.gz", "r.gz.jsonl", "r.GZ"]),
)
def test_a_file_is_gzipped_by_its_content_else_by_its_name(tmp_path_factory, data: bytes, name: str) -> None:
    """By content when it has any (it starts with 1f 8b), else (new or empty) by a name ending in ``.gz``."""
    # kills x_is_gzip__mutmut_1 to _11 and _13 to _19 (_12 is equivalent: None and b"" are both false)
    path = tmp_path_factory.mktemp("gz") / name
    want_by_name = name.endswith(".gz")
    assert is_gzip(path) is want_by_name  # not there yet
    path.write_bytes(data)
    assert is_gzip(path) is (data.startswith(MAGIC) if data else want_by_name)


def test_a_file_that_exists_but_cannot_be_read_is_an_oserror(tmp_path: Path) -> None:
    with pytest.raises(IsADirectoryError):
        is_gzip(tmp_path)


# -------------------------------------------------------------------------------------------------- record_line


def test_a_record_is_one_json_line_with_sorted_keys_and_its_nan_written() -> None:
    """One line, newline included and no other; keys sorted at every level (a file's lines do not depend on the
    order fields were set in); NaN and infinities written as JSON's NaN/Infinity, as every reader takes them."""
    # kills x_record_line__mutmut_1 to _6 and _8 to _10 (_7, allow_nan left out, is equivalent: True is its default)
    stats = ErrorStats(math.nan, math.inf, -math.inf, (1, 0, 2), 0.0, math.nan, 1e-3, 1e-4, 1e-2, 0.999)
    record = _result("c1", stats)
    line = record_line(record)
    assert line.endswith("}\n") and line.count("\n") == 1
    assert '"max_abs": NaN' in line and '"max_rel": Infinity' in line and '"mean_abs": -Infinity' in line
    assert line.index('"backend"') < line.index('"case"') < line.index('"case_id"') < line.index('"type"')
    assert line.index('"a": 2') < line.index('"b": 1')
    back = CheckResult.from_json(json.loads(line))
    assert math.isnan(back.stats.max_abs) and back.stats.max_rel == math.inf and back.case_id == "c1"
    assert record_line(HEADER).startswith('{"argv": ') and json.loads(record_line(HEADER))["type"] == "header"


# ----------------------------------------------------------------------------------------------------- Appender


def test_each_sync_of_a_gzipped_file_appends_one_member_of_its_batch(tmp_path: Path, monkeypatch) -> None:
    """A new ``*.gz`` file, and a gzipped one of another name (by content), get one member per sync holding the
    batch's lines in order; a plain file gets the lines themselves."""
    # kills xǁAppenderǁ__init____mutmut_3 (never gzip), xǁAppenderǁsync__mutmut_5 (a separator between the
    # batch's lines), _8 to _15 (the member's data, level and mtime), _16 (nothing written); _7 ("UTF-8") is
    # equivalent: the same codec
    monkeypatch.setattr(os, "fsync", lambda fd: None)
    a, b, c = HEADER, _result("c1"), _result("c2")
    gz = tmp_path / "r.jsonl.gz"
    with Appender(gz) as out:
        assert out.gzip
        out.write(a)
        out.write(b)
        out.sync()
        out.write(c)
    first = _member(record_line(a) + record_line(b))
    assert gz.read_bytes() == first + _member(record_line(c))
    renamed = tmp_path / "gzipped-by-content.jsonl"
    renamed.write_bytes(first)
    append_record(renamed, c)
    assert renamed.read_bytes() == gz.read_bytes()
    assert [r.case_id for r in load_results(renamed).results] == ["c1", "c2"]
    plain = tmp_path / "r.jsonl"
    with Appender(plain) as out:
        assert not out.gzip
        for r in (a, b, c):
            out.write(r)
    assert plain.read_text() == record_line(a) + record_line(b) + record_line(c)


def test_sync_flushes_to_the_os_and_fsyncs_unless_told_not_to(tmp_path: Path, monkeypatch) -> None:
    """After ``sync(fsync=False)`` another reader sees the batch (a killed process loses nothing); ``sync()`` and
    ``close()`` also fsync the file's own descriptor (a crash of the machine loses nothing)."""
    # kills xǁAppenderǁsync__mutmut_1 (fsync off by default), _17 (fsync(None)), xǁAppenderǁclose__mutmut_1 (a
    # close that never syncs), and the others that write nothing
    synced: list[int] = []
    monkeypatch.setattr(os, "fsync", synced.append)
    path = tmp_path / "r.jsonl"
    out = Appender(path)
    out.write(HEADER)
    assert path.read_bytes() == b""  # buffered until a sync
    out.sync(fsync=False)
    assert path.read_text() == record_line(HEADER) and synced == []
    out.write(_result("c1"))
    out.sync()
    assert path.read_text() == record_line(HEADER) + record_line(_result("c1"))
    assert synced == [out.fileno()]
    fd = out.fileno()
    out.write(_result("c2"))
    out.close()
    assert synced == [fd, fd] and [r.case_id for r in load_results(path).results] == ["c1", "c2"]
    out.close()  # a second close does nothing
    assert synced == [fd, fd]


def test_an_error_closing_the_file_is_raised_unless_another_is_on_its_way_out(tmp_path: Path, monkeypatch) -> None:
    """A failed fsync at the end of a ``with`` block is raised (a run must not report records it could not make
    durable); when the block is already leaving on an error (Ctrl-C), that error leaves, not the fsync's, and the
    records written so far are still in the file."""
    # kills xǁAppenderǁ__exit____mutmut_1 (the two cases swapped)

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    path = tmp_path / "r.jsonl"
    with pytest.raises(OSError, match="No space left"):
        with Appender(path) as out:
            out.write(HEADER)
    with pytest.raises(KeyboardInterrupt):
        with Appender(path) as out:
            out.write(_result("c1"))
            raise KeyboardInterrupt
    assert path.read_text() == record_line(HEADER) + record_line(_result("c1"))


def test_append_record_appends_one_record_durably(tmp_path: Path, monkeypatch) -> None:
    # kills x_append_record__mutmut_1 and _2
    synced: list[int] = []
    monkeypatch.setattr(os, "fsync", synced.append)
    path = tmp_path / "r.jsonl.gz"
    append_record(path, HEADER)
    append_record(path, _result("c1"))
    assert gzip.decompress(path.read_bytes()).decode() == record_line(HEADER) + record_line(_result("c1"))
    assert len(synced) == 2
