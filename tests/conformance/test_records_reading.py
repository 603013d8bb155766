"""Reading a damaged results file: every corruption is either read exactly or refused with one line.

A valid file (two runs' headers, twelve results; plain JSON lines, and gzip written as a resumed run writes it,
one member per batch) is damaged in the ways files get damaged: cut at any byte (a killed writer), a flipped
byte, a garbled line in the middle, a line written twice, a cut or corrupt gzip member, bytes that are not text,
a line without end.  For each, :func:`conformance.records.load_results` either reads exactly the records that are
there (a cut file: a prefix of them) or raises :class:`ResultsFileError` whose message is one line naming the
file; never another exception, never changed content without a word.  The one exception is documented: plain
text has no checksum, so a flipped byte inside a value changes that one record (gzip's CRC refuses it).

A cut file is also resumed (:func:`conformance.running.outfile.read_for_resume`, :func:`repair_tail`, then the
missing records appended): wherever the writer was killed, the resumed file reads back as the original, strictly,
with no pair twice.
"""

from __future__ import annotations

import gzip
import json
import tempfile
import tracemalloc
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conformance.records import CheckResult, ErrorStats, Header, Status
from conformance.results_file import load_results, MAX_LINE, ResultsFileError
from conformance.results_writer import record_line

SETTINGS = settings(max_examples=150, suppress_health_check=list(HealthCheck))
#: how many damaged files the tests below try (the hypothesis examples, the exhaustive cuts): for the report
TRIED: dict[str, int] = {}


def _result(i: int, backend: str) -> CheckResult:
    stats = ErrorStats(1e-3 * i, 0.01, 1e-4, (i, 0, 1), 0.0, 0.1 * i, 1e-3, 1e-4, 1e-2, 0.999)
    return CheckResult(
        case_id=f"case{i:02d}-{'ab'[i % 2]}c{i}",
        backend=backend,
        family=backend.split("-")[0],
        status=Status.PASS if i % 5 else Status.FAIL,
        case={"requests": [[i, i + 1]], "num_heads": 2},
        reason="" if i % 5 else "max_error: planted",
        stats=stats if i % 3 == 0 else None,
    )


HEADERS = [Header(suite="smoke", backends={"kern-x": {"name": "kern-x"}}, env={"run": {"seed": s}}) for s in (0, 1)]
RESULTS = [_result(i, b) for i in range(6) for b in ("kern-x", "other-x")]
#: file order: a header, six results (a killed run), the resumed run's header, six results; batches of three
ORDER: list[Header | CheckResult] = [HEADERS[0], *RESULTS[:6], HEADERS[1], *RESULTS[6:]]
BATCHES = [ORDER[i : i + 3] for i in range(0, len(ORDER), 3)]
PLAIN = "".join(record_line(r) for r in ORDER).encode()
GZ = b"".join(gzip.compress("".join(record_line(r) for r in b).encode(), mtime=0) for b in BATCHES)
LINES = PLAIN.splitlines(keepends=True)


def _dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="attnconf-reading-"))


def _count(name: str) -> None:
    TRIED[name] = TRIED.get(name, 0) + 1


def outcome(path: Path, *, cut: bool = False, one_changed: bool = False) -> str:
    """How ``load_results`` took the damaged file: ``refused`` (one line naming it), ``exact``, ``prefix`` (a cut
    file: the records before the cut, only with ``cut``), ``changed`` (one record's value differs, only with
    ``one_changed``), ``noted`` (a record became one of an unknown type: ignored, and said by ``notes()``).
    Anything else fails the test."""
    try:
        f = load_results(path, need_results=False)
    except ResultsFileError as exc:
        assert "\n" not in str(exc) and str(exc).startswith(f"{path}: "), str(exc)
        return "refused"
    got = list(f.results)
    if got == RESULTS:
        return "exact"
    if cut and got == RESULTS[: len(got)]:
        return "prefix"
    if one_changed and len(got) == len(RESULTS) and sum(a != b for a, b in zip(got, RESULTS)) == 1:
        return "changed"
    if one_changed and f.other_records == 1 and len(got) == len(RESULTS) - 1:
        assert any("type this version does not know" in n for n in f.notes())
        return "noted"
    raise AssertionError(f"silently read other records: {len(got)} of {len(RESULTS)}, skipped {f.skipped}")


