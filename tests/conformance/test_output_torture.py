"""No output ever clobbers data: every subcommand x every output flag x every hostile condition, through the real
command line (:func:`conformance.cli.main` in-process; the real disk-full runs are ``python -m conformance``
subprocesses under ``RLIMIT_FSIZE``, in the slow session: ``nox -s slow``).

Outputs: ``report --out DIR`` (report.md, report.html, the PNGs) and ``--json``; ``compare --out`` and ``--json``;
``merge --out`` (a results file: data, always backed up) and ``--summary``; ``run --out`` (the results file) and
``--json``; ``fuzz --out`` (the campaign file).  Conditions: the path is one of the command's inputs (by name,
through a symbolic link, through a hard link) or another of its outputs; a directory; ``/dev/null``, ``/dev/full``
or a symbolic link to one; a FIFO; a user's file there (kept as a numbered backup, intact); the command's own
earlier output (replaced, no backup; a results file is backed up instead); an unwritable directory (under
/proc/self, which even root cannot write; a chmod'ed one as non-root); a read-only file (skipped as root, whom
permission bits do not stop); a full disk (fsync failing with ENOSPC in-process, EFBIG from ``RLIMIT_FSIZE`` in a
subprocess).  The device nodes are never written: each test asserts they are still character devices.
``COUNT`` below is the number of (command, flag, condition) events tried.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from conformance.suites.registry import get_suite
from conformance.cli import main
from conformance.outputs import is_own

REPO = Path(__file__).resolve().parents[2]
ROOT = os.geteuid() == 0
EXACT = "tests.conformance.fakes:ExactBackend"
CASE_ID = get_suite("smoke")[0].id


@dataclass
class Workspace:
    dir: Path
    old: Path  # a results file (a real run's)
    new: Path  # the same with one planted failure: compare exits 1 (regressed) on OLD -> NEW
    ledgers: Path
    tol: Path  # an empty --tol-file: an input of run and fuzz


@pytest.fixture
def ws(smoke_results_file: Path, tmp_path: Path) -> Workspace:
    old = tmp_path / "old.jsonl"
    shutil.copy(smoke_results_file, old)
    lines = [json.loads(line) for line in smoke_results_file.read_text().splitlines()]
    first = next(r for r in lines if r["type"] == "result")
    first.update(status="fail", reason="planted")
    new = tmp_path / "new.jsonl"
    new.write_text("".join(json.dumps(r) + "\n" for r in lines))
    (tmp_path / "ledgers").mkdir()
    tol = tmp_path / "tol.toml"
    tol.write_text("")
    return Workspace(tmp_path, old, new, tmp_path / "ledgers", tol)


# ---------------------------------------------------------------------------------------------- the commands


@dataclass(frozen=True)
class Spec:
    """One output flag of one subcommand: its command line with the flag at ``P``."""

    command: str
    flag: str
    argv: Callable[[Workspace, Path], list[str]]
    ok: int  # the exit status when the outputs are written (compare: 1, regressed)
    kind: str | None  # the output kind of the file at target(P); None: a results file (always backed up)
    input: Callable[[Workspace], Path]  # one of the command's inputs
    sibling: Callable[[Workspace, Path], list[str]] | None = None  # another output flag at P
    directory: bool = False  # the flag names a directory (report --out): its file is P/report.md
    slow: bool = False  # runs kernels in workers: the conditions it runs through are in the slow session

    def target(self, p: Path) -> Path:
        return p / "report.md" if self.directory else p

    def __str__(self) -> str:
        return f"{self.command} {self.flag}"


def _run(w: Workspace, out: Path, json_path: Path | None = None) -> list[str]:
    argv = ["run", "--suite", "smoke", "--case", CASE_ID, "--backend", EXACT, "--jobs", "1", "--no-progress"]
    argv += ["--ledger-dir", str(w.ledgers), "--tol-file", str(w.tol), "--out", str(out)]
    return argv + (["--json", str(json_path)] if json_path else [])


def _report(w: Workspace) -> list[str]:
    return ["report", str(w.old), "--ledger-dir", str(w.ledgers)]


SPECS = [
    Spec(
        "report",
        "--out",
        lambda w, p: [*_report(w), "--out", str(p)],
        0,
        "report-md",
        lambda w: w.old,
        sibling=lambda w, p: ["--json", str(p)],
        directory=True,
    ),
    Spec(
        "report",
        "--json",
        lambda w, p: [*_report(w), "--out", str(w.dir / "rep"), "--json", str(p)],
        0,
        "report-summary",
        lambda w: w.old,
        sibling=lambda w, p: [],  # P is the report's own report.md (see sibling_path)
    ),
    Spec(
        "compare",
        "--out",
        lambda w, p: ["compare", str(w.old), str(w.new), "--out", str(p)],
        1,
        "compare-md",
        lambda w: w.new,
        sibling=lambda w, p: ["--json", str(p)],
    ),
    Spec(
        "compare",
        "--json",
        lambda w, p: ["compare", str(w.old), str(w.new), "--json", str(p)],
        1,
        "compare-summary",
        lambda w: w.old,
        sibling=lambda w, p: ["--out", str(p)],
    ),
    Spec(
        "merge",
        "--out",
        lambda w, p: ["merge", str(w.old), "--out", str(p)],
        0,
        None,
        lambda w: w.old,
        sibling=lambda w, p: ["--summary", str(p)],
    ),
    Spec(
        "merge",
        "--summary",
        lambda w, p: ["merge", str(w.old), "--out", str(w.dir / "m.jsonl"), "--summary", str(p)],
        0,
        "merge-md",
        lambda w: w.old,
        sibling=lambda w, p: ["--out", str(p)],
    ),
    Spec(
        "run",
        "--out",
        lambda w, p: _run(w, p),
        0,
        None,
        lambda w: w.tol,
        sibling=lambda w, p: ["--json", str(p)],
        slow=True,
    ),
    Spec(
        "run",
        "--json",
        lambda w, p: _run(w, w.dir / "r.jsonl", p),
        0,
        "run-summary",
        lambda w: w.tol,
        sibling=lambda w, p: ["--out", str(p)],
        slow=True,
    ),
    Spec(
        "fuzz",
        "--out",
        lambda w, p: [
            "fuzz",
            "--backend",
            "sdpa-cpu",
            "--device",
            "cpu",
            "--budget",
            "1",
            "--max-tokens",
            "64",
            "--max-heads",
            "4",
            "--no-progress",
            "--tol-file",
            str(w.tol),
            "--out",
            str(p),
        ],
        0,
        None,
        lambda w: w.tol,
        slow=True,
    ),
]

#: conditions under which the command must refuse before any work (exit 2) and leave every file as it was
REFUSED = [
    "input",
    "input-symlink",
    "input-hardlink",
    "other-output",
    "directory",
    "/dev/null",
    "/dev/full",
    "symlink-to-device",
    "fifo",
]
#: conditions under which the output cannot be written (exit 3, one line)
UNWRITABLE = ["proc-dir", "proc-subdir", "read-only-dir", "read-only-file", "disk-full"]
#: conditions under which the command works and keeps what was there
KEPT = ["foreign", "own"]

#: conditions under which the command runs to its end: with a ``slow`` spec (kernels in worker processes, a torch
#: import each) they run in the slow session; merge keeps a results file (always backed up) in the fast one
RUN_THROUGH = ["disk-full", "read-only-dir", "read-only-file", *KEPT]
CASES = [
    pytest.param(
        spec,
        cond,
        id=f"{spec.command}{spec.flag}-{cond}",
        marks=[pytest.mark.slow] if spec.slow and cond in RUN_THROUGH else [],
    )
    for spec in SPECS
    for cond in REFUSED + UNWRITABLE + KEPT
    if not (cond == "other-output" and spec.sibling is None)
]
REAL_DISK_FULL = ["report", "compare", "merge", "run-header", "run-mid-sweep", "fuzz"]
#: the events the module tries
COUNT = len(CASES) + len(REAL_DISK_FULL)


def snapshot(directory: Path) -> dict[str, bytes | str]:
    """Every entry under ``directory``: a file's bytes, or what a link, FIFO or directory is."""
    out: dict[str, bytes | str] = {}
    for p in sorted(directory.rglob("*")):
        rel = str(p.relative_to(directory))
        if p.is_symlink():
            out[rel] = "link -> " + os.readlink(p)
        elif stat.S_ISFIFO(os.lstat(p).st_mode):
            out[rel] = "fifo"
        elif p.is_dir():
            out[rel] = "dir"
        else:
            out[rel] = p.read_bytes()
    return out


