"""The audit's collateral (:func:`conformance.ledger.audit.collateral`): a pair a lost device or a broken CUDA
context (a CUDA error in the harness or the kernel's step) left unjudged is explained by the entry whose fault came
before it in the same run, and by nothing else: not before the fault, not on another GPU, not after a known problem
of an entry that does not say it faults, not without its time in the run, and a broken context only after a fault of
its own worker."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from conformance.cases.case import AttentionCase
from conformance.ledger.audit import audit, collateral
from conformance.ledger.cli import _print
from conformance.ledger.entries import Ledger, load_ledger_dir
from conformance.records import HARNESS_ERROR, LOST_DEVICE, CheckResult, Header, Status
from conformance.results_writer import append_record

FAULTS = (
    '[[failure]]\nreason = "d80 faults"\nstatuses = ["error"]\nmessages = { error = "illegal memory access" }\n'
    'faults = "a sticky CUDA error"\n[failure.when]\nhead_dim = 80\n'
)
QUIET = '[[failure]]\nreason = "d96 is wrong"\n[failure.when]\nhead_dim = 96\n'
FAULT = "AcceleratorError: CUDA error: an illegal memory access was encountered"
LOST = LOST_DEVICE + "no CUDA device (torch.cuda.is_available() is False)"
BROKEN = HARNESS_ERROR + "AcceleratorError: CUDA error: an illegal instruction was encountered"


def case(head_dim: int, n: int = 40) -> AttentionCase:
    return AttentionCase(requests=((2, n),), num_heads=2, num_kv_heads=2, head_dim=head_dim)


def rec(c: AttentionCase, status: str, reason: str, at: float | None, backend: str = "kern", **extra) -> CheckResult:
    if at is not None:
        extra["t"] = {"at": at}
    return CheckResult(c.id, backend, "fam", Status(status), c.to_json(), version="1.0", reason=reason, extra=extra)


def ledger(tmp_path: Path, text: str = FAULTS + QUIET) -> Ledger:
    d = tmp_path / "ledgers"
    d.mkdir(exist_ok=True)
    (d / "kern.toml").write_text(text)
    (d / "other.toml").write_text("")
    return load_ledger_dir(d)


def write(path: Path, records: list[CheckResult]) -> Path:
    append_record(path, Header(suite="default", backends={"kern": {"version": "1.0"}}, env={}))
    for r in records:
        append_record(path, r)
    return path


def run_audit(tmp_path: Path, records: list[CheckResult], text: str = FAULTS + QUIET, name: str = "run.jsonl"):
    return audit(ledger(tmp_path, text), [write(tmp_path / name, records)], suites=False)


def test_a_lost_device_after_a_fault_is_its_entrys_collateral(tmp_path: Path) -> None:
    fault = rec(case(80), "error", FAULT, 10.0)
    lost = rec(case(64), "error", LOST, 12.5, backend="other")
    result = run_audit(tmp_path, [fault, lost])
    assert (result.problems, result.explained, result.unexplained_count, result.collateral_count) == (2, 2, 0, 1)
    entry = result.entries[0]
    assert [(r.case_id, after) for _, r, after in entry.collateral] == [(lost.case_id, f"{fault.case_id} kern")]
    assert entry.explained == 1  # its own record; the collateral is listed apart
    assert result.unexplained == []


def test_a_lost_device_names_the_latest_fault_before_it(tmp_path: Path) -> None:
    first, second = rec(case(80, 40), "error", FAULT, 5.0), rec(case(80, 41), "error", FAULT, 9.0)
    late = rec(case(80, 42), "error", FAULT, 30.0)
    lost = rec(case(64), "error", LOST, 12.0)
    result = run_audit(tmp_path, [late, first, lost, second])
    assert [after for _, _, after in result.entries[0].collateral] == [f"{second.case_id} kern"]


@pytest.mark.parametrize(
    "fault_at, fault_gpu, lost_at, lost_gpu",
    [
        (12.0, None, 12.0, None),  # not before it
        (13.0, None, 12.0, None),  # after it
        (10.0, "1", 12.0, "0"),  # another GPU
        (10.0, None, 12.0, "0"),  # a GPU named on one side only
        (None, None, 12.0, None),  # the fault's time unknown
        (10.0, None, None, None),  # the lost pair's time unknown
    ],
)
def test_a_lost_device_is_not_collateral_of_a_fault_it_cannot_follow(
    tmp_path: Path, fault_at, fault_gpu, lost_at, lost_gpu
) -> None:
    fault = rec(case(80), "error", FAULT, fault_at, **({"gpu": fault_gpu} if fault_gpu else {}))
    lost = rec(case(64), "error", LOST, lost_at, **({"gpu": lost_gpu} if lost_gpu else {}))
    result = run_audit(tmp_path, [fault, lost])
    assert (result.collateral_count, result.unexplained_count) == (0, 1)


def test_a_known_problem_of_an_entry_that_does_not_fault_leaves_no_collateral(tmp_path: Path) -> None:
    wrong = rec(case(96), "fail", "max_error", 10.0)
    lost = rec(case(64), "error", LOST, 12.0)
    result = run_audit(tmp_path, [wrong, lost])
    assert (result.explained, result.collateral_count, result.unexplained_count) == (1, 0, 1)


def test_an_unexplained_fault_leaves_no_collateral(tmp_path: Path) -> None:
    """A fault no entry explains (d64 here) excuses nothing after it: both stay unexplained."""
    fault = rec(case(64, 41), "error", FAULT, 10.0)
    lost = rec(case(64), "error", LOST, 12.0)
    assert run_audit(tmp_path, [fault, lost]).unexplained_count == 2


def test_a_lost_device_of_an_entrys_own_case_is_collateral_not_unlisted(tmp_path: Path) -> None:
    """The entry lists ``error 'illegal memory access'``; its own case lost to the device is not an unlisted
    message of the cause but the collateral of the fault before it."""
    fault, lost = rec(case(80, 40), "error", FAULT, 10.0), rec(case(80, 41), "error", LOST, 12.0)
    result = run_audit(tmp_path, [fault, lost])
    assert (result.unlisted_count, result.collateral_count, result.unexplained_count) == (0, 1, 0)
    # with no fault before it, it is unlisted as before
    assert run_audit(tmp_path, [lost], name="alone.jsonl").unlisted_count == 1


def test_a_broken_context_follows_a_fault_of_its_own_worker(tmp_path: Path) -> None:
    fault = rec(case(80), "error", FAULT, 10.0, worker=3)
    mine = rec(case(64, 41), "error", BROKEN, 11.0, worker=3)
    theirs = rec(case(64, 42), "error", BROKEN, 11.0, worker=4)
    result = run_audit(tmp_path, [fault, mine, theirs])
    assert [r.case_id for _, r, _ in result.entries[0].collateral] == [mine.case_id]
    assert result.unexplained_count == 1


def test_a_broken_context_follows_only_its_workers_latest_problem(tmp_path: Path) -> None:
    """Another problem of the worker between the fault and the broken context (an unexplained fail here) is the
    pair that came last: the fault is not named."""
    fault = rec(case(80), "error", FAULT, 10.0, worker=3)
    between = rec(case(64, 43), "fail", "max_error", 10.5, worker=3)
    broken = rec(case(64, 41), "error", BROKEN, 11.0, worker=3)
    result = run_audit(tmp_path, [fault, between, broken])
    assert (result.collateral_count, result.unexplained_count) == (0, 2)


def test_a_broken_context_naming_its_pair_is_judged_by_that_pair(tmp_path: Path) -> None:
    """``context_broken_after`` (the runner's record of the worker's previous pair) decides alone: a fault named
    there explains it even from another worker slot; a pair named there that is no fault (a pass, absent from
    the problems) explains nothing, though a fault of the same worker came before."""
    fault = rec(case(80), "error", FAULT, 10.0, worker=3)
    named = rec(case(64, 41), "error", BROKEN, 11.0, worker=5, context_broken_after=f"{case(80).id} kern")
    passing = rec(case(64, 42), "error", BROKEN, 12.0, worker=3, context_broken_after=f"{case(64, 44).id} kern")
    result = run_audit(tmp_path, [fault, named, passing])
    assert [r.case_id for _, r, _ in result.entries[0].collateral] == [named.case_id]
    assert result.unexplained_count == 1


def test_a_kernels_cuda_error_after_its_workers_fault_is_collateral(tmp_path: Path) -> None:
    """A sticky CUDA error is reported by the next call of the process, the kernel's own step included: a kernel's
    CUDA error right after its worker's fault is collateral too."""
    fault = rec(case(80), "error", FAULT, 10.0, worker=3)
    own = rec(case(64, 41), "error", "AcceleratorError: CUDA error: an illegal instruction", 11.0, worker=3)
    result = run_audit(tmp_path, [fault, own])
    assert (result.collateral_count, result.unexplained_count) == (1, 0)


