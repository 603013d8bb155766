"""A results file has one writer at a time, and a resumed run neither loses nor duplicates a pair.

Real ``python -m conformance run`` subprocesses on the CPU backend ``sdpa-cpu`` and a few cases of the ``smoke``
suite: two runs on one file at once (the second refuses at once, naming the first's pid), SIGKILL mid-run then
``--resume`` (plain and gzip: the same pairs as an uninterrupted run, none twice, and the killed run's lock does
not block), a fresh ``--out r.jsonl.gz`` (real gzip) and its resume, and what ``--resume`` refuses before it
touches anything (a garbled line unless ``--allow-skipped``, a pair twice, a newer writer's file).  The lock
itself (:mod:`conformance.lock`) is tested in-process too: the path, not the inode; the safe unlink; ``merge``
and ``fuzz`` hold it as well.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from conformance.cli import main
from conformance.results_file import load_results, read_records
from conformance.running.selection import select_cases

REPO = Path(__file__).resolve().parents[3]
#: 23 cases of smoke on sdpa-cpu, one worker: long enough (10-40 s) to be caught running
LONG = ["--case", "mha_*"]
#: 4 cases: the quick sweeps
SHORT = ["--case", "mha_h4_kv4_d64_*_s_pf_*"]


def run_args(out: Path, selection: list[str]) -> list[str]:
    return ["run", "--suite", "smoke", *selection, "--backend", "sdpa-cpu", "--device", "cpu", "--jobs", "1",
            "--no-progress", "--out", str(out)]  # fmt: skip


def expected(selection: list[str]) -> set[tuple[str, str]]:
    """The pairs an uninterrupted run of ``selection`` records."""
    return {(c.id, "sdpa-cpu") for c in select_cases("smoke", (selection[1],))}


def attnconf(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "conformance", *args], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


def start(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "conformance", *args], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )


def lockfile(out: Path) -> Path:
    return out.with_name(f".{out.name}.lock")


def results_in(out: Path) -> int:
    try:
        return len(read_records(out)[1])
    except (OSError, ValueError):
        return 0


def wait_for(what, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def check_complete(out: Path, selection: list[str], headers: int) -> None:
    """``out`` reads strictly (no skipped line, no pair twice) and holds exactly the pairs of an uninterrupted
    run, every one passing as it does there."""
    f = load_results(out)
    pairs = Counter((r.case_id, r.backend) for r in f.results)
    assert set(pairs) == expected(selection) and max(pairs.values()) == 1
    assert all(r.status.value == "pass" for r in f.results)
    assert len(f.headers) == headers


# ------------------------------------------------------------------------------------------ two runs at once


@pytest.mark.slow
def test_two_runs_started_at_once_on_one_file_one_refuses_naming_the_other(tmp_path: Path) -> None:
    """The issue's case: two ``run --resume`` on one file at the same moment.  Whichever takes the lock first
    runs; the other refuses (exit 2, one line naming the file and the first one's pid) before it touches the
    file; the file ends with every pair once."""
    out = tmp_path / "r.jsonl"
    runs = [start(*run_args(out, LONG), "--resume") for _ in range(2)]
    try:
        codes = [p.wait(timeout=600) for p in runs]
    finally:
        for p in runs:
            p.kill()
            p.wait()
    errs = [p.stderr.read().decode() for p in runs]
    assert sorted(codes) == [0, 2], (codes, errs)
    loser = codes.index(2)
    line = one_line(errs[loser])
    winner = runs[1 - loser].pid
    assert f"--out {out}: in use by another attnconf command (pid {winner} " in line
    check_complete(out, LONG, headers=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.jsonl"]  # the lock file removed at the end


def test_a_run_on_a_held_file_refuses_before_touching_it(tmp_path: Path, capsys) -> None:
    """Fresh (it would move the file to a backup) or resumed (it would repair and append): refused, untouched."""
    from conformance.lock import hold

    out = tmp_path / "r.jsonl"
    out.write_bytes(b'{"type": "result", "cut sh')
    with hold(out):
        for extra in ([], ["--resume"]):
            capsys.readouterr()
            assert main([*run_args(out, SHORT), *extra]) == 2
            assert f"--out {out}: in use by another attnconf command (pid {os.getpid()} " in one_line(
                capsys.readouterr().err
            )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.jsonl"]
    assert out.read_bytes() == b'{"type": "result", "cut sh'


# ------------------------------------------------------------------------------------------ kill, then resume


@pytest.mark.slow
@pytest.mark.parametrize("name", ["r.jsonl", "r.jsonl.gz"])
def test_sigkill_at_several_moments_then_resume_gives_the_uninterrupted_pairs_once(tmp_path: Path, name: str) -> None:
    """Killed right after its header, then after a few records, then resumed to the end: readable after every
    kill (the cut tail at most one skipped line), the killed run's lock left behind but not blocking, and the
    end file strictly the pairs of an uninterrupted run, none twice, in the format the name asked for."""
    out = tmp_path / name
    args = run_args(out, LONG)
    kills = 0
    for more in (0, 4):
        have = results_in(out)
        proc = start(*args, *(["--resume"] if kills else []))
        try:
            wait_for(lambda: results_in(out) >= have + more and out.exists() and out.stat().st_size > 0)
            assert proc.poll() is None, "the run ended before it could be killed"
            proc.send_signal(signal.SIGKILL)
        finally:
            proc.wait()
        kills += 1
        assert lockfile(out).read_text().startswith(f"pid {proc.pid} ")  # left behind, unlocked
        mid = load_results(out, allow_skipped=True, need_results=False)
        assert len(mid.skipped) <= 1 and (not mid.skipped or mid.cut_tail), mid.skipped
        assert mid.gzip == name.endswith(".gz")
    done = attnconf(*args, "--resume")
    assert done.returncode == 0, done.stderr
    check_complete(out, LONG, headers=kills + 1)
    assert not lockfile(out).exists()
    if name.endswith(".gz"):
        assert out.read_bytes()[:2] == b"\x1f\x8b"
        lines = gzip.decompress(out.read_bytes()).decode().splitlines()  # any gzip reader reads the members
        assert len(lines) == len(expected(LONG)) + kills + 1 and all(json.loads(x) for x in lines)


# ------------------------------------------------------------------------------------------ gzip


@pytest.mark.slow
def test_a_fresh_gz_run_writes_gzip_and_its_resume_appends_members(tmp_path: Path, capsys) -> None:
    out = tmp_path / "r.jsonl.gz"
    assert main(run_args(out, SHORT)) == 0
    data = out.read_bytes()
    assert data[:2] == b"\x1f\x8b"
    n = len(gzip.decompress(data).splitlines())
    assert n == 1 + len(expected(SHORT))
    # the writer was killed inside its last batch (a member cut short), then the run is resumed
    keep = data.rfind(b"\x1f\x8b\x08")
    out.write_bytes(data[: keep + (len(data) - keep) // 2])
    assert "cut short" in load_results(out, allow_skipped=True).skipped[-1].reason
    capsys.readouterr()
    assert main([*run_args(out, SHORT), "--resume"]) == 0
    check_complete(out, SHORT, headers=2)
    assert out.read_bytes()[:keep] == data[:keep]  # the complete members kept byte for byte


# ------------------------------------------------------------------------------------------ what resume refuses


@pytest.fixture(scope="module")
def short_run(tmp_path_factory) -> bytes:
    out = tmp_path_factory.mktemp("short") / "r.jsonl"
    assert main(run_args(out, SHORT)) == 0
    return out.read_bytes()


def test_resume_refuses_a_garbled_line_unless_allowed(short_run: bytes, tmp_path: Path, capsys) -> None:
    out = tmp_path / "r.jsonl"
    lines = short_run.splitlines(keepends=True)
    damaged = b"".join(lines[:2]) + b"<<<<<<< merge conflict\n" + b"".join(lines[2:-2])  # two pairs missing
    out.write_bytes(damaged)
    capsys.readouterr()
    assert main([*run_args(out, SHORT), "--resume"]) == 2
    line = one_line(capsys.readouterr().err)
    assert f"--resume: {out}: 1 line is not a record (line 3: not JSON); pass --allow-skipped" in line
    assert out.read_bytes() == damaged  # not touched
    assert main([*run_args(out, SHORT), "--resume", "--allow-skipped"]) == 0
    f = load_results(out, allow_skipped=True)
    assert [str(s) for s in f.skipped] == ["line 3: not JSON"]
    assert {(r.case_id, r.backend) for r in f.results} == expected(SHORT) and len(f.results) == len(expected(SHORT))


def test_resume_refuses_a_pair_twice_and_a_newer_writers_file(short_run: bytes, tmp_path: Path, capsys) -> None:
    lines = short_run.splitlines(keepends=True)
    twice = tmp_path / "twice.jsonl"
    twice.write_bytes(b"".join(lines[:-1]) + lines[1])
    newer = tmp_path / "newer.jsonl"
    head = json.loads(lines[0])
    newer.write_bytes(json.dumps({**head, "schema": 2}).encode() + b"\n" + b"".join(lines[1:-1]))
    for out, says in (
        (twice, f"--resume: {twice}: records 1 (case, backend) pair twice, the first "),
        (newer, f"--resume: {newer}: written by a newer attnconf (schema 2 > 1); resume it with that version"),
    ):
        before = out.read_bytes()
        capsys.readouterr()
        assert main([*run_args(out, SHORT), "--resume"]) == 2
        assert says in one_line(capsys.readouterr().err)
        assert out.read_bytes() == before


# ------------------------------------------------------------------------------------------ the lock itself


def test_the_lock_is_on_the_path_and_released(tmp_path: Path) -> None:
    from conformance.exits import UsageError
    from conformance.lock import hold

    out = tmp_path / "r.jsonl"
    out.write_text("{}\n")
    with hold(out) as lock:
        assert lock == lockfile(out) and lock.read_text().startswith(f"pid {os.getpid()} on ")
        with pytest.raises(UsageError, match=rf"--out {out}: in use by another attnconf command \(pid {os.getpid()} "):
            with hold(out):
                pass
        out.rename(tmp_path / "r.1.jsonl")  # a fresh run moves the file to its backup: the path stays locked
        with pytest.raises(UsageError, match="in use"):
            with hold(tmp_path / "sub" / ".." / "r.jsonl"):
                pass
        (tmp_path / "link.jsonl").symlink_to(out)
        with pytest.raises(UsageError, match="in use"):
            with hold(tmp_path / "link.jsonl"):
                pass
    assert not lockfile(out).exists()  # released and removed
    with hold(out):
        pass


def test_a_sigkilled_holder_leaves_a_lock_that_does_not_block(tmp_path: Path) -> None:
    from conformance.exits import UsageError
    from conformance.lock import hold

    out = tmp_path / "r.jsonl"
    code = f"from conformance.lock import hold; h = hold({str(out)!r}); h.__enter__(); print('held', flush=True); "
    holder = subprocess.Popen([sys.executable, "-c", code + "import time; time.sleep(300)"], cwd=REPO,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(UsageError, match=rf"\(pid {holder.pid} on "):
            with hold(out):
                pass
        holder.send_signal(signal.SIGKILL)
    finally:
        holder.wait()
    assert lockfile(out).read_text().startswith(f"pid {holder.pid} ")  # stale, and unlocked
    with hold(out):
        assert lockfile(out).read_text().startswith(f"pid {os.getpid()} ")


def test_a_lock_file_removed_between_open_and_lock_is_taken_again(tmp_path: Path, monkeypatch) -> None:
    """The safe unlink: a command that opened the sidecar just before its holder released (and removed) it
    locks a file that is no longer at the path; it must notice and lock the new one, so that a third command is
    refused instead of getting a lock of its own."""
    from conformance import lock as lockmod
    from conformance.exits import UsageError

    out = tmp_path / "r.jsonl"
    first = lockmod.hold(out)
    first.__enter__()
    real_open = os.open
    opened = []

    def open_then_release(path, flags, mode=0o777):
        fd = real_open(path, flags, mode)
        if not opened:
            first.__exit__(None, None, None)  # the holder ends right after our open: it removes the sidecar
        opened.append(fd)
        return fd

    monkeypatch.setattr(lockmod.os, "open", open_then_release)
    with lockmod.hold(out) as lock:
        assert len(opened) == 2  # the stale sidecar, then the new one
        monkeypatch.setattr(lockmod.os, "open", real_open)
        with pytest.raises(UsageError, match="in use"):
            with lockmod.hold(out):
                pass
        assert lock.exists()


def test_merge_and_fuzz_hold_the_lock_of_their_output(tmp_path: Path, short_run: bytes, capsys) -> None:
    from conformance.lock import hold

    shard = tmp_path / "s.jsonl"
    shard.write_bytes(short_run)
    merged, campaign = tmp_path / "m.jsonl", tmp_path / "f.jsonl"
    campaign.write_text("precious\n")
    with hold(merged), hold(campaign):
        capsys.readouterr()
        assert main(["merge", str(shard), "--out", str(merged)]) == 2
        assert f"--out {merged}: in use by another attnconf command (pid {os.getpid()} " in one_line(
            capsys.readouterr().err
        )
        fuzz = ["fuzz", "--backend", "sdpa-cpu", "--device", "cpu", "--budget", "1", "--no-progress"]
        assert main([*fuzz, "--out", str(campaign)]) == 2
        assert f"--out {campaign}: in use" in one_line(capsys.readouterr().err)
    assert not merged.exists() and campaign.read_text() == "precious\n"
    assert main(["merge", str(shard), "--out", str(merged)]) == 0
    assert not lockfile(merged).exists()