def leftovers(directory: Path) -> list[str]:
    return [str(p) for p in directory.rglob("*") if p.name.endswith(".tmp") or ".attnconf-probe." in p.name]


def devices_intact() -> None:
    for device in ("/dev/null", "/dev/full"):
        assert stat.S_ISCHR(os.stat(device).st_mode), f"{device} is no longer a character device"


def one_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def place(spec: Spec, cond: str, w: Workspace) -> tuple[Path, list[str]]:
    """The path P the condition puts at ``spec``'s flag, and any extra arguments."""
    d = w.dir
    if cond == "input":
        return spec.input(w), []
    if cond == "input-symlink":
        (d / "alias").symlink_to(spec.input(w))
        return d / "alias", []
    if cond == "input-hardlink":
        os.link(spec.input(w), d / "hard")
        return d / "hard", []
    if cond == "other-output":
        if spec.command == "report" and spec.flag == "--json":
            return d / "rep" / "report.md", []
        p = d / "both"
        return p, spec.sibling(w, p)
    if cond == "directory":
        if spec.directory:  # a directory is what report --out wants: a regular file is the bad case here
            (d / "plain").write_text("a file of the user\n")
            return d / "plain", []
        (d / "adir").mkdir()
        return d / "adir", []
    if cond in ("/dev/null", "/dev/full"):
        return Path(cond), []
    if cond == "symlink-to-device":
        (d / "dev").symlink_to("/dev/full")
        return d / "dev", []
    if cond == "fifo":
        os.mkfifo(d / "fifo")
        return d / "fifo", []
    if cond == "proc-dir":
        return Path("/proc/self/attnconf-torture"), []
    if cond == "proc-subdir":
        return Path("/proc/self/attnconf/torture"), []
    return d / "out" / "x", []


