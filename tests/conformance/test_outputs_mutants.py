"""conformance.outputs: the edges the broad tests (tests/conformance/test_outputs.py) leave open: where a PNG or
JSON marker is looked for and where not, the numbered backup of unusual names, and what :func:`move_aside` does
and says when a hard link, a rename or an unlink fails (those failures are simulated: root ignores permissions).
"""

from __future__ import annotations

import errno
import fnmatch
import json
import os
import re
import stat
import struct
import zlib
from pathlib import Path

import pytest

from conformance import outputs
from conformance.exits import OutputError, UsageError
from conformance.outputs import backup_path, is_own, marker, move_aside, write_bytes

# ---------------------------------------------------------------------------------------------------- PNG


def chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


SIG = outputs._PNG_SIGNATURE
IHDR = chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0))
IDAT = chunk(b"IDAT", zlib.compress(b"\x00\x00"))
IEND = chunk(b"IEND", b"")
SOFTWARE = b"Software\x00" + marker("report-plot").encode()


def test_a_png_whose_head_ends_inside_a_chunk_header_is_still_recognised(tmp_path: Path) -> None:
    """Only the first 4 KiB of a PNG are read; a chunk header cut by that limit ends the search, the marker before
    it still counts."""
    prefix = SIG + IHDR + chunk(b"tEXt", SOFTWARE)
    filler = chunk(b"prVt", b"\x00" * (outputs._HEAD - 3 - len(prefix) - 12))  # the next header starts 3 bytes short
    png = prefix + filler + chunk(b"IDAT", b"\x00" * 2000) + IEND
    assert len(prefix + filler) == outputs._HEAD - 3
    path = tmp_path / "big.png"
    path.write_bytes(png)
    assert is_own(path, "report-plot")
    short = tmp_path / "short.png"  # the file itself ends 3 bytes into a header
    short.write_bytes(SIG + IHDR + chunk(b"tEXt", SOFTWARE) + b"\x00\x00\x00")
    assert is_own(short, "report-plot")


def test_a_png_chunk_length_is_unsigned_so_an_enormous_chunk_hides_what_follows(tmp_path: Path) -> None:
    """A chunk declaring nearly 4 GiB (more than the file holds) swallows the rest: a marker after its header is
    inside it, never read (a damaged PNG is kept, not replaced)."""
    bogus = struct.pack(">I", 0xFFFFFFFF) + b"prVt" + b"\x00\x00\x00"
    path = tmp_path / "damaged.png"
    path.write_bytes(SIG + IHDR + bogus + chunk(b"tEXt", SOFTWARE) + IDAT + IEND)
    assert not is_own(path, "report-plot")


def test_a_software_chunk_after_the_png_ends_is_not_the_marker(tmp_path: Path) -> None:
    """The image ends at IEND: bytes appended after it, even a Software chunk, are not part of the image."""
    path = tmp_path / "appended.png"
    path.write_bytes(SIG + IHDR + IEND + chunk(b"tEXt", SOFTWARE))
    assert not is_own(path, "report-plot")


@pytest.mark.parametrize("ctype", [b"zTXt", b"iTXt", b"prVt"])
def test_only_a_text_chunk_carries_the_png_marker(tmp_path: Path, ctype: bytes) -> None:
    """The marker is a ``tEXt`` chunk; the same bytes in a chunk of another type are not it."""
    path = tmp_path / "other.png"
    path.write_bytes(SIG + IHDR + chunk(ctype, SOFTWARE) + IDAT + IEND)
    assert not is_own(path, "report-plot")


# --------------------------------------------------------------------------------------------------- JSON


def test_a_json_summary_with_leading_whitespace_is_recognised(tmp_path: Path) -> None:
    """Whitespace before a JSON summary's opening brace does not hide its key."""
    body = json.dumps({"attnconf_output": "compare-summary", "x": 1}, indent=1)
    for lead in ("\n", "  ", "\n\t \n"):
        path = tmp_path / "s.json"
        path.write_text(lead + body + "\n")
        assert is_own(path, "compare-summary") and not is_own(path, "report-summary")


