"""conformance.outputs: the checks, the markers, the numbered backups and the all-or-nothing writes every attnconf
output goes through (the CLI's own torture is tests/conformance/test_output_torture.py).

Device nodes (/dev/null, /dev/full) are only ever examined: each test that names one asserts it is still a
character device afterwards.  Root ignores permission bits, so unwritable directories are paths under
/proc/self (which even root cannot create files in), and the read-only-file variant is skipped as root.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import stat
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conformance import outputs
from conformance.exits import Exit, OutputError, UsageError
from conformance.outputs import (
    Output,
    backup_path,
    check_output,
    check_outputs,
    is_own,
    marker,
    move_aside,
    with_marker,
    write_bytes,
    write_many,
    write_text,
)

ROOT = os.geteuid() == 0
DEVICES = ("/dev/null", "/dev/full")


def is_chardev(path: str) -> bool:
    return stat.S_ISCHR(os.stat(path).st_mode)


def leftovers(directory: Path) -> list[str]:
    """Temporary or probe files a write left behind."""
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp") or ".attnconf-probe." in p.name)


# ------------------------------------------------------------------------------------------------- markers


def test_text_markers_are_recognised_only_for_their_own_kind(tmp_path: Path) -> None:
    md = tmp_path / "a.md"
    md.write_text(with_marker("# Compare\n", "compare-md"))
    assert is_own(md, "compare-md")
    assert not is_own(md, "compare") and not is_own(md, "compare-m")  # a kind is never a prefix of another
    assert not is_own(md, "merge-md")
    html = tmp_path / "r.html"
    html.write_text(f"<!DOCTYPE html>\n{marker('report-html', 'html')}\n<html></html>\n")
    assert is_own(html, "report-html")


@pytest.mark.parametrize(
    "text",
    [
        "# my notes\n",  # a user's file
        "",  # empty
        "see <!-- attnconf-output: compare-md --> in the docs\n",  # the marker quoted inside prose
        "attnconf-output: compare-md\n",  # the bare words, not the marker line
        "1\n2\n3\n<!-- attnconf-output: compare-md -->\n",  # past the first three lines
    ],
)
def test_text_without_the_marker_line_is_not_own(tmp_path: Path, text: str) -> None:
    path = tmp_path / "x.md"
    path.write_text(text)
    assert not is_own(path, "compare-md")


def test_json_markers(tmp_path: Path) -> None:
    own = tmp_path / "s.json"
    own.write_text(json.dumps({"attnconf_output": "compare-summary", "x": [1, 2]}, indent=1))
    assert is_own(own, "compare-summary") and not is_own(own, "report-summary")
    one_line = tmp_path / "one.json"
    one_line.write_text(json.dumps({"attnconf_output": "run-summary", "v": float("nan")}) + "\n")
    assert is_own(one_line, "run-summary")
    nested = tmp_path / "nested.json"
    nested.write_text(json.dumps({"data": {"attnconf_output": "compare-summary"}}))
    assert not is_own(nested, "compare-summary")
    # a results file is JSON lines: never an output of any kind, even if a record quoted the key
    results = tmp_path / "r.jsonl"
    results.write_text(
        json.dumps({"type": "header", "attnconf_output": "run-summary"}) + "\n" + json.dumps({"type": "result"}) + "\n"
    )
    assert not is_own(results, "run-summary")
    broken = tmp_path / "broken.json"
    broken.write_text('{\n "attnconf_output": "compare-summary",\n')  # cut short
    assert not is_own(broken, "compare-summary")


def test_png_marker_is_the_software_chunk_of_the_report_figures() -> None:
    pytest.importorskip("matplotlib")
    from conformance.reporting.plots import PLOT_KIND, error_ratio_histograms

    png = error_ratio_histograms({"kern": [0.1, 0.5, 2.0]})
    assert png is not None and png.startswith(b"\x89PNG")
    assert outputs._png_software(png[:4096]) == [marker(PLOT_KIND).encode()]


def test_png_markers(tmp_path: Path) -> None:
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0))
    text = chunk(b"tEXt", b"Software\x00" + marker("report-plot").encode())
    idat, iend = chunk(b"IDAT", zlib.compress(b"\x00\x00")), chunk(b"IEND", b"")
    own = tmp_path / "own.png"
    own.write_bytes(outputs._PNG_SIGNATURE + ihdr + text + idat + iend)
    assert is_own(own, "report-plot") and not is_own(own, "report")
    late = tmp_path / "late.png"  # the chunk after the image data: not where attnconf puts it
    late.write_bytes(outputs._PNG_SIGNATURE + ihdr + idat + text + iend)
    assert not is_own(late, "report-plot")
    other = tmp_path / "other.png"
    other.write_bytes(outputs._PNG_SIGNATURE + ihdr + chunk(b"tEXt", b"Software\x00matplotlib") + idat + iend)
    assert not is_own(other, "report-plot")


def test_a_symlink_is_never_own_and_unreadable_things_are_not_own(tmp_path: Path) -> None:
    own = tmp_path / "own.md"
    own.write_text(with_marker("x\n", "k"))
    link = tmp_path / "link.md"
    link.symlink_to(own)
    assert is_own(own, "k") and not is_own(link, "k")
    assert not is_own(tmp_path / "absent.md", "k") and not is_own(tmp_path, "k")
    assert not is_own("/dev/null", "k") and is_chardev("/dev/null")


# ------------------------------------------------------------------------------------------------- backups

# names with glob metacharacters, compound and missing suffixes, leading dots, digits that look like backups
NAME = st.text(alphabet=st.sampled_from(list("ab1.*?[]-_ ")), min_size=1, max_size=12).filter(
    lambda s: s not in (".", "..") and "/" not in s
)
SUFFIX = st.sampled_from(["", ".jsonl", ".jsonl.gz", ".json.gz", ".md", ".html", ".png", ".tar.gz", ".1", ".gz"])


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stem=NAME, suffix=SUFFIX, decoys=st.lists(NAME, max_size=4), runs=st.integers(1, 4))
def test_backups_are_numbered_in_order_never_overwrite_and_keep_the_suffix(
    tmp_path_factory: pytest.TempPathFactory, stem: str, suffix: str, decoys: list[str], runs: int
) -> None:
    directory = tmp_path_factory.mktemp("b")
    path = directory / (stem + suffix)
    for decoy in decoys:  # siblings that are not backups of path: never counted, never touched
        d = directory / (decoy + suffix)
        if d != path:
            d.write_text("decoy")
    before = {p.name: p.read_text() for p in directory.iterdir()}
    backups = []
    for n in range(runs):
        path.write_text(f"generation {n}")
        expected = backup_path(path)
        assert expected.parent == directory and not expected.exists() and expected != path
        backups.append(move_aside(path))
        assert backups[-1] == expected and not path.exists()
    stem_part, kept = outputs._split(path.name)
    numbers = []
    for n, b in enumerate(backups):
        assert b.read_text() == f"generation {n}"  # each generation intact, under its own number
        assert b.name.startswith(stem_part + ".") and b.name.endswith(kept)
        numbers.append(int(b.name[len(stem_part) + 1 : len(b.name) - len(kept)]))
    assert numbers == sorted(set(numbers))  # increasing: the highest number is the newest
    for name, text in before.items():  # every decoy is as it was
        assert (directory / name).read_text() == text


def test_backup_names(tmp_path: Path) -> None:
    assert backup_path(tmp_path / "r.jsonl.gz") == tmp_path / "r.1.jsonl.gz"
    assert backup_path(tmp_path / "r.jsonl") == tmp_path / "r.1.jsonl"
    assert backup_path(tmp_path / "report.md") == tmp_path / "report.1.md"
    assert backup_path(tmp_path / "NOTES") == tmp_path / "NOTES.1"
    assert backup_path(tmp_path / ".hidden") == tmp_path / ".hidden.1"
    (tmp_path / "r.7.jsonl.gz").write_text("")
    (tmp_path / "r.x.jsonl.gz").write_text("")  # not a number: ignored
    (tmp_path / "r.9.jsonl").write_text("")  # another suffix: ignored
    assert backup_path(tmp_path / "r.jsonl.gz") == tmp_path / "r.8.jsonl.gz"
    (tmp_path / "r[1].1.md").write_text("")  # a glob metacharacter in the name is literal
    (tmp_path / "r1.5.md").write_text("")  # what r[1] would match as a glob
    assert backup_path(tmp_path / "r[1].md") == tmp_path / "r[1].2.md"


def test_move_aside_refuses_what_is_not_a_file_and_moves_a_symlink_itself(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for bad in (tmp_path, fifo, Path("/dev/null")):
        with pytest.raises(UsageError, match="not a regular file") as err:
            move_aside(bad)
        assert err.value.exit_code == Exit.USAGE
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and is_chardev("/dev/null")
    target = tmp_path / "mine.txt"
    target.write_text("mine")
    link = tmp_path / "out.md"
    link.symlink_to(target)
    backup = move_aside(link)
    assert backup.is_symlink() and backup.resolve() == target.resolve() and target.read_text() == "mine"
    with pytest.raises(OutputError):
        move_aside(tmp_path / "absent.md")


def test_move_aside_skips_a_number_taken_meanwhile(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text("data")
    real = outputs.backup_path
    calls = []

    def racing(p):
        b = real(p)
        if not calls:  # another process takes the number between the look and the link
            b.write_text("someone else's backup")
        calls.append(b)
        return b

    monkeypatch.setattr(outputs, "backup_path", racing)
    backup = move_aside(path)
    assert backup == tmp_path / "r.2.jsonl" and backup.read_text() == "data"
    assert (tmp_path / "r.1.jsonl").read_text() == "someone else's backup"


# -------------------------------------------------------------------------------------------------- checks


def test_an_input_is_refused_by_name_symlink_and_hard_link(tmp_path: Path) -> None:
    data = tmp_path / "results.jsonl"
    data.write_text("precious\n")
    sym = tmp_path / "sym.jsonl"
    sym.symlink_to(data)
    hard = tmp_path / "hard.jsonl"
    os.link(data, hard)
    for path in (data, sym, hard, tmp_path / "." / "results.jsonl"):
        with pytest.raises(UsageError, match="is an input of this command") as err:
            check_output(path, "--out", [data])
        assert err.value.exit_code == Exit.USAGE and type(err.value) is UsageError
    assert data.read_text() == "precious\n"


@pytest.mark.parametrize("kind", ["dir", "fifo", "socket", "/dev/null", "/dev/full", "link-to-device", "dot"])
def test_what_is_not_a_regular_file_is_refused_and_left_alone(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "x"
    if kind == "dir":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(path))
        s.close()
    elif kind == "link-to-device":
        path.symlink_to("/dev/full")
    elif kind == "dot":
        path = tmp_path / "."
    else:
        path = Path(kind)
    with pytest.raises(UsageError) as err:
        check_output(path, "--out")
    assert err.value.exit_code == Exit.USAGE and type(err.value) is UsageError
    assert "not a regular file" in str(err.value) or "names a directory" in str(err.value)
    with pytest.raises(UsageError):
        write_text(path, "x", kind="k")
    for device in DEVICES:
        assert is_chardev(device)
    if kind == "fifo":
        assert stat.S_ISFIFO(os.stat(path).st_mode)
    if kind == "dir":
        assert path.is_dir() and not list(path.iterdir())


@pytest.mark.parametrize("path", ["/proc/self/attnconf-out.md", "/proc/self/attnconf/out.md"])
def test_an_unwritable_directory_is_exit_3_even_for_root(path: str) -> None:
    with pytest.raises(OutputError) as err:
        check_output(path, "--out")
    assert err.value.exit_code == Exit.OUTPUT and "\n" not in str(err.value)
    with pytest.raises(OutputError):
        write_text(path, "x", kind="k")


def test_a_read_only_directory_and_file_are_exit_3(tmp_path: Path) -> None:
    if ROOT:
        pytest.skip("root writes into read-only directories and files: the /proc/self variant covers exit 3")
    ro = tmp_path / "ro"
    ro.mkdir()
    (ro / "keep.md").write_text("keep\n")
    ro.chmod(0o555)
    try:
        with pytest.raises(OutputError, match="not writable"):
            check_output(ro / "new.md", "--out")
        with pytest.raises(OutputError, match="not writable"):
            write_text(ro / "keep.md", "x", kind="k")
        assert (ro / "keep.md").read_text() == "keep\n"
    finally:
        ro.chmod(0o755)
    f = tmp_path / "f.md"
    f.write_text("keep\n")
    f.chmod(0o444)
    with pytest.raises(OutputError, match="read-only"):
        check_output(f, "--out")


def test_a_file_where_a_directory_should_be_is_refused(tmp_path: Path) -> None:
    (tmp_path / "FILE").write_text("a file\n")
    with pytest.raises(UsageError, match="cannot create its directory") as err:
        check_output(tmp_path / "FILE" / "sub" / "x.md", "--out")
    assert err.value.exit_code == Exit.USAGE


def test_the_directory_is_created_and_no_probe_is_left(tmp_path: Path) -> None:
    path = check_output(tmp_path / "a" / "b" / "x.md", "--out")
    assert path.parent.is_dir() and leftovers(path.parent) == [] and not path.exists()


def test_two_outputs_of_one_command_may_not_name_one_file(tmp_path: Path) -> None:
    a = tmp_path / "a.md"
    (tmp_path / "alias.md").symlink_to(a)
    with pytest.raises(UsageError, match="is also --out"):
        check_outputs([(a, "--out"), (tmp_path / "alias.md", "--json")])
    assert check_outputs([(a, "--out"), (None, "--json"), ("-", "--summary")]) == [a, None, None]


# -------------------------------------------------------------------------------------------------- writes


def test_own_output_is_replaced_and_anything_else_kept(tmp_path: Path, capsys) -> None:
    path = tmp_path / "c.md"
    write_text(path, with_marker("first\n", "compare-md"), kind="compare-md")
    write_text(path, with_marker("second\n", "compare-md"), kind="compare-md")
    assert path.read_text().endswith("second\n") and sorted(p.name for p in tmp_path.iterdir()) == ["c.md"]
    assert capsys.readouterr().err == ""
    path.write_text("the user's own notes\n")
    write_text(path, with_marker("third\n", "compare-md"), kind="compare-md")
    assert (tmp_path / "c.1.md").read_text() == "the user's own notes\n"
    assert f"kept it as {tmp_path / 'c.1.md'}" in capsys.readouterr().err
    other_kind = tmp_path / "c.md"  # an attnconf output of another kind is not this one's to replace
    write_text(other_kind, with_marker("merge\n", "merge-md"), kind="merge-md")
    assert (tmp_path / "c.2.md").read_text().endswith("third\n")
    assert leftovers(tmp_path) == []
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o666 & ~outputs._umask()  # not mkstemp's 0600


def test_kind_none_never_replaces_even_an_attnconf_output(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    write_bytes(path, b'{"type": "header"}\n', kind=None)
    write_bytes(path, b'{"type": "header", "n": 2}\n', kind=None, quiet=True)
    assert (tmp_path / "m.1.jsonl").read_bytes() == b'{"type": "header"}\n'


def test_a_symlink_at_the_path_is_moved_aside_and_its_target_untouched(tmp_path: Path) -> None:
    mine = tmp_path / "mine.md"
    mine.write_text(with_marker("own output, linked\n", "k"))
    link = tmp_path / "out.md"
    link.symlink_to(mine)
    write_text(link, with_marker("new\n", "k"), kind="k", quiet=True)
    assert not link.is_symlink() and link.read_text().endswith("new\n")
    assert mine.read_text().endswith("own output, linked\n") and (tmp_path / "out.1.md").is_symlink()
    dangling = tmp_path / "d.md"
    dangling.symlink_to(tmp_path / "nowhere")
    write_text(dangling, "x", kind="k", quiet=True)
    assert os.readlink(tmp_path / "d.1.md") == str(tmp_path / "nowhere")


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EIO, errno.EFBIG, errno.EDQUOT])
def test_a_failed_write_leaves_the_path_and_no_temporary_file(tmp_path: Path, monkeypatch, err: int) -> None:
    path = tmp_path / "c.md"
    path.write_text("before\n")

    def full(fd: int) -> None:
        raise OSError(err, os.strerror(err))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OutputError, match=os.strerror(err)) as exc:
        write_text(path, "after\n", kind="k")
    assert exc.value.exit_code == Exit.OUTPUT and "\n" not in str(exc.value)
    assert path.read_text() == "before\n" and leftovers(tmp_path) == [] and sorted(os.listdir(tmp_path)) == ["c.md"]


def test_write_many_is_all_or_nothing(tmp_path: Path, monkeypatch) -> None:
    a, b = tmp_path / "a.md", tmp_path / "b.json"
    a.write_text(with_marker("old a\n", "ka"))
    b.write_text("a user's b\n")

    def failing(fh):
        fh.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OutputError, match="--json .*No space left"):
        write_many([Output(a, with_marker("new a\n", "ka").encode(), "ka"), Output(b, failing, "kb", "--json")])
    assert a.read_text() == with_marker("old a\n", "ka") and b.read_text() == "a user's b\n"
    assert leftovers(tmp_path) == [] and sorted(os.listdir(tmp_path)) == ["a.md", "b.json"]

    def interrupted(fh):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_many([Output(a, interrupted, "ka")])
    assert leftovers(tmp_path) == [] and a.read_text() == with_marker("old a\n", "ka")


def test_a_device_that_appears_after_the_check_is_never_replaced(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "x.md"
    real = outputs._write_temp

    def swap(out):
        name = real(out)
        os.mkfifo(path)  # appears between the check and the rename
        return name

    monkeypatch.setattr(outputs, "_write_temp", swap)
    with pytest.raises(UsageError, match="a FIFO"):
        write_text(path, "x", kind="k")
    assert stat.S_ISFIFO(os.stat(path).st_mode) and leftovers(tmp_path) == []


def test_summary_json_carries_its_kind_and_stdout_stays_stdout(tmp_path: Path, capsys) -> None:
    from conformance.reporting.summary_json import write_summary

    path = tmp_path / "s.json"
    write_summary({"x": float("inf")}, path, "compare-summary")
    data = json.loads(path.read_text())
    assert data == {"attnconf_output": "compare-summary", "x": "inf"} and is_own(path, "compare-summary")
    write_summary({"x": 1}, path, "compare-summary")  # its own: replaced, no backup
    assert sorted(os.listdir(tmp_path)) == ["s.json"]
    write_summary({"x": 1}, "-", "compare-summary")
    assert json.loads(capsys.readouterr().out) == {"attnconf_output": "compare-summary", "x": 1}
    assert not (tmp_path / "-").exists()


@pytest.mark.parametrize("kind", ["fifo", "dir", "socket", "/dev/null", "/dev/loop0"])
def test_the_refusal_names_what_the_path_is_and_the_option(tmp_path: Path, kind: str) -> None:
    """One line: the option, the path, what it is instead of a regular file (write_text's option is --out unless
    told), and the path is left as it was."""
    path, what = tmp_path / kind, {"fifo": "a FIFO", "dir": "a directory", "socket": "a socket"}.get(kind)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dir":
        path.mkdir()
    elif kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(path))
        s.close()
    else:
        path = Path(kind)
        if not path.exists():
            pytest.skip(f"no {kind} here")
        what = "a character device" if is_chardev(kind) else "a block device"
    mode = os.stat(path).st_mode
    with pytest.raises(UsageError, match=rf"^--report {path}: is {what}, not a regular file; give a file path$"):
        check_output(path, "--report")
    if kind.startswith("/dev/"):
        assert os.stat(path).st_mode == mode
        return  # a device is only ever examined
    for write in (lambda: write_text(path, "x", kind="k"), lambda: write_bytes(path, b"x", kind="k")):
        with pytest.raises(UsageError, match=rf"^--out {path}: is {what}, not a regular file"):
            write()
    with pytest.raises(UsageError, match=rf"^--summary {path}: is {what}"):
        write_text(path, "x", kind="k", flag="--summary")
    assert os.stat(path).st_mode == mode


def test_anything_but_the_known_file_types_is_not_a_regular_file() -> None:
    assert outputs._what(stat.S_IFBLK) == "a block device" and outputs._what(stat.S_IFCHR) == "a character device"
    assert outputs._what(0) == "not a regular file"


def test_write_text_is_quiet_when_told(tmp_path: Path, capsys) -> None:
    path = tmp_path / "notes.md"
    path.write_text("the user's own\n")
    write_text(path, with_marker("x\n", "compare-md"), kind="compare-md", quiet=True)
    assert (tmp_path / "notes.1.md").read_text() == "the user's own\n" and capsys.readouterr().err == ""
    write_text(path, "é\n", kind=None)
    assert path.read_bytes() == "é\n".encode() and "kept it as" in capsys.readouterr().err
