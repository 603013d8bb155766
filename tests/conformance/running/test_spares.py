"""Spare workers (``attnconf run --spare-workers N``): a restart takes a worker started beforehand.

The pool's rules (lazy, per placement, ready first, replacement started, dead ones discarded, closed means closed)
are tested on fake clients that start instantly; the adoption of a real worker and whole runs with planted crashes
and hangs (records identical with and without spares, the profile's counts, no worker process left behind after
the end, Ctrl-C or SIGTERM) run real workers (``slow``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from conformance.cli import main
from conformance.records import Status
from conformance.results_file import read_records
from conformance.running.spares import DEFAULT_SPARES, Spares, _placement, spares_for
from conformance.running.worker_client import WorkerClient, WorkerStartError
from tests.conformance.fakes import CRASH_EVERY_ENV, CrashSometimesBackend
from tests.conformance.running.test_runner import case_file, tiny_cases

REPO = Path(__file__).resolve().parents[3]
FAKES = "tests.conformance.fakes"
RUNNER = "tests.conformance.running.test_runner"
MARK_ENV = "ATTNCONF_TEST_SPARES_MARK"


class FakeClient:
    """What :class:`Spares` uses of a :class:`WorkerClient`; ``start`` waits for :attr:`gate` (set: instant)."""

    made: list[FakeClient] = []

    def __init__(self, *, startup_timeout: float = 180.0, python: str = "py", env: dict | None = None) -> None:
        self.startup_timeout, self.python, self.env = startup_timeout, python, dict(env or {})
        self.preload: list[str] = []
        self.respawn = True
        self.spawned = self.started = self.killed = False
        self.dead = False
        self.fail = False
        self.gate = threading.Event()
        self.gate.set()
        FakeClient.made.append(self)

    @property
    def alive(self) -> bool:
        return self.spawned and not self.killed and not self.dead

    def spawn(self) -> None:
        self.spawned = True

    def start(self) -> None:
        self.gate.wait(10)
        if self.fail or self.killed:
            raise WorkerStartError("planted: did not start")
        self.started = True

    def kill(self) -> None:
        self.killed = True
        self.gate.set()


@pytest.fixture
def made():
    FakeClient.made = []
    return FakeClient.made


def slot(env: dict[str, str | None] | None = None) -> WorkerClient:
    client = WorkerClient(env=env or {"CUDA_VISIBLE_DEVICES": "0"})
    client.preload = ["fake-exact"]
    return client


def settle(spares: Spares) -> None:
    for thread in list(spares._threads):
        thread.join(5)


def test_no_spares_means_none_and_nothing_started(made) -> None:
    spares = Spares(0, factory=FakeClient)  # type: ignore[arg-type]
    assert spares.take(slot()) is None
    assert made == [] and spares.stats()["started"] == 0


def test_nothing_starts_before_a_slot_asks(made) -> None:
    Spares(2, factory=FakeClient)  # type: ignore[arg-type]
    assert made == []


def test_a_take_fills_the_placement_hands_one_and_starts_its_replacement(made) -> None:
    spares = Spares(2, factory=FakeClient)  # type: ignore[arg-type]
    s = slot()
    got = spares.take(s)
    assert isinstance(got, FakeClient) and got.started and got.alive
    assert got.env == s.env and got.preload == s.preload and got.respawn is False  # the slot's placement
    assert len(made) == 3  # two filled, one taken, its replacement
    settle(spares)
    again = spares.take(s)
    assert again is made[1]  # the oldest ready one
    assert len(made) == 4
    assert spares.stats() == {"per_placement": 2, "started": 4, "taken": 2, "discarded": 0, "unused": 0}
    spares.close()
    assert all(c.killed for c in made[2:]) and not made[0].killed and not made[1].killed
    assert spares.stats()["unused"] == 2


def test_placements_do_not_share_spares(made) -> None:
    spares = Spares(1, factory=FakeClient)  # type: ignore[arg-type]
    a, b = slot({"CUDA_VISIBLE_DEVICES": "0"}), slot({"CUDA_VISIBLE_DEVICES": "1"})
    got_a = spares.take(a)
    got_b = spares.take(b)
    assert got_a is not None and got_a.env["CUDA_VISIBLE_DEVICES"] == "0"
    assert got_b is not None and got_b.env["CUDA_VISIBLE_DEVICES"] == "1"
    settle(spares)
    waiting = {k[1]: [s.client.env["CUDA_VISIBLE_DEVICES"] for s in q] for k, q in spares._waiting.items()}
    assert sorted(waiting.values()) == [["0"], ["1"]]
    spares.close()


def test_a_ready_spare_goes_before_one_still_starting(made) -> None:
    def factory(**kw: Any) -> FakeClient:
        client = FakeClient(**kw)
        if len(made) == 1:
            client.gate.clear()  # the first spare is slow to start
        return client

    spares = Spares(2, factory=factory)  # type: ignore[arg-type]
    s = slot()
    with spares._lock:
        spares._fill(_placement(s), s)  # as take() fills a placement
    for _ in range(100):
        if made[1].started:
            break
        time.sleep(0.01)
    try:
        assert spares.take(s) is made[1]  # ready, though started second
    finally:
        made[0].gate.set()
        spares.close()


def test_dead_and_failed_spares_are_discarded(made) -> None:
    spares = Spares(2, factory=FakeClient)  # type: ignore[arg-type]
    s = slot()
    spares.take(s)
    settle(spares)
    made[1].dead = True  # both died while they waited
    made[2].dead = True
    got = spares.take(s)
    assert got is not None and got not in (made[1], made[2]) and got.alive
    assert made[1].killed and made[2].killed
    assert spares.stats()["discarded"] == 2
    spares.close()


def test_a_spare_that_cannot_start_is_skipped_for_the_next(made) -> None:
    def factory(**kw: Any) -> FakeClient:
        client = FakeClient(**kw)
        client.fail = len(made) == 1  # the first one's start fails
        return client

    spares = Spares(1, factory=factory)  # type: ignore[arg-type]
    got = spares.take(slot())
    assert got is made[1] and made[0].killed and spares.stats()["discarded"] == 1
    spares.close()


def test_when_no_spare_can_start_the_slot_starts_its_own(made) -> None:
    """A machine where no worker starts (every spare fails its start): a take gives up after ``per_placement + 1``
    failed spares and returns None, so the slot's own start reports why; it never loops starting spares."""

    def factory(**kw: Any) -> FakeClient:
        client = FakeClient(**kw)
        client.fail = True
        return client

    spares = Spares(2, factory=factory)  # type: ignore[arg-type]
    done: list[WorkerClient | None] = []
    taker = threading.Thread(target=lambda: done.append(spares.take(slot())), daemon=True)
    taker.start()
    taker.join(10)
    assert done == [None], "take() kept starting spares that cannot start"
    assert spares.stats()["discarded"] >= 3
    spares.close()


