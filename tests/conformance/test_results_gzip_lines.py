"""The gzip line reader of results files (``results_file._Lines``) against lines computed directly: with blocks of
a few bytes and a small line limit every branch runs (lines across blocks and members, zero padding between
members, lines at and just over the limit, the member index of each line, where a cut file ends).  Written for the
mutmut survivors of the 2026-11-26 run."""

from __future__ import annotations

import gzip
import io
from pathlib import Path

import pytest

from conformance import results_file
from conformance.results_file import ResultsFileError, _Lines

LIMIT = 12


def _read(data: bytes, block: int, monkeypatch, tmp_path: Path) -> tuple[list[tuple[bytes, int]], _Lines]:
    monkeypatch.setattr(results_file, "_BLOCK", block)
    monkeypatch.setattr(results_file, "MAX_LINE", LIMIT)
    lines = _Lines(tmp_path / "r.jsonl.gz", io.BytesIO(data), True)
    return list(lines), lines


def _members(*texts: bytes, pad: int = 0) -> bytes:
    return (b"\0" * pad).join(gzip.compress(t) for t in texts)


MEMBERS = (b"ab\ncdefgh\n", b"\nxyz\n0123456789a\n", b"q\nlast-no-nl")


def _expected(texts) -> list[tuple[bytes, int]]:
    out: list[tuple[bytes, int]] = []
    carry, carry_member = b"", 0
    for m, t in enumerate(texts):
        for piece in t.splitlines(keepends=True):
            if carry:
                piece, carry = carry + piece, b""
            if piece.endswith(b"\n"):
                out.append((piece, m))
            else:
                carry, carry_member = piece, m
    if carry:
        out.append((carry, carry_member))
    return out


@pytest.mark.parametrize("block", [1, 2, 3, 5, 7, 11, 64])
@pytest.mark.parametrize("pad", [0, 3])
def test_lines_and_members_whatever_the_block(block, pad, monkeypatch, tmp_path):
    """Each line comes whole, newline kept, with the index of the member its newline is in, for any block size
    and with zero padding between members (gzip allows it)."""
    got, lines = _read(_members(*MEMBERS, pad=pad), block, monkeypatch, tmp_path)
    assert got == _expected(MEMBERS)
    assert lines.cut_at is None
    data = _members(*MEMBERS, pad=pad)
    assert lines.keep == len(data) and not lines.keep_ends_line  # every member complete; the text ends mid-line


@pytest.mark.parametrize("block", [1, 4, 64])
def test_a_line_at_the_limit_is_read_and_one_byte_more_is_refused_naming_it(block, monkeypatch, tmp_path):
    """A line of exactly MAX_LINE bytes (newline included) is a line; one byte more is refused, naming its line
    number, whether it arrives in one block or across blocks, with or without its newline."""
    at_limit = b"a\n" + b"x" * (LIMIT - 1) + b"\n"
    got, _ = _read(_members(at_limit), block, monkeypatch, tmp_path)
    assert got == [(b"a\n", 0), (b"x" * (LIMIT - 1) + b"\n", 0)]
    for over in (b"a\n" + b"x" * LIMIT + b"\n", b"a\n" + b"x" * (LIMIT + 1)):
        with pytest.raises(ResultsFileError, match=r"line 2 is longer than .*: not a results file of attnconf run$"):
            _read(_members(over), block, monkeypatch, tmp_path)


def test_a_file_cut_inside_its_last_member_says_where_that_member_starts(monkeypatch, tmp_path):
    """A killed writer's last batch: the lines before it are read, ``cut_at`` is where the cut member starts and
    ``keep`` the end of the last complete member."""
    first = gzip.compress(b"one\ntwo\n")
    second = gzip.compress(b"three\nfour\n")
    got, lines = _read(first + second[:-6], 3, monkeypatch, tmp_path)
    assert got[:2] == [(b"one\n", 0), (b"two\n", 0)]
    assert lines.cut_at == len(first) and lines.cut_member == 1 and lines.keep == len(first) and lines.keep_ends_line
    got, lines = _read(second[:-6], 3, monkeypatch, tmp_path)  # cut inside the first member: it starts at 0
    assert lines.cut_at == 0 and lines.cut_member == 0 and lines.keep == 0


def test_text_after_a_member_is_refused_with_its_offset(monkeypatch, tmp_path):
    """Plain text appended to a gzipped file is not gzip data: refused, naming the byte where the last member
    ended."""
    data = gzip.compress(b"one\n")
    tail = r"\(plain text appended to a gzipped file\?\)$"
    for text in (b'{"type": "result"}\n', b"XX not gzip\n"):  # only zero bytes are padding
        with pytest.raises(ResultsFileError, match=rf"after its gzip member ending at byte {len(data)} {tail}"):
            _read(data + text, 4, monkeypatch, tmp_path)
