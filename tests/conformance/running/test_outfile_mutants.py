"""The results file's resume path at the edges the mutation run left unpinned (``conformance/running/outfile.py``,
the 63 survivors of the fifth session's run): the sweep identity as written, the refusals' text, a file of one
byte, a garbled line before a cut tail, a directory given as the file, a gzipped file whose last line lacks its
newline, and ``repair_tail`` with and without the scan it is given.

Each test names the mutants it kills; docs/guides/mutation-testing.md lists them with the equivalent ones."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import NamedTuple

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from conformance.exits import UsageError
from conformance.records import CheckResult, Header, Status
from conformance.results_file import load_results, scan_results
from conformance.results_writer import Appender, record_line
from conformance.running import outfile
from conformance.running.outfile import check_resume, check_writable, read_for_resume, repair_tail, sweep


class _Case(NamedTuple):
    id: str


HEADER = Header(suite="smoke", backends={"kern-x": {"name": "kern-x"}}, env={"run": {"seed": 0}})


def _result(case_id: str) -> CheckResult:
    return CheckResult(case_id=case_id, backend="kern-x", family="kern", status=Status.PASS, case={})


def _lines(*records: Header | CheckResult) -> bytes:
    return "".join(record_line(r) for r in records).encode()


# ----------------------------------------------------------------------------------------------- sweep identity


def test_the_sweep_identity_is_written_as_documented() -> None:
    """The header's ``sweep`` key by key (the format in outfile's docstring, which files of earlier versions hold
    and ``--resume`` compares against): with only the required arguments it is the sweep of a run with every option
    at its default (``RunConfig``: seed 0, device cpu), and the case ids' digest is sha256 of the ids one per line
    in run order (so a file written by an earlier version resumes)."""
    # kills x__sha__mutmut_3 (another separator), x_sweep__mutmut_1..5 (the seed and device defaults, the "schema"
    # key) and x_sweep__mutmut_19/20 (the "exclude_feature" key)
    assert sweep(suite="smoke", cases=[_Case("mha_a"), _Case("mha_b")], json_ids=None) == {
        "schema": 1,
        "suite": "smoke",
        "selection": {
            "case": [],
            "exclude": [],
            "feature": [],
            "exclude_feature": [],
            "case_json": None,
            "shard": None,
            "limit": None,
        },
        "cases": 2,
        "case_ids_sha256": "c0f5a3951c117e31c57371fd510ebb7b59d29a3f8f30c2e8cf29fd01fbcdfd1c",  # "mha_a\nmha_b"
        "seed": 0,
        "device": "cpu",
        "tol": [],
        "tol_args": {"tol": [], "tol_file": None},
    }


def test_every_option_of_the_sweep_identity_lands_in_its_field() -> None:
    """Each selection option in its own field as a list (tuples and generators too), the --case-json ids by the
    digest of their sorted ids, the models only when given, each tolerance layer copied."""
    layer = {"bf16": {"factor": 2.0}}
    got = sweep(
        suite=None,
        cases=(_Case("x"),),
        json_ids=["j2", "j1"],
        patterns=("mha_*",),
        exclude=("*_fp16_*",),
        features=(("paged", "window"),),
        exclude_features=(("sinks",), ("fp8", "softcap")),
        models=("llama",),
        shard=(1, 4),
        limit=7,
        seed=3,
        device="cuda",
        tol=(layer,),
        tol_args=("factor=2",),
        tol_file="t.toml",
    )
    assert got == {
        "schema": 1,
        "suite": None,
        "selection": {
            "case": ["mha_*"],
            "exclude": ["*_fp16_*"],
            "feature": [["paged", "window"]],
            "exclude_feature": [["sinks"], ["fp8", "softcap"]],
            "model": ["llama"],
            "case_json": "f83b5d6ccc3703cc0ff992136b16a48490b06d2b59a8fdaa3453e771513e283e",  # "j1\nj2": sorted
            "shard": [1, 4],
            "limit": 7,
        },
        "cases": 1,
        "case_ids_sha256": "2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881",  # "x"
        "seed": 3,
        "device": "cuda",
        "tol": [layer],
        "tol_args": {"tol": ["factor=2"], "tol_file": "t.toml"},
    }
    assert got["tol"][0] is not layer  # a copy: the header does not change with the caller's table
    json.dumps(got)  # what the header writes: JSON as it is


# ------------------------------------------------------------------------------------------------ check_resume


def test_a_refused_resume_names_both_values_and_what_to_do(tmp_path: Path) -> None:
    """The one line of a refused resume: the file, which header of how many, the recorded value, this run's value,
    and the two ways on."""
    # kills x_check_resume__mutmut_43 (this run's value shown as null), _44 and _45 (the advice's text)
    now = {"suite": "smoke", "seed": 0, "device": "cpu", "selection": {"shard": None}, "tol_args": None}
    same = Header("smoke", {}, {}, sweep={"suite": "smoke", "seed": 0})
    other = Header("smoke", {}, {}, sweep={"suite": "smoke", "seed": 3})
    path = tmp_path / "r.jsonl"
    with pytest.raises(UsageError) as refused:
        check_resume(path, [same, other], now, has_records=True)
    assert str(refused.value) == (
        f"--resume: {path} (header 2 of 2) was run with seed=3, this run has seed=0; run without --resume (the file "
        "is kept as a numbered backup) or with the same options"
    )


# ---------------------------------------------------------------------------------------------- check_writable


def test_check_writable_refuses_a_directory_and_an_input_naming_the_flag(tmp_path: Path) -> None:
    """``run()`` checks its results file itself (an API caller has no CLI check before it): a directory, or one of
    the run's inputs, refused naming the option (``--out`` unless told)."""
    # kills x_check_writable__mutmut_1, _2 (the default flag), _4 (no flag), _3, _5 to _8 (the arguments passed on);
    # the CLI's own check_outputs runs first with the same arguments, so the CLI tests cannot tell these apart
    with pytest.raises(UsageError) as refused:
        check_writable(tmp_path)
    assert str(refused.value) == f"--out {tmp_path}: is a directory, not a regular file; give a file path"
    source = tmp_path / "cases.json"
    source.write_text("{}")
    with pytest.raises(UsageError, match=r"^--results \S+: is an input of this command"):
        check_writable(source, "--results", [tmp_path / "other.toml", source])
    check_writable(tmp_path / "r.jsonl", "--out", [source])  # a new file beside the input: taken
    assert not (tmp_path / "r.jsonl").exists()