def test_close_kills_every_spare_and_later_takes_refuse(made) -> None:
    spares = Spares(2, factory=FakeClient)  # type: ignore[arg-type]
    s = slot()
    spares.take(s)
    spares.close()
    assert all(c.killed for c in made[1:])
    with pytest.raises(WorkerStartError):
        spares.take(s)
    assert len(made) == 3  # nothing started after close
    spares.close()  # idempotent


def test_drain_kills_every_spare_and_later_takes_start_their_own(made) -> None:
    spares = Spares(2, factory=FakeClient)  # type: ignore[arg-type]
    s = slot()
    assert spares.take(s) is not None
    spares.drain()
    assert len(made) == 3 and made[0].killed is False and all(c.killed for c in made[1:])  # the taken one lives
    assert spares.take(s) is None and len(made) == 3  # not closed: the slot starts its own; no spare starts
    assert spares.stats() == {"per_placement": 2, "started": 3, "taken": 1, "discarded": 0, "unused": 2}
    spares.close()
    with pytest.raises(WorkerStartError):
        spares.take(s)


def slow_start(**kw: Any) -> FakeClient:
    """A spare whose start does not finish until its gate is set (never, in these tests)."""
    client = FakeClient(**kw)
    client.gate.clear()
    return client


def test_close_wakes_a_slot_waiting_for_a_starting_spare(made) -> None:
    spares = Spares(1, factory=slow_start)  # type: ignore[arg-type]
    errors: list[BaseException] = []

    def take() -> None:
        try:
            spares.take(slot())
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    thread = threading.Thread(target=take)
    thread.start()
    time.sleep(0.2)
    assert thread.is_alive()  # waiting for the spare's start
    spares.close()
    thread.join(5)
    assert not thread.is_alive() and len(errors) == 1 and isinstance(errors[0], WorkerStartError)
    assert made and all(c.killed for c in made)