def test_a_pretty_printed_summary_is_parsed_whole_whatever_follows_its_head(tmp_path: Path) -> None:
    """A JSON summary whose first line is not a whole object is parsed whole: its key counts even when the file
    goes on past the 4 KiB head (here blank lines)."""
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"attnconf_output": "compare-summary"}, indent=1) + "\n" * 5000)
    assert path.stat().st_size > outputs._HEAD
    assert is_own(path, "compare-summary")


def test_a_file_that_starts_with_a_whole_json_line_is_decided_by_that_line(tmp_path: Path) -> None:
    """A first line that is a whole JSON object makes the file JSON lines (a results file): it is own only when it
    ends within the head; one that goes on past 4 KiB is never own, however it continues."""
    line = json.dumps({"attnconf_output": "run-summary"}) + "\n"
    short = tmp_path / "short.json"
    short.write_text(line + "\n")
    assert is_own(short, "run-summary")
    long = tmp_path / "long.json"
    long.write_text(line + "\n" * 5000)
    assert not is_own(long, "run-summary")


def test_json_larger_than_the_limit_is_never_parsed_and_never_own(tmp_path: Path, monkeypatch) -> None:
    """A JSON summary of exactly the size limit is parsed and recognised; one byte over is not own (backed up)."""
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"attnconf_output": "compare-summary", "x": [1, 2, 3]}, indent=1))
    size = path.stat().st_size
    monkeypatch.setattr(outputs, "_JSON_MAX", size)
    assert is_own(path, "compare-summary")
    monkeypatch.setattr(outputs, "_JSON_MAX", size - 1)
    assert not is_own(path, "compare-summary")


def test_a_text_marker_past_the_first_4_kib_does_not_count(tmp_path: Path) -> None:
    """Only the first 4 KiB of a file are read (a large file is never read whole): a marker line that starts past
    them, even on the second line, is not seen."""
    path = tmp_path / "long.md"
    path.write_text("x" * 5000 + "\n" + marker("compare-md", "html") + "\n")
    assert not is_own(path, "compare-md")
    near = tmp_path / "near.md"
    near.write_text("x" * 4000 + "\n" + marker("compare-md", "html") + "\n")
    assert is_own(near, "compare-md")


# ------------------------------------------------------------------------------------------------ backups


def test_backup_names_of_dotted_and_suffix_only_names(tmp_path: Path) -> None:
    """The number goes before the last suffix (a compound ``.jsonl.gz`` kept whole); a name that is only a
    compound suffix is a hidden file with a stem of its own."""
    assert backup_path(tmp_path / "report.v2.md") == tmp_path / "report.v2.1.md"
    assert backup_path(tmp_path / "r.x.jsonl") == tmp_path / "r.x.1.jsonl"
    assert backup_path(tmp_path / "r.x.jsonl.gz") == tmp_path / "r.x.1.jsonl.gz"
    assert backup_path(tmp_path / ".jsonl.gz") == tmp_path / ".jsonl.1.gz"
    assert backup_path(tmp_path / ".tar.gz") == tmp_path / ".tar.1.gz"


def test_only_names_with_the_exact_stem_and_suffix_are_backups(tmp_path: Path, monkeypatch) -> None:
    """Where globbing ignores case (as on case-insensitive file systems), ``r.5.MD`` is still not a backup of
    ``r.md``: only the exact stem and suffix count, and every match is looked at."""
    (tmp_path / "r.5.MD").write_text("")
    (tmp_path / "r.3.md").write_text("")

    def insensitive(self: Path, pattern: str):
        rx = re.compile(fnmatch.translate(pattern), re.IGNORECASE)
        return sorted((p for p in self.iterdir() if rx.match(p.name)), key=lambda p: p.name.islower())

    monkeypatch.setattr(Path, "glob", insensitive)
    assert [p.name for p in (tmp_path).glob("r.*.md")] == ["r.5.MD", "r.3.md"]
    assert backup_path(tmp_path / "r.md") == tmp_path / "r.4.md"