# ------------------------------------------------------------------------------------------------ the matrix


@pytest.mark.parametrize(("spec", "cond"), CASES)
def test_output_conditions(spec: Spec, cond: str, ws: Workspace, capsys, monkeypatch) -> None:
    if cond in REFUSED:
        refused(spec, cond, ws, capsys)
    elif cond in UNWRITABLE:
        unwritable(spec, cond, ws, capsys, monkeypatch)
    else:
        kept(spec, cond, ws, capsys)
    devices_intact()
    assert leftovers(ws.dir) == []


def refused(spec: Spec, cond: str, w: Workspace, capsys) -> None:
    p, extra = place(spec, cond, w)
    before = snapshot(w.dir)
    code = main([*spec.argv(w, p), *extra])
    line = one_line(capsys.readouterr().err)
    assert code == 2, line
    assert line.startswith(f"attnconf {spec.command}: ") and spec.flag in line, line  # refused for this reason
    after = snapshot(w.dir)
    # nothing changed but, at most, a new empty directory made for another output (report's default dir)
    assert {k: v for k, v in after.items() if v != "dir"} == {k: v for k, v in before.items() if v != "dir"}
    if cond == "fifo":
        assert stat.S_ISFIFO(os.stat(p).st_mode)


def unwritable(spec: Spec, cond: str, w: Workspace, capsys, monkeypatch) -> None:
    if cond in ("proc-dir", "proc-subdir"):
        p, _ = place(spec, cond, w)
        before = snapshot(w.dir)
        code = main(spec.argv(w, p))
        line = one_line(capsys.readouterr().err)
        assert code == 3 and f"{spec.flag} {p}" in line, line
        assert {k: v for k, v in snapshot(w.dir).items() if v != "dir"} == {
            k: v for k, v in before.items() if v != "dir"
        }
        return
    if cond in ("read-only-dir", "read-only-file"):
        if ROOT:
            pytest.skip("root is not stopped by permission bits: the /proc/self conditions give exit 3 as root")
        p = w.dir / "ro" / ("rep" if spec.directory else "x")
        target = spec.target(p)
        target.parent.mkdir(parents=True)
        target.write_text("the user's file\n")
        locked = target.parent if cond == "read-only-dir" else target
        locked.chmod(0o555 if cond == "read-only-dir" else 0o444)
        try:
            code = main(spec.argv(w, p))
            line = one_line(capsys.readouterr().err)
        finally:
            locked.chmod(0o755 if cond == "read-only-dir" else 0o644)
        assert code == 3, line
        assert target.read_text() == "the user's file\n"
        return
    disk_full(spec, w, capsys, monkeypatch)