def test_drain_hands_a_slot_waiting_for_a_starting_spare_none(made) -> None:
    spares = Spares(1, factory=slow_start)  # type: ignore[arg-type]
    got: list[object] = []
    thread = threading.Thread(target=lambda: got.append(spares.take(slot())))
    thread.start()
    time.sleep(0.2)
    assert thread.is_alive()  # waiting for the spare's start
    spares.drain()
    thread.join(5)
    assert not thread.is_alive() and got == [None]  # the slot starts its own; the run goes on
    assert made and all(c.killed for c in made)


def test_auto_is_two_and_none_when_timed() -> None:
    assert spares_for(None, timed=False) == DEFAULT_SPARES == 2
    assert spares_for(None, timed=True) == 0
    assert spares_for(3, timed=True) == 3 and spares_for(0, timed=False) == 0


def test_the_crashing_fake_crashes_on_a_stable_third_of_the_cases() -> None:
    crashes = [CrashSometimesBackend.crashes(c) for c in tiny_cases(12)]
    assert 2 <= sum(crashes) <= 8 and crashes == [CrashSometimesBackend.crashes(c) for c in tiny_cases(12)]


# --- real workers ----------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_restart_adopts_a_started_worker() -> None:
    slot_client, spare = WorkerClient(), WorkerClient()
    spare.respawn = False
    spare.start()
    pid = spare.proc.pid
    slot_client.spares = lambda _: spare
    try:
        slot_client.start()  # a first start is the slot's own
        assert slot_client.adopted == 0 and slot_client.proc.pid != pid
        slot_client.kill()
        time.sleep(0.3)
        reply = slot_client.request({"op": "load", "backends": []}, timeout=60)  # the restart adopts
        assert reply.kind == "ok" and reply.data["ok"]
        assert slot_client.proc.pid == pid and spare.proc is None
        assert slot_client.starts == 2 and slot_client.adopted == 1 and len(slot_client.start_s) == 2
        assert len(slot_client.wait_s) == 2 and slot_client.wait_s[1] < 1.0
        assert reply.data["idle_s"] < 0.25  # its wait before the adoption is not the run's idle time
    finally:
        slot_client.close()
        spare.close()


def _marked() -> list[int]:
    """Pids of live processes whose environment carries this test run's mark (the run's workers and spares)."""
    found = []
    mark = f"{MARK_ENV}={os.environ[MARK_ENV]}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if mark in (entry / "environ").read_bytes().split(b"\0"):
                status = (entry / "status").read_text()
                if "State:\tZ" not in status:
                    found.append(int(entry.name))
        except OSError:
            continue
    return found


@pytest.fixture
def marked(monkeypatch):
    if not Path("/proc/self/environ").exists():
        pytest.skip("needs /proc to find the run's processes")
    monkeypatch.setenv(MARK_ENV, uuid.uuid4().hex)
    yield
    left = _marked()
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"worker processes outlived the test: {left}"


def _run_args(tmp_path: Path, spares: str, n_cases: int, *extra: str) -> list[str]:
    out = tmp_path / f"r{spares}.jsonl"
    return [
        "run", "--case-json", case_file(tmp_path, tiny_cases(n_cases)),
        "--backend", f"{FAKES}:CrashSometimesBackend", "--backend", f"{FAKES}:ExactBackend",
        "--jobs", "2", "--out", str(out), "--no-progress", "--json", str(tmp_path / f"s{spares}.json"),
        "--spare-workers", spares, *extra,
    ]  # fmt: skip


def _attnconf(args: list[str], env: dict[str, str] | None = None, timeout: float = 300):
    return subprocess.run(
        [sys.executable, "-m", "conformance", *args],
        cwd=REPO, capture_output=True, text=True, check=False, timeout=timeout, env={**os.environ, **(env or {})},
    )  # fmt: skip


def _records(path: Path) -> list[tuple[str, str, str, str]]:
    _, results = read_records(path)
    return sorted((r.case_id, r.backend, r.status.value, (r.reason or "").splitlines()[0] if r.reason else "")
                  for r in results)  # fmt: skip