def test_other_problems_after_a_fault_are_not_collateral(tmp_path: Path) -> None:
    """Only a lost device or a CUDA error (OOMs aside) can be collateral: a kernel's fail, another exception or an
    OOM after a fault is the kernel's answer, unexplained unless an entry explains it."""
    fault = rec(case(80), "error", FAULT, 10.0, worker=3)
    records = [fault]
    for i, (status, reason) in enumerate(
        [
            ("fail", "max_error"),
            ("error", "ValueError: bad call"),
            ("error", "OutOfMemoryError: CUDA out of memory."),
            ("crash", "worker killed by SIGSEGV"),
        ]
    ):
        records.append(
            rec(case(64, 41 + i), status, reason, 11.0 + i, worker=3, context_broken_after=f"{case(80).id} kern")
        )
    result = run_audit(tmp_path, records)
    assert (result.collateral_count, result.unexplained_count) == (0, 4)


def test_collateral_is_per_run(tmp_path: Path) -> None:
    """A fault in one file excuses nothing in another."""
    led = ledger(tmp_path)
    one = write(tmp_path / "one.jsonl", [rec(case(80), "error", FAULT, 10.0)])
    two = write(tmp_path / "two.jsonl", [rec(case(64), "error", LOST, 12.0)])
    assert audit(led, [one, two], suites=False).unexplained_count == 1


