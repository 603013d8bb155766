"""The results file at the edges the mutation run found unpinned: the line and header of each record kept when
duplicates are dropped, the line limit of the plain and the gzip reader at exactly ``MAX_LINE`` bytes without a
newline, reads of at most ``MAX_LINE + 1`` or ``_BLOCK`` bytes, zlib data that is not gzip, and the text of a
member cut short.

The line reader is driven with a small ``MAX_LINE`` and ``_BLOCK`` (patched, as in test_results_gzip_lines.py)."""

from __future__ import annotations

import gzip
import io
import json
import zlib
from dataclasses import replace
from pathlib import Path

import pytest

from conformance import results_file
from conformance.records import CheckResult, Header, Status
from conformance.results_file import ResultsFileError, _Lines, load_results
from conformance.results_writer import record_line

LIMIT = 12
TOO_LONG = r"line 2 is longer than .*: not a results file of attnconf run$"


def _limits(monkeypatch, block: int = 4) -> None:
    monkeypatch.setattr(results_file, "_BLOCK", block)
    monkeypatch.setattr(results_file, "MAX_LINE", LIMIT)


def _lines(data: bytes, gzipped: bool, fh=None) -> tuple[list[tuple[bytes, int]], _Lines]:
    lines = _Lines(Path("r.jsonl"), fh or io.BytesIO(data), gzipped)
    return list(lines), lines


def _result(case_id: str) -> CheckResult:
    return CheckResult(case_id=case_id, backend="kern-x", family="kern", status=Status.PASS, case={})


def test_dropped_duplicates_keep_each_records_line_and_header(tmp_path):
    """``drop_duplicates`` keeps the last record of a pair with its own line number and header index (what merge
    splits a resumed file's segments by), not those of the records that came before it."""
    # kills x__deduplicated__mutmut_21 (result_lines kept whole) and _22 (result_headers kept whole)
    h0, h1 = (Header(suite="smoke", backends={}, env={"run": {"seed": s}}) for s in (0, 1))
    order = [h0, _result("a"), _result("b"), h1, _result("a"), _result("c")]  # lines 1..6
    path = tmp_path / "r.jsonl"
    path.write_text("".join(record_line(r) for r in order))
    f = load_results(path, drop_duplicates=True)
    assert [r.case_id for r in f.results] == ["b", "a", "c"] and f.dropped_duplicates == 1
    assert f.result_lines == (3, 5, 6)
    assert f.result_headers == (0, 1, 1)


@pytest.mark.parametrize("gzipped", [False, True], ids=["plain", "gzip"])
def test_a_last_line_of_exactly_max_line_bytes_without_newline_is_read(gzipped, monkeypatch):
    """MAX_LINE counts the newline: a last line of exactly MAX_LINE bytes without one is within it, in plain text
    and in gzip alike; one byte more is refused, naming the line."""
    # kills xǁ_Linesǁ_gzip__mutmut_105 (>= MAX_LINE for the carried text); the plain reader refused it before
    _limits(monkeypatch)
    text = b"a\n" + b"x" * LIMIT
    got, lines = _lines(gzip.compress(text) if gzipped else text, gzipped)
    assert got == [(b"a\n", 0), (b"x" * LIMIT, 0)]
    assert lines.keep == (len(gzip.compress(text)) if gzipped else len(text))
    over = text + b"x"
    with pytest.raises(ResultsFileError, match=TOO_LONG):
        _lines(gzip.compress(over) if gzipped else over, gzipped)


@pytest.mark.parametrize("gzipped", [False, True], ids=["plain", "gzip"])
def test_a_line_over_the_limit_is_refused_naming_it_and_why(gzipped, monkeypatch):
    """A line longer than MAX_LINE is refused with its number and what the file is not (plain and gzip)."""
    # kills xǁ_Linesǁ_too_long__mutmut_9, _10 (the message's last words) through the plain reader too
    _limits(monkeypatch)
    text = b"a\n" + b"x" * (2 * LIMIT) + b"\n"
    with pytest.raises(ResultsFileError, match=TOO_LONG):
        _lines(gzip.compress(text) if gzipped else text, gzipped)