# -------------------------------------------------------------------------------------------- move_aside


def test_move_aside_names_the_option_default_out(tmp_path: Path) -> None:
    """Without a flag, move_aside's messages name ``--out``: a refusal and a path that cannot be examined."""
    with pytest.raises(UsageError, match=rf"^--out {re.escape(str(tmp_path))}: is a directory, not a regular file"):
        move_aside(tmp_path)
    absent = tmp_path / "absent.md"
    with pytest.raises(OutputError, match=rf"^--out {re.escape(str(absent))}: cannot be examined: No such file or "):
        move_aside(absent)
    with pytest.raises(OutputError) as err:
        move_aside(absent, "--report")
    assert str(err.value) == f"--report {absent}: cannot be examined: No such file or directory"


def no_hard_links(monkeypatch, err: int) -> None:
    def link(src, dst, *, follow_symlinks=True):
        raise OSError(err, os.strerror(err))

    monkeypatch.setattr(os, "link", link)


@pytest.mark.parametrize("err", [errno.EPERM, errno.EXDEV, errno.ENOTSUP, errno.EMLINK])
def test_without_hard_links_the_file_is_renamed_to_its_backup(tmp_path: Path, monkeypatch, err: int) -> None:
    """On a file system without hard links the file is renamed to its first free backup instead."""
    path = tmp_path / "r.jsonl"
    path.write_text("data")
    no_hard_links(monkeypatch, err)
    backup = move_aside(path)
    assert backup == tmp_path / "r.1.jsonl" and backup.read_text() == "data" and not path.exists()


def test_without_hard_links_a_number_taken_meanwhile_is_skipped(tmp_path: Path, monkeypatch) -> None:
    """The rename fallback never overwrites a backup that appeared meanwhile: it takes the next number."""
    path = tmp_path / "r.jsonl"
    path.write_text("data")
    no_hard_links(monkeypatch, errno.EXDEV)
    real = outputs.backup_path
    calls: list[Path] = []

    def racing(p):
        b = real(p)
        if not calls:
            b.write_text("someone else's backup")
        calls.append(b)
        return b

    monkeypatch.setattr(outputs, "backup_path", racing)
    backup = move_aside(path)
    assert backup == tmp_path / "r.2.jsonl" and backup.read_text() == "data" and not path.exists()
    assert (tmp_path / "r.1.jsonl").read_text() == "someone else's backup"


def test_a_failed_rename_is_exit_3_with_the_reason_and_keeps_the_file(tmp_path: Path, monkeypatch) -> None:
    """When the rename fallback fails: one line naming the option, the path, the backup and the reason; the file
    stays where it was."""
    path = tmp_path / "r.jsonl"
    path.write_text("data")
    no_hard_links(monkeypatch, errno.EPERM)

    def rename(self, target):
        raise OSError(errno.EACCES, os.strerror(errno.EACCES))

    monkeypatch.setattr(Path, "rename", rename)
    with pytest.raises(OutputError) as exc:
        move_aside(path, "--json")
    assert str(exc.value) == f"--json {path}: cannot move it to {tmp_path / 'r.1.jsonl'}: Permission denied"
    assert path.read_text() == "data" and sorted(os.listdir(tmp_path)) == ["r.jsonl"]


def test_a_failed_hard_link_is_exit_3_with_the_reason_and_keeps_the_file(tmp_path: Path, monkeypatch) -> None:
    """A hard link that fails for another reason than "no hard links here" (an I/O error): one line with the
    reason, the file untouched and no backup."""
    path = tmp_path / "r.jsonl"
    path.write_text("data")
    no_hard_links(monkeypatch, errno.EIO)
    with pytest.raises(OutputError) as exc:
        move_aside(path)
    assert str(exc.value) == f"--out {path}: cannot move it to {tmp_path / 'r.1.jsonl'}: Input/output error"
    assert path.read_text() == "data" and sorted(os.listdir(tmp_path)) == ["r.jsonl"]