def disk_full(spec: Spec, w: Workspace, capsys, monkeypatch) -> None:
    """fsync fails with ENOSPC on the temporary file of the output (on the results file itself after its header,
    for run and fuzz --out): exit 3, one line, the earlier file intact, no temporary file left."""
    p = w.dir / "out" / "x"
    target = spec.target(p)
    target.parent.mkdir(parents=True)
    previous = "the user's earlier file\n" if spec.kind is None else None
    if previous is None:  # the command's own earlier output: what a re-run would replace
        assert main(spec.argv(w, p)) == spec.ok
        capsys.readouterr()
        previous = target.read_text()
    else:
        target.write_text(previous)
    real, calls = os.fsync, []

    def fsync(fd: int) -> None:
        name = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
        if name.startswith(f".{target.name}.") and name.endswith(".tmp"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        if name == target.name and spec.kind is None:  # appended to: the header passes, the records do not
            calls.append(fd)
            if len(calls) > 1:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    code = main(spec.argv(w, p))
    err = capsys.readouterr().err
    monkeypatch.undo()
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert code == 3 and "No space left on device" in lines[-1], err
    if spec.kind is None and spec.command in ("run", "fuzz"):
        # the earlier results file was moved aside before the run, intact; the run's own file keeps its header
        assert len(lines) == 2 and "moved the existing" in lines[0], err
        assert (target.parent / "x.1").read_text() == previous
        assert "--resume" in lines[-1]
    else:
        # one line (a run's end-of-sweep summary comes before it: the sweep itself went well)
        assert len(lines) == 1 or spec.command == "run" and lines[-1].startswith("attnconf run: --json"), err
        assert target.read_text() == previous


def kept(spec: Spec, cond: str, w: Workspace, capsys) -> None:
    p = w.dir / "out" / ("rep" if spec.directory else "x.md")
    target = spec.target(p)
    target.parent.mkdir(parents=True)
    if cond == "foreign":
        target.write_text("the user's own file\n")
        first = target.read_bytes()
    else:
        assert main(spec.argv(w, p)) == spec.ok
        capsys.readouterr()
        first = target.read_bytes()
    code = main(spec.argv(w, p))
    err = capsys.readouterr().err
    assert "Traceback" not in err and code == spec.ok, err
    backups = sorted(n for n in os.listdir(target.parent) if re.fullmatch(r"[^.]+\.[0-9]+(\..*)?", n))
    if cond == "own" and spec.kind is not None:
        assert backups == [] and target.read_bytes() != b"" and is_own(target, spec.kind)  # replaced, no backup
        assert f"{target} held a file" not in err
        return
    # anything else (a user's file; a results file, even attnconf's own) is kept under the first free number
    stem = target.name.split(".")[0]
    assert backups == [f"{stem}.1{target.name[len(stem) :]}"], (backups, err)
    assert (target.parent / backups[0]).read_bytes() == first
    assert str(target.parent / backups[0]) in err
    if spec.kind is not None:
        assert is_own(target, spec.kind)


# ----------------------------------------------------------------------------------------- a real full disk

# A child that ignores SIGXFSZ and may write files of at most LIMIT bytes: a write past it fails with EFBIG, even
# as root.  Its stdout and stderr are pipes, which the limit does not touch.
CHILD = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]), resource.RLIM_INFINITY))
from conformance.cli import main
sys.exit(main(sys.argv[2:]))
"""


def child(limit: int, argv: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    return subprocess.run(
        [sys.executable, "-c", CHILD, str(limit), *argv],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=REPO,
        check=False,
    )


@pytest.mark.slow  # six `python -c` children (torch imported in each, and in run's and fuzz's workers): 20 s of CPU
@pytest.mark.parametrize("what", REAL_DISK_FULL)
def test_a_real_full_disk_is_exit_3_one_line_and_changes_nothing(what: str, ws: Workspace) -> None:
    w, out = ws, ws.dir / "out"
    out.mkdir()
    mine = "the user's earlier file\n"
    if what == "report":
        targets = [out / "report.md", out / "report.html", out / "s.json"]
        argv, limit = [*_report(w), "--out", str(out), "--json", str(out / "s.json")], 2000
    elif what == "compare":
        targets = [out / "c.md", out / "c.json"]
        argv, limit = ["compare", str(w.old), str(w.new), "--out", str(targets[0]), "--json", str(targets[1])], 200
    elif what == "merge":
        targets = [out / "m.jsonl", out / "m.md"]
        argv, limit = ["merge", str(w.old), "--out", str(targets[0]), "--summary", str(targets[1])], 200
    elif what.startswith("run"):
        targets = [out / "r.jsonl"]
        # run-header: the header line does not fit; run-mid-sweep: it does (give or take the paths in argv), the
        # first record (about 1.4 kB) does not
        header = len(w.old.read_text().split("\n", 1)[0])
        argv, limit = _run(w, targets[0]), (100 if what == "run-header" else header + 500)
    else:
        targets = [out / "f.jsonl"]
        argv, limit = SPECS[-1].argv(w, targets[0]), 100
    for t in targets:
        t.write_text(mine)
    res = child(limit, argv)
    assert "Traceback" not in res.stderr, res.stderr
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 3 and "File too large" in lines[-1], res.stderr
    if what.startswith("run-") or what == "fuzz":
        # the results file: the earlier one moved aside first (said), intact; the run says how to go on
        assert len(lines) == 2 and "moved the existing" in lines[0], res.stderr
        assert (out / f"{targets[0].stem}.1.jsonl").read_text() == mine
    else:
        assert len(lines) == 1, res.stderr
        for t in targets:
            assert t.read_text() == mine, t  # all or nothing: no output of the command changed
    assert leftovers(w.dir) == []
    devices_intact()