def test_the_valid_files_read_exactly(tmp_path: Path) -> None:
    for name, data in (("r.jsonl", PLAIN), ("r.jsonl.gz", GZ), ("gz-content.jsonl", GZ)):
        (tmp_path / name).write_bytes(data)
        f = load_results(tmp_path / name)
        assert list(f.results) == RESULTS and list(f.headers) == HEADERS and not f.skipped
        assert f.gzip == (data == GZ) and f.keep == len(data) and not f.cut_tail and not f.needs_newline
    assert len(gzip.decompress(GZ)) == len(PLAIN) and gzip.decompress(GZ) == PLAIN  # members read as one stream


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["plain", "gzip"])
def test_a_cut_at_any_byte_reads_a_prefix_or_is_refused_and_resumes_exactly(kind: str, monkeypatch) -> None:
    """Every byte a killed writer could have stopped at: the strict reader gives the records before the cut (at a
    line or member boundary) or refuses; the resume path never refuses, repairs, and after the missing records
    are appended the file reads back strictly as the original, no pair twice."""
    from conformance.results_writer import Appender
    from conformance.running.outfile import read_for_resume, repair_tail

    monkeypatch.setattr("os.fsync", lambda fd: None)  # durability is not under test here: 10,000 files
    data = PLAIN if kind == "plain" else GZ
    d = _dir()
    seen = set()
    for cut in range(len(data)):
        _count(f"cut-{kind}")
        path = d / ("r.jsonl" if kind == "plain" else "r.jsonl.gz")
        path.write_bytes(data[:cut])
        seen.add(outcome(path, cut=True) if cut else "empty")
        prev = read_for_resume(path)
        if prev is None:
            assert cut == 0
            continue
        assert len(prev.skipped) <= 1 and (not prev.skipped or prev.cut_tail), prev.skipped
        repair_tail(path, prev)
        if path.stat().st_size:
            have = load_results(path, need_header=False, need_results=False)
            assert not have.skipped and list(have.results) == RESULTS[: len(have.results)]
            assert list(have.results) == list(prev.results)
        done = {(r.case_id, r.backend) for r in prev.results}
        with Appender(path) as out:  # what --resume then appends: its header, every missing pair once
            out.write(HEADERS[1])
            for r in RESULTS:
                if (r.case_id, r.backend) not in done:
                    out.write(r)
        final = load_results(path)  # strict: no skipped line, no duplicate
        assert _by_pair(final.results) == _by_pair(RESULTS)
        assert is_gz(path) == (kind == "gzip")
    assert {"refused", "prefix"} <= seen and (kind == "gzip" or "exact" in seen)


def _by_pair(results) -> list[CheckResult]:
    return sorted(results, key=lambda r: (r.case_id, r.backend))


def is_gz(path: Path) -> bool:
    return path.read_bytes()[:2] == b"\x1f\x8b"


@SETTINGS
@given(at=st.integers(0, len(GZ) - 1), bit=st.integers(0, 7))
def test_a_flipped_byte_in_gzip_is_refused_or_harmless(at: int, bit: int) -> None:
    """gzip's CRC covers the data: a flipped bit is refused, or it sits where it changes nothing (the header's
    time stamp, say) and the file reads exactly."""
    _count("flip-gzip")
    path = _dir() / "r.jsonl.gz"
    damaged = bytearray(GZ)
    damaged[at] ^= 1 << bit
    path.write_bytes(bytes(damaged))
    assert outcome(path) in ("refused", "exact")


@SETTINGS
@given(at=st.integers(0, len(PLAIN) - 1), bit=st.integers(0, 7))
def test_a_flipped_byte_in_plain_text_changes_at_most_its_record(at: int, bit: int) -> None:
    """Plain text has no checksum: a flipped bit is refused (not JSON, not UTF-8, not a record, a pair twice), or
    reads exactly (a header's value), or changes the one record it is in (documented: use gzip for a CRC)."""
    _count("flip-plain")
    path = _dir() / "r.jsonl"
    damaged = bytearray(PLAIN)
    damaged[at] ^= 1 << bit
    path.write_bytes(bytes(damaged))
    assert outcome(path, one_changed=True) in ("refused", "exact", "changed", "noted")