def test_a_backup_whose_original_cannot_be_removed_is_exit_3_and_loses_nothing(tmp_path: Path, monkeypatch) -> None:
    """Linked to its backup but not removable: one line saying both, and the data is in both places."""
    path = tmp_path / "r.jsonl"
    path.write_text("data")
    real = Path.unlink

    def unlink(self, missing_ok=False):
        if self == path:
            raise OSError(errno.EACCES, os.strerror(errno.EACCES))
        return real(self, missing_ok)

    monkeypatch.setattr(Path, "unlink", unlink)
    with pytest.raises(OutputError) as exc:
        move_aside(path)
    backup = tmp_path / "r.1.jsonl"
    assert str(exc.value) == f"--out {path}: backed up to {backup} but cannot be removed: Permission denied"
    assert path.read_text() == "data" and backup.read_text() == "data"


def test_move_aside_gives_up_after_100_numbers_taken_meanwhile(tmp_path: Path, monkeypatch) -> None:
    """When other processes keep taking the number, move_aside tries 100 numbers, then fails with one line; the
    file stays."""
    path = tmp_path / "r.jsonl"
    path.write_text("data")
    taken = tmp_path / "r.1.jsonl"
    taken.write_text("someone else's backup")
    calls = []

    def always_taken(p):
        calls.append(p)
        return taken

    monkeypatch.setattr(outputs, "backup_path", always_taken)
    with pytest.raises(OutputError) as exc:
        move_aside(path)
    assert str(exc.value) == f"--out {path}: no free numbered backup name found"
    assert len(calls) == 100 and path.read_text() == "data" and taken.read_text() == "someone else's backup"


# ------------------------------------------------------------------------------------------------- writes


def test_write_bytes_says_so_when_it_keeps_a_file_as_a_backup(tmp_path: Path, capsys) -> None:
    """Unless told ``quiet``, write_bytes says on stderr which backup kept the file it did not replace."""
    path = tmp_path / "fig.png"
    path.write_bytes(b"the user's own picture")
    write_bytes(path, SIG + IHDR + chunk(b"tEXt", SOFTWARE) + IDAT + IEND, kind="report-plot")
    assert (tmp_path / "fig.1.png").read_bytes() == b"the user's own picture"
    assert f"kept it as {tmp_path / 'fig.1.png'}" in capsys.readouterr().err
    assert is_own(path, "report-plot")


def test_a_device_that_appears_before_the_rename_is_refused_under_the_outputs_own_flag(
    tmp_path: Path, monkeypatch
) -> None:
    """A FIFO that appears at the path between the check and the rename is refused naming the option that gave
    the path, as the check would have."""
    # kills x__commit__mutmut_4 (the refusal names None)
    path = tmp_path / "x.md"
    real = outputs._write_temp

    def swap(out: outputs.Output) -> str:
        name = real(out)
        os.mkfifo(path)
        return name

    monkeypatch.setattr(outputs, "_write_temp", swap)
    with pytest.raises(UsageError) as exc:
        outputs.write_text(path, "x", kind="k", flag="--md")
    assert str(exc.value) == f"--md {path}: is a FIFO, not a regular file; give a file path"