# --------------------------------------------------------------------------------------------- read_for_resume


def test_an_absent_or_empty_file_has_nothing_to_resume_and_one_byte_is_a_cut_tail(tmp_path: Path) -> None:
    """None for a file that is not there or is empty (the run starts it); a file of one byte is not empty: the
    first byte of a killed writer's first line, a cut tail that the resume then removes."""
    # kills x_read_for_resume__mutmut_4 (stat of an absent file: refused) and _7 (one byte taken for empty, never
    # repaired: the resumed run's header would follow the stray byte on its line)
    absent = tmp_path / "absent.jsonl"
    assert read_for_resume(absent) is None and not absent.exists()
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    assert read_for_resume(empty) is None
    one = tmp_path / "one.jsonl"
    one.write_bytes(b"{")
    prev = read_for_resume(one)
    assert prev is not None and prev.cut_tail and prev.keep == 0 and not prev.results and not prev.headers
    repair_tail(one, prev)
    assert one.read_bytes() == b""


def test_a_file_that_cannot_be_read_is_refused_with_the_reason(tmp_path: Path) -> None:
    # kills x_read_for_resume__mutmut_10 (no message) and _11 (the errno text for the reason)
    path = tmp_path / "r.jsonl"
    path.mkdir()
    (path / "inside").write_text("a directory is not empty, so its size is not 0\n")
    with pytest.raises(UsageError) as refused:
        read_for_resume(path)
    assert str(refused.value) == f"--resume: {path}: cannot be read: Is a directory"


def test_a_garbled_line_before_a_cut_tail_is_still_refused(tmp_path: Path) -> None:
    """Only the last of the skipped lines is the killed writer's cut tail: a garbled line before it is refused
    (and kept with ``allow_skipped``, while the tail is cut off)."""
    # kills x_read_for_resume__mutmut_20 (the last two skipped lines taken for the tail)
    path = tmp_path / "r.jsonl"
    path.write_bytes(_lines(HEADER) + b"garbage\n" + _lines(_result("a")) + b'{"type": "res')
    with pytest.raises(UsageError, match=r": 1 line is not a record \(line 2: not JSON\); pass --allow-skipped"):
        read_for_resume(path)
    prev = read_for_resume(path, allow_skipped=True)
    assert prev is not None and prev.cut_tail and [r.case_id for r in prev.results] == ["a"]
    repair_tail(path, prev)
    assert path.read_bytes() == _lines(HEADER) + b"garbage\n" + _lines(_result("a"))