@SETTINGS
@given(where=st.integers(1, len(LINES) - 1), junk=st.one_of(st.text(min_size=1), st.binary(min_size=1)))
def test_a_garbled_line_in_the_middle_is_refused(where: int, junk: str | bytes) -> None:
    """Text or bytes between two records: refused by the strict reader (naming the line), and by --resume
    (``read_for_resume``) unless allowed; blank text changes nothing."""
    from conformance.exits import UsageError
    from conformance.running.outfile import read_for_resume

    _count("garbled-line")
    raw = junk.encode("utf-8", "surrogatepass") if isinstance(junk, str) else junk
    path = _dir() / "r.jsonl"
    path.write_bytes(b"".join(LINES[:where]) + raw + b"\n" + b"".join(LINES[where:]))
    got = outcome(path)
    if not raw.strip():
        assert got == "exact"
        return
    try:
        json.loads(raw)
        maybe_record = True  # an object of an unknown type is counted and noted, as the format promises
    except (ValueError, RecursionError):
        maybe_record = False
    if got != "refused":
        assert maybe_record and load_results(path).other_records >= 1
        return
    with pytest.raises(UsageError, match=r"^--resume: .*(line|UTF-8|gzip)") as refused:
        read_for_resume(path)
    assert "\n" not in str(refused.value)


@SETTINGS
@given(which=st.integers(0, len(LINES) - 1), after=st.integers(0, len(LINES) - 1))
def test_a_line_written_twice_is_refused_unless_it_is_a_header(which: int, after: int) -> None:
    """A result line twice is a pair recorded twice: refused, naming the count and the first pair (and
    ``--drop-duplicates`` keeps the last); a header twice is harmless (a resumed file has several)."""
    _count("duplicated-line")
    after = max(after, which)
    path = _dir() / "r.jsonl"
    path.write_bytes(b"".join(LINES[: after + 1]) + LINES[which] + b"".join(LINES[after + 1 :]))
    is_header = json.loads(LINES[which])["type"] == "header"
    got = outcome(path)
    assert got == ("exact" if is_header else "refused")
    if not is_header:
        with pytest.raises(ResultsFileError, match=r"records 1 \(case, backend\) pair twice, the first case"):
            load_results(path)
        kept = load_results(path, drop_duplicates=True)
        assert kept.dropped_duplicates == 1 and _by_pair(kept.results) == _by_pair(RESULTS)


def test_gzip_damage_that_is_not_a_cut_is_refused(tmp_path: Path) -> None:
    """Plain text appended to gzip data (what --resume did before), a corrupt member in the middle, a cut member
    with complete members after it: each refused with one line; zero padding after the last member is read."""
    members = [gzip.compress("".join(record_line(r) for r in b).encode(), mtime=0) for b in BATCHES]
    cases = {
        "plain-after-gzip.jsonl.gz": (GZ + PLAIN, "holds bytes that are not gzip data after its gzip member"),
        "one-byte-after-gzip.jsonl.gz": (GZ + b"x", "holds bytes that are not gzip data after its gzip member"),
        "corrupt-middle.jsonl.gz": (
            b"".join(members[:2]) + members[2][:-8] + b"\0\0\0\0\0\0\0\0" + b"".join(members[3:]),
            "corrupt gzip data in the member starting at byte",
        ),
        "cut-middle.jsonl.gz": (b"".join(members[:2]) + members[2][:30] + b"".join(members[3:]), "corrupt gzip data"),
        "first-member-cut.jsonl.gz": (GZ[:100], "not a complete gzip file (the last gzip member is cut short"),
    }
    for name, (data, says) in cases.items():
        _count("gzip-damage")
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ResultsFileError) as refused:
            load_results(tmp_path / name)
        assert says in str(refused.value) and "\n" not in str(refused.value), (name, str(refused.value))
    (tmp_path / "padded.jsonl.gz").write_bytes(GZ + b"\0" * 1000)
    assert list(load_results(tmp_path / "padded.jsonl.gz").results) == RESULTS