def test_a_backup_that_fails_while_writing_names_the_outputs_own_flag(tmp_path: Path, monkeypatch) -> None:
    """When the file a write does not replace cannot be moved to its backup, the exit-3 error names the option
    that gave the path (not ``--out``, move_aside's default), and the file stays where it was."""
    # kills x__commit__mutmut_18 (move_aside(path, None)) and _20 (move_aside(path): "--out")
    path, flag = tmp_path / "x.md", "--md"
    path.write_text("the user's own notes\n")

    def no_link(*args, **kwargs):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "link", no_link)
    with pytest.raises(OutputError) as exc:
        outputs.write_text(path, outputs.with_marker("new", "compare-md"), kind="compare-md", flag=flag)
    assert str(exc.value) == f"{flag} {path}: cannot move it to {tmp_path / 'x.1.md'}: Input/output error"
    assert path.read_text() == "the user's own notes\n" and sorted(os.listdir(tmp_path)) == ["x.md"]


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (OSError(errno.EIO, "Input/output error"), "Input/output error"),
        (OSError("renaming refused"), "renaming refused"),
    ],
    ids=["strerror", "message-only"],
)
def test_a_failed_rename_into_place_is_exit_3_naming_the_flag_and_the_reason(
    tmp_path: Path, monkeypatch, error: OSError, reason: str
) -> None:
    """A rename of the written temporary file over the path that fails is an :class:`OutputError` (exit 3) of one
    line: the option, the path, ``cannot write`` and the system's reason (its strerror, else the error's text); no
    temporary file is left."""
    # kills x__commit__mutmut_30 (OutputError(None)) and _31 (strerror `and` exc: the errno and the text)
    path = tmp_path / "x.md"

    def no_replace(src, dst):
        raise error

    monkeypatch.setattr(os, "replace", no_replace)
    with pytest.raises(OutputError) as exc:
        outputs.write_text(path, "x", kind="k", flag="--md")
    assert str(exc.value) == f"--md {path}: cannot write: {reason}"
    assert os.listdir(tmp_path) == []


@pytest.fixture
def made_temps(monkeypatch) -> list[str]:
    """The names of the files ``outputs`` creates with ``tempfile.mkstemp`` from now on, in order."""
    made: list[str] = []
    real = outputs.tempfile.mkstemp

    def mkstemp(*args, **kwargs):
        fd, name = real(*args, **kwargs)
        made.append(name)
        return fd, name

    monkeypatch.setattr(outputs.tempfile, "mkstemp", mkstemp)
    return made


def test_the_temporary_file_is_beside_its_path_and_named_after_it(tmp_path: Path, made_temps: list[str]) -> None:
    """The data is written to a hidden temporary file in the path's own folder (so that the rename into place never
    crosses a file system), named ``.<the path's name, at most 80 characters>.<random>.tmp``."""
    # kills x__write_temp__mutmut_6, _9 (the temporary file in the system's temporary folder) and _10 (81 characters)
    for name in ("r.jsonl", "n" * 90 + ".md"):
        path = tmp_path / "sub" / name
        path.parent.mkdir(exist_ok=True)
        seen: list[str] = []

        def data(fh, seen=seen) -> None:
            seen.append(made_temps[-1])  # the file being written: the last one made
            fh.write(b"x")

        outputs.write_bytes(path, data, kind=None)
        temp = Path(seen[0])
        assert temp.parent == path.parent and not temp.exists() and path.read_bytes() == b"x"
        assert temp.name.startswith(f".{name[:80]}.") and temp.name.endswith(".tmp")
        assert not temp.name.startswith(f".{name[:81]}.") or len(name) <= 80


def test_the_writability_probe_is_a_hidden_file_in_the_paths_own_folder(tmp_path: Path, made_temps: list[str]) -> None:
    """Before anything is written, ``check_output`` creates and removes ``.attnconf-probe.*`` in the path's folder (the
    folder the output goes to, not the system's temporary one: the one test that holds for root too)."""
    # kills x__probe__mutmut_2, _4 (another name) and _3, _5 (the system's temporary folder)
    made = made_temps
    path = tmp_path / "sub" / "r.json"
    path.parent.mkdir()
    outputs.check_output(path, "--json")
    assert len(made) == 1 and Path(made[0]).parent == path.parent
    assert Path(made[0]).name.startswith(".attnconf-probe.") and os.listdir(path.parent) == []