def test_collateral_maps_records_to_the_entry_and_the_pair(tmp_path: Path) -> None:
    """The function itself, on records: an empty answer without faults."""
    led_entry = ledger(tmp_path).entries[0]
    fault = rec(case(80), "error", FAULT, 1.0)
    lost = rec(case(64), "error", LOST, 2.0)
    assert collateral([], [lost]) == {}
    assert collateral([(fault, led_entry)], [lost]) == {id(lost): (led_entry, f"{fault.case_id} kern")}


def test_the_text_and_json_name_the_collateral(tmp_path: Path) -> None:
    fault, lost = rec(case(80), "error", FAULT, 10.0), rec(case(64), "error", LOST, 12.0)
    result = run_audit(tmp_path, [fault, lost])
    out = io.StringIO()
    _print(result, out)
    text = out.getvalue()
    assert "1 of the explained are collateral" in text
    assert "COLLATERAL 1 records after its faults (1 lost device, 0 broken context)" in text
    assert f"e.g. kern {lost.case_id} after {fault.case_id} kern" in text
    data = json.loads(json.dumps(result.to_json()))
    assert data["collateral"] == 1 and data["unexplained"] == 0
    assert data["entries"][0]["collateral"] == [
        {
            "file": str(tmp_path / "run.jsonl"),
            "case_id": lost.case_id,
            "backend": "kern",
            "reason": LOST[:200],
            "after": f"{fault.case_id} kern",
        }
    ]


def test_faults_must_say_how(tmp_path: Path) -> None:
    for bad in ('""', "true", '"  "'):
        with pytest.raises(ValueError, match="'faults' must say how"):
            ledger(tmp_path, FAULTS.replace('"a sticky CUDA error"', bad))
    assert ledger(tmp_path).entries[0].faults == "a sticky CUDA error"
    assert ledger(tmp_path).entries[1].faults == ""