def test_text_that_is_not_utf8_or_has_no_end_is_refused_in_bounded_memory(tmp_path: Path) -> None:
    """Binary, not UTF-8, a line longer than MAX_LINE (plain, and gzip that inflates to it): one line each, and
    reading the endless line does not hold more than about MAX_LINE in memory."""
    cases = {
        "binary.jsonl": (bytes(range(256)) * 64, "not UTF-8 text (byte"),
        "latin1.jsonl": (PLAIN.replace(b"case03", "cäse03".encode("latin-1")), "not UTF-8 text (byte"),
        "endless.jsonl": (b"{" * (MAX_LINE + 10), f"line 1 is longer than {MAX_LINE // 2**20} MiB"),
        "endless.jsonl.gz": (gzip.compress(PLAIN + b"x" * (MAX_LINE + 10), 1), f"line {len(LINES) + 1} is longer than"),
    }
    for name, (data, says) in cases.items():
        _count("unreadable")
        (tmp_path / name).write_bytes(data)
        tracemalloc.start()
        try:
            with pytest.raises(ResultsFileError) as refused:
                load_results(tmp_path / name)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert says in str(refused.value) and "\n" not in str(refused.value), (name, str(refused.value))
        assert peak < 3 * MAX_LINE, f"{name}: {peak / 2**20:.0f} MiB to refuse it"


def test_a_killed_writers_cut_tail_is_one_skipped_line_that_resume_drops(tmp_path: Path) -> None:
    """The tail a SIGKILL leaves: a cut last line (plain) or a cut last member (gzip) is one skipped line, marked
    ``cut_tail``, with ``keep`` at the end of the last complete line or member; a complete last line that only
    lacks its newline is kept."""
    from conformance.running.outfile import repair_tail

    plain = tmp_path / "r.jsonl"
    plain.write_bytes(PLAIN[:-40])
    f = load_results(plain, allow_skipped=True)
    assert f.cut_tail and f.keep == len(PLAIN) - len(LINES[-1]) and len(f.results) == len(RESULTS) - 1
    assert str(f.skipped[-1]) == f"line {len(LINES)}: not JSON (the last line, cut short)"
    plain.write_bytes(PLAIN[:-1])
    f = load_results(plain)
    assert not f.skipped and f.needs_newline and list(f.results) == RESULTS
    repair_tail(plain, f)
    assert plain.read_bytes() == PLAIN
    gz = tmp_path / "r.jsonl.gz"
    last = len(gzip.compress("".join(record_line(r) for r in BATCHES[-1]).encode(), mtime=0))
    gz.write_bytes(GZ[:-5])
    f = load_results(gz, allow_skipped=True)
    assert f.cut_tail and f.keep == len(GZ) - last and len(f.results) == len(RESULTS) - len(BATCHES[-1])
    assert f.skipped[-1].reason.startswith(f"the last gzip member is cut short (from byte {len(GZ) - last}")
    repair_tail(gz, f)
    assert gz.read_bytes() == GZ[:-last]


@pytest.mark.parametrize("bad", range(6))
def test_skipped_lines_are_counted_and_the_first_three_named(bad: int, tmp_path: Path) -> None:
    """The refusal (and a lenient reader's summary) counts every skipped line and names the first three, then says
    how many more there are; a file that skipped nothing has an empty summary."""
    path = tmp_path / "r.jsonl"
    path.write_bytes(b"".join([LINES[0], *[b"garbage\n"] * bad, *LINES[1:]]))
    named = "; ".join(f"line {2 + i}: not JSON" for i in range(min(bad, 3)))
    more = f"; +{bad - 3} more" if bad > 3 else ""
    summary = f"{bad} line{'s' if bad != 1 else ''} skipped ({named}{more})" if bad else ""
    f = load_results(path, allow_skipped=True)
    assert len(f.skipped) == bad and f.skipped_summary() == summary
    if bad:
        with pytest.raises(ResultsFileError) as exc:
            load_results(path)
        assert str(exc.value) == f"{path}: {summary}"


def test_newer_schema_loads_and_says_so(tmp_path: Path) -> None:
    """A record of a newer schema loads (the format promises it) and ``notes()`` says so, once per file."""
    path = tmp_path / "future.jsonl"
    lines = [json.loads(x) for x in LINES]
    lines[3]["schema"] = 7
    lines[3]["later"] = {"x": 1}
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    f = load_results(path)
    assert list(f.results) == RESULTS and f.schema == 7 and f.newer
    assert f.notes() == ["written by a newer attnconf (schema 7 > 1); fields this version does not know are ignored"]
    assert load_results(tmp_path.parent / tmp_path.name / "future.jsonl").notes()  # stable
    _count("newer-schema")