@pytest.mark.parametrize(
    ("n", "says"),
    [
        (1, "1 line is not a record (line 2: not JSON); pass --allow-skipped to keep it"),
        (2, "2 lines are not a record (line 2: not JSON; line 3: not JSON); pass --allow-skipped to keep them"),
        (3, "3 lines are not a record (line 2: not JSON; line 3: not JSON; line 4: not JSON); pass --allow-skipped "
            "to keep them"),
        (4, "4 lines are not a record (line 2: not JSON; line 3: not JSON; line 4: not JSON; +1 more); pass "
            "--allow-skipped to keep them"),
        (5, "5 lines are not a record (line 2: not JSON; line 3: not JSON; line 4: not JSON; +2 more); pass "
            "--allow-skipped to keep them"),
    ],
)  # fmt: skip
def test_the_garbled_lines_are_counted_and_the_first_three_named(tmp_path: Path, n: int, says: str) -> None:
    # kills x_read_for_resume__mutmut_27, _29, _30, _32 to _35 (the listing), _39 and _45 to _52 (one line / it)
    path = tmp_path / "r.jsonl"
    path.write_bytes(_lines(HEADER) + b"garbage\n" * n + _lines(_result("a")))
    with pytest.raises(UsageError) as refused:
        read_for_resume(path)
    assert str(refused.value) == f"--resume: {path}: {says} and run the pairs the file lacks"


def test_a_pair_recorded_twice_is_refused_with_what_resuming_cannot_do(tmp_path: Path) -> None:
    """The reader's reason without its --drop-duplicates advice (a resume cannot drop records), then what can."""
    # kills x_read_for_resume__mutmut_56, _57 (the reader's advice kept) and _59 to _62 (the text after it)
    path = tmp_path / "r.jsonl"
    path.write_bytes(_lines(HEADER, _result("a"), _result("a")))
    with pytest.raises(UsageError) as refused:
        read_for_resume(path)
    assert str(refused.value) == (
        f"--resume: {path}: records 1 (case, backend) pair twice, the first a on kern-x (lines 2 and 3) (two runs "
        "wrote it at once?); resuming would not repair it: readers take it with --drop-duplicates (the last record of "
        "each pair), and a run without --resume starts a clean file (this one is kept as a numbered backup)"
    )


# ------------------------------------------------------------------------------------------------- repair_tail


def test_repair_tail_leaves_an_absent_file_absent(tmp_path: Path) -> None:
    # kills x_repair_tail__mutmut_1 (stat of an absent file: FileNotFoundError)
    path = tmp_path / "absent.jsonl"
    repair_tail(path)
    assert not path.exists()


@pytest.mark.parametrize("gz", [False, True])
def test_repair_tail_does_not_write_to_a_file_that_needs_no_repair(tmp_path: Path, gz: bool) -> None:
    """A file whose every line (member) is complete is not written to: not truncated to its own length either
    (which would still change its modification time)."""
    # kills x_repair_tail__mutmut_16 (<=) and _21 (seek(1, SEEK_END)): both truncate to the current size
    data = _lines(HEADER, _result("a"))
    path = tmp_path / ("r.jsonl.gz" if gz else "r.jsonl")
    path.write_bytes(gzip.compress(data, mtime=0) if gz else data)
    before = path.read_bytes()
    os.utime(path, ns=(10**18, 10**18))
    repair_tail(path, read_for_resume(path))
    assert path.read_bytes() == before and path.stat().st_mtime_ns == 10**18


def test_repair_tail_reads_the_file_itself_when_not_given_its_scan(tmp_path: Path) -> None:
    """Without ``scanned`` the file is read and repaired (a cut gzip member dropped); with it, it is not read
    again (a resumed file of a million records is read once)."""
    # kills x_repair_tail__mutmut_7, _8 (None used as the scan) and _9 (scan_results(None)); _4 (one byte taken for
    # empty); _6 (the file read again although its scan was given)
    whole = gzip.compress(_lines(HEADER, _result("a")), mtime=0)
    path = tmp_path / "r.jsonl.gz"
    path.write_bytes(whole + gzip.compress(_lines(_result("b")), mtime=0)[:-5])
    repair_tail(path)
    assert path.read_bytes() == whole
    one = tmp_path / "one.jsonl"
    one.write_bytes(b"{")
    repair_tail(one)
    assert one.read_bytes() == b""

    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(_lines(HEADER) + b'{"type": "res')
    scanned = scan_results(cut)

    def read_again(path: Path) -> None:
        raise AssertionError(f"{path} read again")

    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(outfile, "scan_results", read_again)
        repair_tail(cut, scanned)
    finally:
        mp.undo()
    assert cut.read_bytes() == _lines(HEADER)