class _Reads(io.BytesIO):
    """A file that records the size of every read and readline."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.sizes: list[int | None] = []

    def read(self, size: int | None = -1) -> bytes:
        self.sizes.append(size)
        return super().read(size)

    def readline(self, size: int | None = -1) -> bytes:
        self.sizes.append(size)
        return super().readline(size)


@pytest.mark.parametrize(("gzipped", "most"), [(False, LIMIT + 1), (True, 5)], ids=["plain", "gzip"])
def test_the_file_is_read_a_bounded_piece_at_a_time(gzipped, most, monkeypatch):
    """The plain reader asks the file for at most MAX_LINE + 1 bytes at a time (one more than a line may hold,
    to tell a line over the limit), the gzip reader for at most ``_BLOCK``: a large file, or one without newlines,
    never sits in memory whole; both read it to its end."""
    # kills xǁ_Linesǁ_gzip__mutmut_21 (read(None): the whole file at once); also readline(None) and
    # readline(MAX_LINE + 2) of the plain reader
    _limits(monkeypatch, block=5)
    text = b"one\ntwo\nthree\nfour\n"
    data = gzip.compress(text[:14]) + gzip.compress(text[14:]) if gzipped else text
    fh = _Reads(data)
    got, _ = _lines(data, gzipped, fh)
    assert [line for line, _ in got] == [b"one\n", b"two\n", b"three\n", b"four\n"]
    assert len(fh.sizes) > 1 and all(isinstance(n, int) and 0 < n <= most for n in fh.sizes), fh.sizes


def test_zlib_data_is_not_gzip(monkeypatch):
    """zlib's own format (no gzip header) handed to the gzip reader is corrupt gzip data, refused naming where the
    member starts; it is not decoded as if it were gzip."""
    # kills xǁ_Linesǁ_gzip__mutmut_50 (wbits 17 + MAX_WBITS = 32: zlib or gzip by header)
    _limits(monkeypatch)
    with pytest.raises(ResultsFileError, match=r"corrupt gzip data in the member starting at byte 0 \("):
        _lines(zlib.compress(b"one\ntwo\n"), True)


@pytest.mark.parametrize("block", [1, 4, 16, 64])
def test_a_member_cut_short_yields_all_the_text_decoded_before_the_cut(block, monkeypatch):
    """A member cut short (a killed writer's last batch) yields every byte zlib decodes from what is there, also
    the output still pending when the last compressed byte was consumed (long runs of one byte decode from a few
    bits); ``cut_at`` says where the member starts."""
    # kills xǁ_Linesǁ_gzip__mutmut_64 (more = None: the pending output is dropped at the end of the file)
    monkeypatch.setattr(results_file, "_BLOCK", block)
    text = b"x" * 200 + b"\n" + b"y" * 100 + b"\n" + b"z" * 300 + b"\n"
    whole = gzip.compress(text, mtime=0)
    for cut in range(1, len(whole) - 20):
        data = whole[:-cut]
        decoded = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(data)
        got, lines = _lines(data, True)
        assert b"".join(line for line, _ in got) == decoded, (cut, block)
        assert lines.cut_at == 0 and lines.cut_member == 0


@pytest.mark.parametrize("n", [1, 2, 3])
def test_the_notes_count_unknown_records_and_dropped_duplicates_in_words(n, tmp_path):
    """A deciding reader's notes on an accepted file: how many records of a type this version does not know it
    ignored and how many duplicated pairs ``drop_duplicates`` dropped, each count with its noun in the singular for
    one and the plural otherwise, and the rule that kept the last record of a pair."""
    # kills xǁResultsFileǁnotes__mutmut_5 (the count None), _8, _9, _10, _11 (the plural 's' and when it is added),
    # _19, _20 (the text of the duplicates' rule)
    header = Header(suite="smoke", backends={}, env={})
    future = json.dumps({"type": "future-record", "schema": 1}) + "\n"
    lines = [
        record_line(header),
        *([future] * n),
        record_line(_result("a")),
        *(record_line(_result("a")) for _ in range(n)),
    ]
    path = tmp_path / "r.jsonl"
    path.write_text("".join(lines))
    f = load_results(path, drop_duplicates=True)
    s = "s" if n != 1 else ""
    assert f.other_records == n and f.dropped_duplicates == n
    assert f.notes() == [
        f"{n} record{s} of a type this version does not know ignored",
        f"{n} duplicated (case, backend) record{s} dropped (--drop-duplicates: the last record of each pair kept)",
    ]


def test_a_directory_and_a_file_that_cannot_be_read_are_named_with_the_reason(tmp_path):
    """Each refusal names the file (``path``) and says why (``reason``), in one line."""
    # kills x_load_results__mutmut_14..19 (the directory's message) and _23..27 (a read error's message)
    with pytest.raises(ResultsFileError) as info:
        load_results(tmp_path)
    assert str(info.value) == f"{tmp_path}: is a directory, not a results file" and info.value.path == str(tmp_path)
    mem = Path("/proc/self/mem")  # exists, is no directory, and every read of its first page fails (EIO)
    if not mem.exists():
        pytest.skip("no /proc/self/mem here")
    with pytest.raises(ResultsFileError) as info:
        load_results(mem)
    assert info.value.path == str(mem) and info.value.reason == "cannot be read: Input/output error"


def test_a_name_the_file_system_refuses_is_named_with_the_reason(tmp_path, monkeypatch):
    """Python < 3.12's ``Path.exists()`` raises for a name longer than the file system allows (ENAMETOOLONG); the
    refusal names the file and the reason, in one line (test_long_names.py runs it through the commands)."""
    # kills x_load_results__mutmut_10..14 (the message of that refusal)
    import errno

    def too_long(self):
        raise OSError(errno.ENAMETOOLONG, "File name too long")

    monkeypatch.setattr(Path, "exists", too_long)
    path = tmp_path / "results.jsonl"
    with pytest.raises(ResultsFileError) as info:
        load_results(path)
    assert info.value.path == str(path) and info.value.reason == "cannot be read: File name too long"
    assert str(info.value) == f"{path}: cannot be read: File name too long"


def test_a_complete_gzip_file_of_no_record_is_no_results_file_not_a_cut_one(tmp_path):
    # kills x_load_results__mutmut_32 ("gzip or cut tail" took every gzip file of no record for a cut one)
    path = tmp_path / "r.jsonl.gz"
    path.write_bytes(gzip.compress(b"not a record\n"))
    with pytest.raises(ResultsFileError, match=r"holds no records: .*\(not a results file of attnconf run\)$"):
        load_results(path)


def test_a_fuzz_campaign_may_repeat_a_pair(tmp_path):
    """A campaign shrinks several failures to one minimal case, so its records (``extra["fuzz"]``) repeat pairs;
    any other file that records a pair twice is refused."""
    # kills x_record_key__mutmut_2 and _3 (the "fuzz" key misspelled)
    header = Header(suite="fuzz", backends={}, env={})
    fuzz = replace(_result("a"), extra={"fuzz": {"draw": 1}})
    path = tmp_path / "f.jsonl"
    path.write_text("".join(record_line(r) for r in (header, fuzz, fuzz)))
    assert len(load_results(path).results) == 2
    path.write_text("".join(record_line(r) for r in (header, _result("a"), _result("a"))))
    with pytest.raises(ResultsFileError, match="twice"):
        load_results(path)
    # a campaign's record does not end the search: a pair recorded twice after it is still refused
    # (kills x_refuse_duplicates__mutmut_13, continue -> break)
    path.write_text("".join(record_line(r) for r in (header, fuzz, _result("b"), _result("b"))))
    with pytest.raises(ResultsFileError, match=r"the first b on kern-x \(lines 3 and 4\)"):
        load_results(path)


@pytest.mark.parametrize(
    "key, value, reason",
    [
        ("env", [], "env must be a JSON object"),
        ("argv", {}, "argv must be a JSON array"),
        ("backends", {"fa2": 3}, "backends must map names to objects"),
    ],
)
def test_a_header_field_of_the_wrong_json_type_is_named_with_the_type_it_needs(tmp_path, key, value, reason):
    # kills x__bad_header__mutmut_10..16 (the object / array wording), 19 and 20 (the backends' wording)
    header = json.loads(record_line(Header(suite="smoke", backends={}, env={}, argv=["run"])))
    header[key] = value
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(header) + "\n" + record_line(_result("a")))
    (skipped,) = results_file.scan_results(path).skipped
    assert skipped.reason == f"a header record this version cannot read ({reason})"


def test_records_that_state_no_schema_are_schema_0(tmp_path):
    # kills x_scan_results__mutmut_11 (the newest schema seen starting at 1)
    lines = [json.loads(record_line(r)) for r in (Header(suite="smoke", backends={}, env={}), _result("a"))]
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps({k: v for k, v in line.items() if k != "schema"}) + "\n" for line in lines))
    f = load_results(path)
    assert f.schema == 0 and not f.newer


def test_a_cut_member_after_an_empty_one_is_reported_from_its_first_line(tmp_path):
    """A gzip file whose first member is empty (a writer that flushed nothing) and whose next one is cut: the cut
    member's lines are one skipped line, numbered from the member's first line."""
    # kills x_scan_results__mutmut_13 (the start mark's member index +1: the cut member would be said to start at 0)
    text = record_line(Header(suite="smoke", backends={}, env={})) + record_line(_result("a"))
    path = tmp_path / "r.jsonl.gz"
    path.write_bytes(gzip.compress(b"") + gzip.compress(text.encode())[:-12])
    (skipped,) = results_file.scan_results(path).skipped
    assert skipped.line == 1 and skipped.reason.startswith("the last gzip member is cut short")


def test_a_last_line_cut_inside_a_utf8_character_is_named_as_such_at_its_line(tmp_path):
    # kills x_scan_results__mutmut_67 (its line number) and _71 (its wording)
    text = record_line(Header(suite="smoke", backends={}, env={})) + record_line(_result("a"))
    path = tmp_path / "r.jsonl"
    path.write_bytes(text.encode() + '{"type": "result", "case_id": "é'.encode()[:-1])  # cut inside the é
    f = results_file.scan_results(path)
    assert [(s.line, s.reason) for s in f.skipped] == [(3, "not UTF-8 text (the last line, cut short)")]
    assert f.cut_tail and len(f.results) == 1


def test_json_that_is_no_record_is_skipped_at_its_line_and_reading_goes_on(tmp_path):
    # kills x_scan_results__mutmut_117 (the wording for JSON that is not a record)
    head = record_line(Header(suite="smoke", backends={}, env={}))
    path = tmp_path / "r.jsonl"
    path.write_text(head + '{"no": "type"}\n' + record_line(_result("a")))
    f = results_file.scan_results(path)
    assert [(s.line, s.reason) for s in f.skipped] == [(2, "not a record (a JSON object with a 'type' field)")]
    assert [r.case_id for r in f.results] == ["a"] and f.result_lines == (3,)


def test_a_line_that_is_not_utf8_in_a_cut_last_member_is_part_of_the_cut_tail(tmp_path):
    """The cut member is read to its cut (so that the cut is seen): its lines, the bad one included, are the one
    skipped line of the cut tail, not a refusal of the file."""
    # kills x_scan_results__mutmut_86 (reading stopped at the bad line: the cut never seen, the file refused)
    whole = record_line(Header(suite="smoke", backends={}, env={})) + record_line(_result("a"))
    tail = b'{"x": "\xff"}\n' + record_line(_result("b")).encode() * 40
    path = tmp_path / "r.jsonl.gz"
    path.write_bytes(gzip.compress(whole.encode()) + gzip.compress(tail)[:-12])
    f = results_file.scan_results(path)
    assert [r.case_id for r in f.results] == ["a"] and f.cut_tail
    assert [s.line for s in f.skipped] == [3] and f.skipped[0].reason.startswith("the last gzip member is cut short")


def test_a_result_record_this_version_cannot_read_is_skipped_with_why(tmp_path):
    """A result line whose fields have the wrong JSON types, or that does not parse into a record, is skipped at its
    line with the reason (the exception's type and message, at most 300 characters); a complete file's
    ``cut_tail`` is the bool False."""
    # kills x_scan_results__mutmut_143 (fields of the wrong type accepted), 156 (the exception's type name),
    # 162 (the reason's 300-character cut) and 164 (cut_tail None for False)
    head = record_line(Header(suite="smoke", backends={}, env={}))
    good = json.loads(record_line(_result("a")))
    wrong_type = {**good, "case_id": 5}
    bad_status = {**good, "case_id": "b", "status": "x" * 400}
    path = tmp_path / "r.jsonl"
    lines = [head, json.dumps(wrong_type) + "\n", json.dumps(bad_status) + "\n", record_line(_result("c"))]
    path.write_text("".join(lines))
    f = results_file.scan_results(path)
    assert [r.case_id for r in f.results] == ["c"] and f.result_lines == (4,)
    (one, two) = f.skipped
    assert (one.line, one.reason) == (2, "a result record this version cannot read (case_id must be a string)")
    assert two.line == 3 and two.reason.startswith("a result record this version cannot read (ValueError: ")
    assert len(two.reason) == 300
    assert f.cut_tail is False


def test_a_cut_last_member_drops_what_it_held_and_keeps_what_came_before(tmp_path):
    """A complete member (a header, a garbled line, two records) then a cut one (a header and two records): the
    file keeps the first member's header, records and skipped line, and the cut member is one skipped line from its
    first line; a cut member that gave no line at all is numbered after the last line read."""
    # kills x_scan_results__mutmut_176 (headers cut at the results' count), 178 (skipped lines cut at the count of
    # unknown records), 169-171 (the line of a cut member that gave no line) and 166 (needs_newline None)
    head = record_line(Header(suite="smoke", backends={}, env={}))
    first = (head + "{garbled\n" + record_line(_result("a")) + record_line(_result("b"))).encode()
    second = (head + record_line(_result("c")) + record_line(_result("d"))).encode()
    path = tmp_path / "r.jsonl.gz"
    path.write_bytes(gzip.compress(first) + gzip.compress(second)[:-12])
    f = results_file.scan_results(path)
    assert len(f.headers) == 1 and [r.case_id for r in f.results] == ["a", "b"]
    assert [s.line for s in f.skipped] == [2, 5] and f.skipped[1].reason.startswith("the last gzip member is cut")
    early = tmp_path / "early.jsonl.gz"
    early.write_bytes(gzip.compress(first) + gzip.compress(second)[:12])  # the cut member's header bytes only
    g = results_file.scan_results(early)
    assert [s.line for s in g.skipped] == [2, 5] and [r.case_id for r in g.results] == ["a", "b"]
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    assert results_file.scan_results(empty).needs_newline is False  # no line to end


def test_the_end_of_a_file_says_what_a_resume_must_write_first(tmp_path):
    """The cut tail's wording and sizes; whether a resume must end the last line first (``needs_newline``, a bool);
    the not-UTF-8 refusal hints at gzip for a plain file only."""
    # kills x_scan_results__mutmut_185, 191, 192 (the cut tail's text), 195, 212, 213 (needs_newline), 219, 220 (the
    # hint)
    import re

    head = record_line(Header(suite="smoke", backends={}, env={}))
    text = (head + record_line(_result("a"))).encode()
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(gzip.compress(text) + gzip.compress(text)[:-12])
    f = results_file.scan_results(cut)
    size = cut.stat().st_size
    want = (
        rf"the last gzip member is cut short \(from byte \d+ to the end at byte {size}: a killed writer's last batch\)"
    )
    assert re.fullmatch(want, f.skipped[-1].reason) and f.needs_newline is False
    partial = tmp_path / "partial.jsonl.gz"  # a complete member whose text ends inside a line
    partial.write_bytes(gzip.compress(text + b'{"type": "res'))
    g = results_file.scan_results(partial)
    assert g.skipped[-1].reason.endswith("(the last line, cut short)") and g.needs_newline is True
    plain = tmp_path / "bad.jsonl"
    plain.write_bytes(text + b"\xff\xfe\n")
    with pytest.raises(ResultsFileError, match=r"line 3; a gzipped file starts with 1f 8b\)$"):
        results_file.scan_results(plain)
    zipped = tmp_path / "bad.jsonl.gz"
    zipped.write_bytes(gzip.compress(text + b"\xff\xfe\n"))
    with pytest.raises(ResultsFileError, match=r"line 3\)$"):
        results_file.scan_results(zipped)