@pytest.mark.parametrize(
    ("error", "reason"),
    [(OSError(errno.ENOSPC, "No space left on device"), "No space left on device"), (OSError("quota"), "quota")],
    ids=["strerror", "message-only"],
)
@pytest.mark.parametrize("where", ["create", "write"])
def test_a_temporary_file_that_cannot_be_made_or_written_is_exit_3_naming_the_reason(
    tmp_path: Path, monkeypatch, error: OSError, reason: str, where: str
) -> None:
    """Creating or writing the temporary file fails (a full disk, a quota): one line with the option, the path,
    ``cannot write`` and the system's reason (its strerror, else the error's text); nothing is left behind."""
    # kills x__write_temp__mutmut_13 (OutputError(None)), _14 and _34 (strerror `and` exc: the errno and the text)
    path = tmp_path / "x.json"

    def fail(*args, **kwargs):
        raise error

    if where == "create":  # the second mkstemp: the first is check_output's probe of the folder
        real, calls = outputs.tempfile.mkstemp, []

        def mkstemp(*args, **kwargs):
            calls.append(1)
            return real(*args, **kwargs) if len(calls) == 1 else fail()

        monkeypatch.setattr(outputs.tempfile, "mkstemp", mkstemp)
    with pytest.raises(OutputError) as exc:
        outputs.write_bytes(path, fail if where == "write" else b"{}", kind=None, flag="--json")
    assert str(exc.value) == f"--json {path}: cannot write: {reason}"
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("failing", [0, 1])
def test_a_failed_rename_removes_every_temporary_file_not_yet_in_place(tmp_path: Path, monkeypatch, failing) -> None:
    """Of several outputs written together, those renamed before a failure stay; every temporary file not yet
    renamed is removed, the failing one's included."""
    # kills write_many's count of committed files off by one either way (a temporary file left, or one removed
    # after its rename: a missing output)
    real = os.replace
    calls: list[str] = []

    def replace(src, dst):
        calls.append(dst)
        if len(calls) - 1 == failing:
            raise OSError(errno.EIO, "Input/output error")
        return real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    outs = [outputs.Output(tmp_path / f"{n}.md", b"x", None, "--md") for n in ("a", "b", "c")]
    with pytest.raises(OutputError):
        outputs.write_many(outs)
    assert sorted(os.listdir(tmp_path)) == ["a.md", "b.md", "c.md"][:failing]


# ------------------------------------------------------------------------------------------------- marker


def test_the_marker_is_the_bare_words_by_default_and_no_other_syntax_is_made_up() -> None:
    """``marker(kind)`` is the bare words a PNG's ``Software`` chunk carries (as ``syntax="text"``), ``html`` the
    comment of text outputs; any other syntax is a :class:`ValueError`, not quietly the bare words."""
    # kills x_marker__mutmut_1, _2 (the default "text" misspelt: equivalent while every syntax but "html" gave the
    # bare words, which is why an unknown syntax is refused now)
    assert marker("report-plot") == marker("report-plot", "text") == "attnconf-output: report-plot"
    assert marker("compare-md", "html") == "<!-- attnconf-output: compare-md -->"
    for syntax in ("TEXT", "markdown", ""):
        with pytest.raises(ValueError) as exc:
            marker("k", syntax)
        assert str(exc.value) == f"marker syntax {syntax!r}: not 'html' or 'text'"


# -------------------------------------------------------------------------------------------------- umask


@pytest.fixture
def umask():
    """Set the process umask for one test (``umask(0o077)``), restored afterwards."""
    old = os.umask(0o022)
    try:
        yield lambda value: os.umask(value)
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize("mask", [0o027, 0o077, 0o002, 0o000, 0o022])
def test_outputs_get_the_mode_the_process_umask_leaves(tmp_path: Path, umask, mask: int) -> None:
    """A written output has mode 0o666 less the process's umask, as a file created by open() would (not
    mkstemp's 0o600, not a fixed 0o644): a private umask keeps outputs private."""
    # kills x__umask__mutmut_10, _11, _12 (the "Umask:" line never found: 0o022 assumed), _15 (int(8)), _16 (the
    # digits read in base 10), _18 (base 9), and on the code of 26b51ed _5, _6 (the status file's name misspelt)
    umask(mask)
    assert outputs._umask() == mask
    path = write_bytes(tmp_path / "out.md", b"x", kind="k")
    assert _mode(path) == 0o666 & ~mask