def test_zlib_errors_never_escape() -> None:
    """Guard of the guard: the reader turns every zlib error into ResultsFileError (the tests above rely on it)."""
    path = _dir() / "bad.jsonl.gz"
    path.write_bytes(b"\x1f\x8b\x08\x00" + b"\xff" * 64)
    with pytest.raises(ResultsFileError):
        load_results(path)
    assert issubclass(ResultsFileError, ValueError) and not issubclass(zlib.error, ValueError)
    _count("gzip-damage")


# ------------------------------------------------------------------------------------------ every deciding reader

GOOD_HEADER = Header(
    suite="smoke",
    backends={"kern-x": {"name": "kern-x", "family": "kern"}, "other-x": {"name": "other-x", "family": "other"}},
    env={"run": {"seed": 0}},
    argv=["attnconf", "run", "--suite", "smoke"],
    sweep={"suite": "smoke", "seed": 0, "tol": []},
)
GOOD = "".join(record_line(r) for r in (GOOD_HEADER, *RESULTS)).encode()


def _readers(tmp_path: Path, bad: Path) -> dict[str, list[str]]:
    """The command line of every reader that decides something from a results file, reading ``bad``."""
    good = tmp_path / "good.jsonl"
    good.write_bytes(GOOD)
    return {
        "merge": ["merge", str(bad), "--out", str(tmp_path / "merged.jsonl")],
        "report": ["report", str(bad), "--out", str(tmp_path / "report")],
        "compare": ["compare", str(good), str(bad)],
        "ledger audit": ["ledger", "audit", str(bad), "--no-suites"],
        "run --resume": "run --suite smoke --case mha_h4_kv4_d64_bf16_s_pf_contig-* --backend sdpa-cpu --device cpu "
        f"--no-progress --resume --out {bad}".split(),
    }