# ------------------------------------------------------------------------------- mutants the first tests let through
def test_a_lost_device_follows_a_fault_on_its_own_named_gpu(tmp_path: Path) -> None:
    """Both on GPU 1: collateral (the GPU is read from each record, not assumed absent on both)."""
    fault = rec(case(80), "error", FAULT, 10.0, gpu="1")
    lost = rec(case(64), "error", LOST, 12.0, gpu="1")
    assert run_audit(tmp_path, [fault, lost]).collateral_count == 1


def test_a_broken_context_follows_a_fault_of_its_worker_on_its_own_named_gpu(tmp_path: Path) -> None:
    fault = rec(case(80), "error", FAULT, 10.0, worker=3, gpu="1")
    broken = rec(case(64, 41), "error", BROKEN, 11.0, worker=3, gpu="1")
    elsewhere = rec(case(64, 42), "error", BROKEN, 12.0, worker=3, gpu="0")  # slot 3 of another GPU's placement
    result = run_audit(tmp_path, [fault, broken, elsewhere])
    assert [r.case_id for _, r, _ in result.entries[0].collateral] == [broken.case_id]


def test_a_fault_at_the_same_moment_is_not_before(tmp_path: Path) -> None:
    fault = rec(case(80), "error", FAULT, 11.0, worker=3)
    broken = rec(case(64, 41), "error", BROKEN, 11.0, worker=3)
    assert run_audit(tmp_path, [fault, broken]).collateral_count == 0


def test_faults_at_one_moment_name_the_first_of_them(tmp_path: Path) -> None:
    """Two faults received at the same moment: the first in the file is named (max over the times alone; records
    themselves are not ordered)."""
    one, two = rec(case(80, 40), "error", FAULT, 10.0, worker=3), rec(case(80, 41), "error", FAULT, 10.0, worker=3)
    lost = rec(case(64), "error", LOST, 12.0)
    result = run_audit(tmp_path, [one, two, lost])
    assert [after for _, _, after in result.entries[0].collateral] == [f"{one.case_id} kern"]
    broken = rec(case(64, 41), "error", BROKEN, 12.0, worker=3)
    result = run_audit(tmp_path, [one, two, broken], name="broken.jsonl")
    assert [after for _, _, after in result.entries[0].collateral] == [f"{one.case_id} kern"]


def test_a_record_that_is_not_collateral_does_not_end_the_search(tmp_path: Path) -> None:
    """A record without its time, or naming a previous pair that is no fault, comes first: the records after it
    are still judged."""
    fault = rec(case(80), "error", FAULT, 10.0, worker=3)
    timeless = rec(case(64, 40), "error", LOST, None)
    not_a_fault = rec(case(64, 41), "error", BROKEN, 11.0, worker=4, context_broken_after=f"{case(64, 44).id} kern")
    lost = rec(case(64, 42), "error", LOST, 12.0)
    result = run_audit(tmp_path, [fault, timeless, not_a_fault, lost])
    assert [r.case_id for _, r, _ in result.entries[0].collateral] == [lost.case_id]


def test_a_collateral_record_is_not_also_refused_now(tmp_path: Path) -> None:
    """torch-flash refuses head dim 20 today; its lost-device record after a fault is collateral, and only that."""
    text = FAULTS.replace("head_dim = 80", "head_dim = 32")
    d = tmp_path / "ledgers"
    d.mkdir()
    (d / "torch-flash.toml").write_text(text)
    fault = rec(case(32), "error", FAULT, 10.0, backend="torch-flash")
    lost = rec(case(20), "error", LOST, 12.0, backend="torch-flash")
    result = audit(load_ledger_dir(d), [write(tmp_path / "r.jsonl", [fault, lost])], suites=False)
    assert (result.collateral_count, result.refused_now, result.unexplained_count) == (1, [], 0)