def test_a_process_name_that_is_not_ascii_does_not_hide_the_umask(tmp_path: Path, umask) -> None:
    """The status file's ``Name:`` line is the process name, any bytes (a script called ``prüfung``, a name cut
    inside a UTF-8 character): the umask is read all the same.  Before: read as ASCII text, such a name made the
    read fail and 0o022 assumed, so a private umask (0o077) gave outputs mode 0o644."""
    # the bug x__umask__mutmut_2, _4 and _8 (encoding None, dropped, "ASCII") pointed at: the encoding decided
    # whether the umask was read at all
    try:
        with open("/proc/self/comm", "rb") as fh:
            name = fh.read().rstrip(b"\n")
        with open("/proc/self/comm", "wb") as fh:
            fh.write(b"pr\xc3\xbcfung-\xe9")  # UTF-8 and then a byte that is neither ASCII nor UTF-8
    except OSError as exc:
        pytest.skip(f"cannot rename this process: {exc}")
    try:
        umask(0o077)
        path = write_bytes(tmp_path / "out.md", b"x", kind="k")
        assert outputs._umask() == 0o077 and _mode(path) == 0o600
    finally:
        with open("/proc/self/comm", "wb") as fh:
            fh.write(name)


@pytest.mark.parametrize(
    "status",
    [None, b"Name:\tattnconf\nState:\tR (running)\n", b"Name:\tattnconf\nUmask:\tzz\n"],
    ids=["no-status-file", "no-umask-line", "unreadable-umask"],
)
def test_where_the_status_file_does_not_state_the_umask_0o022_is_assumed(
    tmp_path: Path, monkeypatch, umask, status: bytes | None
) -> None:
    """Where the status file is missing (no /proc), has no ``Umask:`` line (Linux before 4.7) or an unreadable one,
    the umask is taken to be the usual 0o022, whatever the process's is."""
    # kills x__umask__mutmut_19 (19, 0o023: the same file mode as 0o022, since 0o666 has no execute bits)
    fake = tmp_path / "status"
    if status is not None:
        fake.write_bytes(status)
    monkeypatch.setattr(outputs, "_STATUS", str(fake))
    umask(0o077)
    assert outputs._umask() == 0o022
    out = tmp_path / "out"
    out.mkdir()
    assert _mode(write_bytes(out / "out.md", b"x", kind="k")) == 0o644


def test_a_symlink_loop_is_a_usage_error_and_another_stat_failure_exit_3(tmp_path: Path, monkeypatch) -> None:
    """``os.stat`` failing on the output path: a symbolic link loop is the user's path (exit 2, one line); any other
    reason (a permission, an I/O error) is exit 3 naming the system's reason."""
    # kills x__refuse_special__mutmut_5 (ELOOP test inverted) and _6 (the loop's message None)
    loop = tmp_path / "a"
    loop.symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(loop)
    with pytest.raises(UsageError) as exc:
        outputs.check_output(loop, "--out")
    assert str(exc.value) == f"--out {loop}: too many levels of symbolic links"
    path = tmp_path / "x.jsonl"
    real_stat = os.stat

    def denied(p, *args, **kwargs):
        if Path(p) == path:
            raise OSError(errno.EACCES, "Permission denied")
        return real_stat(p, *args, **kwargs)

    monkeypatch.setattr(outputs.os, "stat", denied)
    with pytest.raises(OutputError) as err:
        outputs.check_output(path, "--out")
    assert str(err.value) == f"--out {path}: cannot be examined: Permission denied"