@pytest.fixture(scope="module")
def endless(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("endless") / "endless.jsonl"
    path.write_bytes(b"[" * (MAX_LINE + 10))  # a file without newlines: once MemoryError in report
    return path


UNREADABLE = {
    "binary": (bytes(range(256)) * 16, "not UTF-8 text (byte 128: invalid start byte, line 2"),
    "truncated-gzip": (GZ[:100], "not a complete gzip file (the last gzip member is cut short (from byte 0"),
    "not-utf8": (GOOD.replace(b"case03", b"c\xe4se03"), "not UTF-8 text (byte"),
    "plain-after-gzip": (gzip.compress(GOOD) + GOOD, "holds bytes that are not gzip data after its gzip member"),
    "gzip-cut-in-the-middle": (GZ[:300] + GZ[600:], "corrupt gzip data in the member starting at byte"),
}


@pytest.mark.parametrize("reader", ["merge", "report", "compare", "ledger audit", "run --resume"])
@pytest.mark.parametrize("bad", [*UNREADABLE, "endless"])
def test_every_reader_refuses_an_unreadable_file_with_one_line(
    reader: str, bad: str, tmp_path: Path, endless: Path, capsys
) -> None:
    from conformance.cli import main

    _count("unreadable-at-a-reader")
    if bad == "endless":
        path, says = endless, f"line 1 is longer than {MAX_LINE // 2**20} MiB"
    else:
        path = tmp_path / f"{bad}.jsonl"
        data, says = UNREADABLE[bad]
        path.write_bytes(data)
    before = path.read_bytes()[:4096]
    if (bad, reader) == ("truncated-gzip", "run --resume"):  # a killed writer's first member: dropped, not refused
        from conformance.running.outfile import read_for_resume

        prev = read_for_resume(path)
        assert prev is not None and prev.cut_tail and prev.keep == 0 and not prev.results
        return
    capsys.readouterr()
    assert main(_readers(tmp_path, path)[reader]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err and str(path) in lines[0] and says in lines[0], err
    assert path.read_bytes()[:4096] == before


@pytest.mark.parametrize("reader", ["merge", "report", "compare", "ledger audit"])
def test_every_reader_refuses_a_pair_twice_unless_told_to_drop(reader: str, tmp_path: Path, capsys) -> None:
    """One line naming the file, the count and the first pair; ``--drop-duplicates`` keeps the last record of
    each pair and the summary counts the others."""
    from conformance.cli import main

    _count("duplicates-at-a-reader")
    lines = GOOD.splitlines(keepends=True)
    twice = tmp_path / "twice.jsonl"
    twice.write_bytes(b"".join(lines) + lines[3] + lines[5])
    args = _readers(tmp_path, twice)[reader]
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    first = RESULTS[2]
    says = f"{twice}: records 2 (case, backend) pairs twice, the first {first.case_id} on {first.backend} (lines 4 "
    assert len(err.splitlines()) == 1 and says in err and "--drop-duplicates" in err, err
    summary = tmp_path / "summary.json"
    extra = {
        "merge": ["--summary", str(summary)],
        "report": ["--json", str(summary)],
        "compare": ["--json", str(summary)],
        "ledger audit": ["--json"],
    }[reader]
    assert main([*args, "--drop-duplicates", *extra]) == 0
    out, err = capsys.readouterr()
    assert f"{twice}: 2 duplicated (case, backend) records dropped (--drop-duplicates" in err
    counted = {
        "merge": lambda: "2 duplicated (case, backend) records dropped" in summary.read_text(),
        "report": lambda: json.loads(summary.read_text())["files"][0]["duplicates_dropped"] == 2,
        "compare": lambda: any("2 duplicated" in n for n in json.loads(summary.read_text())["notes"]),
        "ledger audit": lambda: json.loads(out)["duplicates_dropped"] == {str(twice): 2},
    }[reader]
    assert counted()


@pytest.mark.parametrize("reader", ["merge", "report", "compare", "ledger audit"])
def test_a_newer_writers_file_is_read_and_said_once_or_refused_by_merge(reader: str, tmp_path: Path, capsys) -> None:
    """compare, report and ledger audit read what they understand and say so once per file on stderr; merge
    rewrites records, which would drop the fields this version does not know, so it refuses."""
    from conformance.cli import main

    _count("newer-schema-at-a-reader")
    lines = [json.loads(x) for x in GOOD.splitlines()]
    for x in lines[:4]:
        x["schema"] = 2
        x["from_the_future"] = [1, 2]
    newer = tmp_path / "newer.jsonl"
    newer.write_text("".join(json.dumps(x) + "\n" for x in lines))
    capsys.readouterr()
    code = main(_readers(tmp_path, newer)[reader])
    err = capsys.readouterr().err
    note = f"{newer}: written by a newer attnconf (schema 2 > 1)"
    if reader == "merge":
        assert code == 2 and note in err and "merge it with that version" in err and len(err.splitlines()) == 1
    else:
        assert code == 0, err
        assert err.count(note) == 1 and "fields this version does not know are ignored" in err


def test_every_line_carries_its_type_and_schema() -> None:
    """Readers of later versions tell a header from a record, and the format's version, by these two keys."""
    from conformance.records import SCHEMA

    header = Header(suite="smoke", backends={}, env={})
    record = CheckResult("c", "b", "f", Status.PASS, {})
    assert (header.to_json()["type"], header.to_json()["schema"]) == ("header", SCHEMA)
    assert (record.to_json()["type"], record.to_json()["schema"]) == ("result", SCHEMA)
    assert json.loads(record_line(header))["schema"] == SCHEMA == 1


def test_a_pass_with_several_nonfinite_statistics_names_each_in_its_reason() -> None:
    from conformance.records import NONFINITE_PASS

    stats = ErrorStats(
        max_abs=float("nan"),
        max_rel=0.0,
        mean_abs=float("inf"),
        worst=(0, 0, 0),
        mismatch_frac=0.0,
        error_ratio=0.1,
        baseline_max_abs=1.0,
        baseline_mean_abs=1.0,
        allowed_max_abs=1.0,
        cosine=1.0,
        nonfinite=2,
    )
    judged = CheckResult("c", "b", "f", Status.PASS, {}, stats=stats).judged()
    assert judged.reason == f"{NONFINITE_PASS} (max_abs=nan, mean_abs=inf, nonfinite=2)"