@pytest.mark.slow
def test_records_match_with_and_without_spares_and_restarts_take_them(tmp_path: Path, marked) -> None:
    profiles = {}
    for spares in ("0", "2"):
        res = _attnconf(_run_args(tmp_path, spares, 8, "--profile"), env={CRASH_EVERY_ENV: "3"})
        assert res.returncode == 1, res.stderr
        assert not _marked()  # nothing outlives the run
        profiles[spares] = json.loads((tmp_path / f"s{spares}.json").read_text())["profile"]
        if spares == "2":
            assert "took a spare worker" in res.stderr and "spares: 2 per placement" in res.stderr
    crashed = sum(CrashSometimesBackend.crashes(c) for c in tiny_cases(8))
    assert crashed >= 2
    off, on = _records(tmp_path / "r0.jsonl"), _records(tmp_path / "r2.jsonl")
    assert off == on and sum(r[2] == "crash" for r in on) == crashed
    for prof in profiles.values():
        assert prof["restarts"] == crashed and len(prof["worker_starts_s"]) == 2 + crashed
        assert prof["restart_wait_s"] <= prof["worker_wait_s"]
    assert profiles["0"]["restarts_from_spare"] == 0 and profiles["0"]["spares"]["started"] == 0
    sp = profiles["2"]["spares"]
    assert profiles["2"]["restarts_from_spare"] == crashed == sp["taken"]
    assert sp["started"] == sp["taken"] + sp["discarded"] + sp["unused"] and sp["unused"] <= 2


@pytest.mark.slow
def test_a_hang_and_a_crash_restart_from_spares_with_the_same_records(tmp_path: Path, marked) -> None:
    recs = {}
    for spares in ("0", "1"):
        out = tmp_path / f"h{spares}.jsonl"
        args = ["run", "--case-json", case_file(tmp_path, tiny_cases(2))]
        for b in ("CrashingBackend", "HangingBackend", "ExactBackend"):
            args += ["--backend", f"{FAKES}:{b}"]
        args += ["--timeout", "4", "--out", str(out), "--no-progress", "--json", str(tmp_path / f"h{spares}.json")]
        res = _attnconf([*args, "--spare-workers", spares])
        assert res.returncode == 1, res.stderr
        assert not _marked()
        recs[spares] = _records(out)
        prof = json.loads((tmp_path / f"h{spares}.json").read_text())["profile"]
        assert prof["restarts"] == 4 and prof["restarts_from_spare"] == (4 if spares == "1" else 0)
    assert recs["0"] == recs["1"]
    assert [r[2] for r in recs["1"]].count("timeout") == 2 and [r[2] for r in recs["1"]].count("crash") == 2


@pytest.mark.slow
def test_no_spare_outlives_a_run_in_this_process(tmp_path: Path, marked, monkeypatch) -> None:
    """The run's parent is this process, so a spare left unclosed would still be alive here."""
    monkeypatch.setenv(CRASH_EVERY_ENV, "2")
    assert main(_run_args(tmp_path, "2", 6)) == 1
    assert not _marked()
    prof = json.loads((tmp_path / "s2.json").read_text())["profile"]
    assert prof["restarts_from_spare"] >= 1 and prof["spares"]["started"] > prof["spares"]["taken"]


def _wait_for_spares(proc: subprocess.Popen, out: Path, records: int) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if out.exists() and out.read_text().count('"status": "crash"') >= 1 and len(_marked()) >= 3:
            if out.read_text().count('"type": "result"') >= records:
                return
        assert proc.poll() is None, "the run ended before it could be stopped"
        time.sleep(0.05)
    raise AssertionError("no spare started")


def _slow_run(tmp_path: Path) -> tuple[list[str], Path]:
    out = tmp_path / "r.jsonl"
    args = ["run", "--case-json", case_file(tmp_path, tiny_cases(40)), "--out", str(out), "--no-progress"]
    args += ["--backend", f"{FAKES}:CrashSometimesBackend", "--backend", f"{RUNNER}:SlowExactBackend"]
    return [*args, "--jobs", "1", "--spare-workers", "2"], out


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_no_spare_outlives_an_interrupted_run(tmp_path: Path, marked, sig: signal.Signals) -> None:
    args, out = _slow_run(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "conformance", *args], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True, env={**os.environ, CRASH_EVERY_ENV: "3"},
    )  # fmt: skip
    try:
        _wait_for_spares(proc, out, 4)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    if sig == signal.SIGINT:
        assert proc.returncode == 130 and "Traceback" not in err, err
    else:
        assert proc.returncode == -signal.SIGTERM
    deadline = time.monotonic() + 10  # after SIGTERM the workers' parent watchdog (1 s period) ends them
    while _marked() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _marked()
    _, kept = read_records(out)
    assert kept and all(r.status in (Status.PASS, Status.CRASH) for r in kept)