@pytest.mark.parametrize(
    ("error", "reason"),
    [(OSError(errno.EACCES, "Permission denied"), "Permission denied"), (OSError("quota"), "quota")],
    ids=["strerror", "message-only"],
)
def test_a_folder_the_probe_cannot_write_into_is_exit_3_naming_the_reason(
    tmp_path: Path, monkeypatch, error: OSError, reason: str
) -> None:
    """The writability probe (a file made and removed in the output's folder, the test that holds for root too)
    failing: one line with the option, the path, the folder and the system's reason (its strerror, else its text)."""
    # kills x__probe__mutmut_8 (OutputError(None)) and _9 (strerror `and` exc)

    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(outputs.tempfile, "mkstemp", fail)
    path = tmp_path / "x.json"
    with pytest.raises(OutputError) as exc:
        outputs.check_output(path, "--json")
    assert str(exc.value) == f"--json {path}: its directory {tmp_path} is not writable ({reason})"


@pytest.mark.parametrize("name", ["..", "/"])
def test_a_path_that_names_a_folder_by_its_form_is_refused_for_that(tmp_path: Path, name: str) -> None:
    """A path whose last part is ``..`` (or none, ``/``) names a directory by its form: refused as such (exit 2),
    before anything looks at what exists there."""
    # kills x_check_output__mutmut_4 (`or` -> `and`: `..` then reached the stat and got another message)
    path = tmp_path / name if name == ".." else Path(name)
    with pytest.raises(UsageError) as exc:
        outputs.check_output(path, "--out")
    assert str(exc.value) == f"--out {path}: names a directory, not a file; give a file path"


def test_a_link_to_nothing_where_the_directory_should_be_is_refused_for_that(tmp_path: Path) -> None:
    """A part of the output's folder that is a link to nothing: the stat of the output finds no file, the folder
    cannot be created over the link: exit 2, one line (a plain file there is refused earlier, by the stat)."""
    # kills x_check_output__mutmut_25 (that refusal's message replaced by None)
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")
    path = tmp_path / "link" / "out.json"
    with pytest.raises(UsageError) as exc:
        outputs.check_output(path, "--json")
    assert str(exc.value) == (
        f"--json {path}: cannot create its directory: a part of the path is a file or a link to nothing"
    )
    assert not (tmp_path / "nowhere").exists()


@pytest.mark.parametrize(
    ("error", "reason"),
    [(OSError(errno.EACCES, "Permission denied"), "Permission denied"), (OSError("quota"), "quota")],
    ids=["strerror", "message-only"],
)
def test_a_folder_that_cannot_be_created_is_exit_3_naming_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: OSError, reason: str
) -> None:
    """Creating the output's folder failing for another reason than a file in the way (a read-only parent for a
    user who is not root, a quota): exit 3, one line with the system's reason (its strerror, else its text)."""
    # kills x_check_output__mutmut_27 (`and` for `or`: the reason became the exception's repr-like text)

    def fail(self: Path, *args: object, **kwargs: object) -> None:
        raise error

    monkeypatch.setattr(Path, "mkdir", fail)
    path = tmp_path / "new" / "out.json"
    with pytest.raises(OutputError) as exc:
        outputs.check_output(path, "--json")
    assert str(exc.value) == f"--json {path}: cannot create its directory: {reason}"


def test_a_folder_the_system_says_is_not_writable_is_refused_before_the_probe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The folder's write and search permission is asked of the system (``os.access`` with ``W_OK | X_OK``) before
    the probe; a folder it calls unwritable is exit 3 without a probe file made.  Root passes that question
    everywhere but on a read-only file system, so it is emulated here."""
    # kills x_check_output__mutmut_36 (`W_OK & X_OK`, that is 0: only the folder's existence was asked)
    asked: list[int] = []

    def access(target: object, mode: int) -> bool:
        asked.append(mode)
        return not mode & (os.W_OK | os.X_OK)

    monkeypatch.setattr(outputs.os, "access", access)
    probed: list[object] = []
    monkeypatch.setattr(outputs, "_probe", lambda *args: probed.append(args))
    path = tmp_path / "out.json"
    with pytest.raises(OutputError) as exc:
        outputs.check_output(path, "--json")
    assert str(exc.value) == f"--json {path}: its directory {tmp_path} is not writable"
    assert asked == [os.W_OK | os.X_OK] and probed == []
