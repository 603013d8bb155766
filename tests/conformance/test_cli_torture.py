"""Torture: the real ``attnconf`` as subprocesses, interrupted and cut off the way a terminal and a shell do it.

* Ctrl-C (SIGINT to the command's process group, as a terminal sends it) at several moments of ``attnconf run``
  over the first cases of ``smoke`` on sdpa-cpu and a slowed twin of it (:class:`SlowSdpaCpu`, so that records
  arrive slowly enough to be interrupted between them): during the parent's imports, during worker start-up,
  after the first records (the workers signalled too, as if they shared the terminal's process group), near the
  end.  Each: exit 130, the resume command on stderr, no traceback; ``--resume`` then leaves exactly the records
  (case, backend, status) of one uninterrupted run, each pair once.
* Every subcommand that prints a lot, piped into a reader that reads one line and closes (``| head -1``) and into
  one that is gone before the first line: exit 0 or 141, nothing on stderr but the command's own lines.

One uninterrupted run (module fixture) is the baseline and the input of the results-file commands.  Linux only
(``/proc`` tells when the parent imports torch and which workers it started).  Marked ``slow``: about 100 s on a
busy 2-core machine.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from attnfast.sdpa import SdpaCpuBackend
from conformance.results_file import read_records

pytestmark = [
    pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc and POSIX signals"),
    pytest.mark.slow,  # about 100 s on a busy 2-core machine (16 attnconf subprocesses): out of mutation runs
]

REPO = Path(__file__).resolve().parents[2]
SLOW = "tests.conformance.test_cli_torture:SlowSdpaCpu"
CASES = 4  # the first smoke cases: 8 pairs, 4 of them slow
RUN = ["run", "--suite", "smoke", "--limit", str(CASES), "--backend", "sdpa-cpu", "--backend", SLOW, "--jobs", "1"]
RUN += ["--no-progress", "--out", "r.jsonl"]


class SlowSdpaCpu(SdpaCpuBackend):
    """sdpa-cpu whose kernel call takes 0.3 s longer: a sweep whose records can be interrupted between them."""

    name = "test-slow-sdpa-cpu"

    def prepare(self, case, inputs):
        run = super().prepare(case, inputs)

        def slow():
            time.sleep(0.3)
            return run()

        return slow


def attnconf(args: list[str], cwd: Path, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(
        [sys.executable, "-m", "conformance", *args],
        cwd=cwd,
        env=env,
        start_new_session=True,  # its own process group: the terminal's Ctrl-C goes to the group
        **kwargs,
    )


def finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, str]:
    _, err = proc.communicate(timeout=timeout)
    return proc.returncode, err.decode() if isinstance(err, bytes) else (err or "")


def pairs(path: Path) -> Counter:
    _, results = read_records(path)
    return Counter((r.case_id, r.backend, r.status.value) for r in results)


def results_written(path: Path) -> int:
    try:
        return path.read_bytes().count(b'"type": "result"')
    except FileNotFoundError:
        return 0


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return found


def imports_torch(pid: int) -> bool:
    try:
        return "libtorch" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def wait_for(proc: subprocess.Popen, ready: Callable[[], bool], what: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None, f"the run ended (exit {proc.returncode}) before {what}"
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.005)


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> tuple[Path, Counter]:
    """One uninterrupted run: its results file and its (case, backend, status) pairs."""
    cwd = tmp_path_factory.mktemp("baseline")
    code, err = finish(attnconf(RUN, cwd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL))
    assert code == 0, err
    done = pairs(cwd / "r.jsonl")
    assert sum(done.values()) == 2 * CASES and {b for _, b, _ in done} == {"sdpa-cpu", "test-slow-sdpa-cpu"}
    return cwd / "r.jsonl", done


def _during_imports(proc: subprocess.Popen, out: Path) -> None:
    wait_for(proc, lambda: imports_torch(proc.pid), "the parent importing torch")


def _during_worker_start(proc: subprocess.Popen, out: Path) -> None:
    wait_for(proc, lambda: bool(children(proc.pid)), "a worker process")


def _after_first_records(proc: subprocess.Popen, out: Path) -> None:
    wait_for(proc, lambda: results_written(out) >= 1, "the first record")
    for worker in children(proc.pid):  # as if the workers shared the terminal's process group
        os.kill(worker, signal.SIGINT)


def _near_the_end(proc: subprocess.Popen, out: Path) -> None:
    wait_for(proc, lambda: results_written(out) >= 2 * CASES - 1, "the last record but one")


@pytest.mark.parametrize(
    "moment", [_during_imports, _during_worker_start, _after_first_records, _near_the_end], ids=lambda f: f.__name__
)
def test_ctrl_c_at_any_moment_of_a_run_exits_130_and_resumes_exactly(moment, baseline, tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    proc = attnconf(RUN, tmp_path, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL)
    moment(proc, out)
    os.killpg(proc.pid, signal.SIGINT)
    code, err = finish(proc)
    assert code == 130, err
    assert "Traceback" not in err and "Exception ignored" not in err, err
    resume = shlex.join(["attnconf", *RUN, "--resume"])
    assert f"resume with: {resume}" in err, err
    before = pairs(out) if out.exists() else Counter()
    assert sum(before.values()) < 2 * CASES and all(before[p] <= 1 for p in before)
    assert all(status in ("pass", "fail", "unsupported") for _, _, status in before), before  # no crash record
    if moment is _during_imports:
        assert not out.exists()  # nothing ran
    if not out.exists():  # interrupted before the header: --resume is a fresh run (test_runner covers those)
        assert moment in (_during_imports, _during_worker_start)
        return
    code, err = finish(attnconf(shlex.split(resume)[1:], tmp_path, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL))
    assert code == 0, err
    assert pairs(out) == baseline[1]  # every pair once, with the verdict of an uninterrupted run


def test_ctrl_c_while_python_m_conformance_imports_the_cli_exits_130(tmp_path: Path) -> None:
    """The one import ``main`` cannot guard, ``python -m conformance``'s own ``from conformance.cli import main``:
    a KeyboardInterrupt raised inside it (planted by an import hook) ends in one line, exit 130."""
    bomb = (
        "import runpy, sys\n"
        "class Bomb:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'conformance.cli':\n"
        "            raise KeyboardInterrupt\n"
        "sys.meta_path.insert(0, Bomb())\n"
        "sys.argv = ['attnconf', 'cases', '--suite', 'smoke']\n"
        "runpy.run_module('conformance', run_name='__main__', alter_sys=True)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", bomb], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 130 and done.stderr == "attnconf: interrupted (Ctrl-C)\n", done.stderr


def _printing_commands(results: Path) -> dict[str, tuple[list[str], str]]:
    """Each subcommand that prints a lot to stdout, and the one line it may print to stderr besides."""
    return {
        "cases": (["cases", "--suite", "smoke"], ""),
        "cases --json": (["cases", "--suite", "smoke", "--json"], ""),
        "backends": (["backends"], ""),
        "backends --json": (["backends", "--json"], ""),
        "compare": (["compare", str(results), str(results)], ""),
        "report --json -": (["report", str(results), "--out", "report", "--json", "-"], "wrote report/report.md"),
        "ledger audit --json": (["ledger", "audit", str(results), "--json", "--no-suites"], ""),
        "ledger audit": (["ledger", "audit", str(results), "--no-suites"], ""),
        "merge": (["merge", str(results), "--out", "merged.jsonl"], ""),
    }


@pytest.mark.parametrize("reader", ["reads one line", "is gone"])
def test_a_reader_that_stops_early_ends_every_printing_command_quietly(reader: str, baseline, tmp_path: Path) -> None:
    """``attnconf ... | head -1``: exit 141 (or 0 when everything fit the pipe before the reader left), no traceback,
    nothing on stderr but the command's own line.  The commands run at once (each imports torch)."""
    commands = _printing_commands(baseline[0])
    procs = {}
    for name, (args, _) in commands.items():
        cwd = tmp_path / name.replace(" ", "_")
        cwd.mkdir()
        if reader == "is gone":
            read, write = os.pipe()
            procs[name] = attnconf(args, cwd, stdout=write, stderr=subprocess.PIPE)
            os.close(write)
            os.close(read)
        else:
            procs[name] = attnconf(args, cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    for name, proc in procs.items():
        if proc.stdout is not None:
            assert proc.stdout.readline(), f"{name} printed nothing"
            proc.stdout.close()
    for name, proc in procs.items():
        err = proc.stderr.read().decode()
        proc.wait(timeout=300)
        expected = commands[name][1]
        assert proc.returncode in (0, 141), (name, proc.returncode, err)
        assert "Traceback" not in err and "Exception ignored" not in err and "Broken pipe" not in err, (name, err)
        assert err == "" if not expected else err.startswith(expected) and err.count("\n") == 1, (name, err)
        if reader == "is gone":
            assert proc.returncode == 141, (name, err)