@settings(max_examples=60)
@given(
    before=st.integers(0, 2),
    value=st.one_of(st.integers(), st.text(max_size=5), st.dictionaries(st.text(), st.none(), max_size=2)),
)
@example(before=0, value=7)  # a file of one byte: "7"
def test_a_last_line_that_lacks_only_its_newline_gets_one_whatever_its_length(before: int, value: object) -> None:
    """A complete last line without its newline (JSON, a record or not: kept with ``allow_skipped``) is kept and
    given its newline, so the next record starts on a line of its own, down to a file of one byte."""
    # kills x_repair_tail__mutmut_25 (no newline for a file of one byte)
    import tempfile

    with tempfile.TemporaryDirectory(prefix="attnconf-outfile-") as d:
        path = Path(d) / "r.jsonl"
        text = _lines(*[_result(f"c{i}") for i in range(before)]) + json.dumps(value).encode()
        path.write_bytes(text)
        prev = read_for_resume(path, allow_skipped=True)
        assert prev is not None and prev.needs_newline and not prev.cut_tail
        repair_tail(path, prev)
        assert path.read_bytes() == text + b"\n"
        with Appender(path) as out:
            out.write(HEADER)
        again = scan_results(path)  # the header read back from a line of its own
        assert again.headers == (HEADER,) and len(again.results) == before


def test_a_gzipped_last_line_without_its_newline_gets_a_member_holding_one(tmp_path: Path) -> None:
    """In a gzipped file the newline is a gzip member of its own (plain text would make the file unreadable),
    written as the appender writes members (mtime 0: a file's bytes do not depend on when it was resumed)."""
    # kills x_repair_tail__mutmut_32 (a plain newline), _34, _36 (no data), _35, _37, _39 (another mtime), _38
    whole = gzip.compress(_lines(HEADER, _result("a"))[:-1], mtime=0)  # the last line lacks its newline
    path = tmp_path / "r.jsonl.gz"
    path.write_bytes(whole)
    prev = read_for_resume(path)
    assert prev is not None and prev.gzip and prev.needs_newline and not prev.cut_tail
    repair_tail(path, prev)
    data = path.read_bytes()
    added = data[len(whole) :]
    assert data[: len(whole)] == whole and added[:2] == b"\x1f\x8b"
    assert added[4:8] == b"\0\0\0\0", "gzip header mtime"
    assert gzip.decompress(added) == b"\n"
    with Appender(path) as out:
        out.write(_result("b"))
    assert [r.case_id for r in load_results(path).results] == ["a", "b"]


@settings(max_examples=80)
@given(gz=st.booleans(), cut=st.floats(0.0, 1.0))
def test_a_file_cut_anywhere_is_left_readable_and_empty_when_nothing_is_kept(gz: bool, cut: float) -> None:
    """Whatever byte a killed writer stopped at, :func:`repair_tail` leaves a file that reads back without a skipped
    line and ends with a newline, or is empty: a newline is added only to a kept last line (``needs_newline``
    implies ``keep > 0``), so a file whose first gzip member or first line was cut stays empty."""
    import tempfile

    lines = [_lines(HEADER), _lines(_result("a")), _lines(_result("b"))[:-1]]  # the last line lacks its newline
    whole = b"".join(gzip.compress(part, mtime=0) if gz else part for part in lines)
    with tempfile.TemporaryDirectory(prefix="attnconf-outfile-") as d:
        path = Path(d) / ("r.jsonl.gz" if gz else "r.jsonl")
        path.write_bytes(whole[: int(cut * len(whole))])
        scanned = scan_results(path)
        assert not scanned.needs_newline or scanned.keep > 0
        repair_tail(path, scanned)
        data = path.read_bytes()
        text = gzip.decompress(data) if gz and data else data
        assert text == b"" or text.endswith(b"\n")
        assert data == b"" or scan_results(path).skipped == ()


def test_a_gzipped_file_whose_only_member_is_cut_is_emptied(tmp_path: Path) -> None:
    # repair_tail has no `keep > 0` guard of its own: scan_results never asks for a newline with nothing kept
    path = tmp_path / "r.jsonl.gz"
    path.write_bytes(gzip.compress(_lines(HEADER), mtime=0)[:-9])
    scanned = scan_results(path)
    assert scanned.keep == 0 and scanned.cut_tail and not scanned.needs_newline
    repair_tail(path, scanned)
    assert path.read_bytes() == b""
