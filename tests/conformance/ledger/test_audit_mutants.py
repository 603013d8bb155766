"""Promises of :func:`conformance.ledger.audit.audit` that mutmut found unchecked (issue 29 item 6: 25 survivors of
``conformance/ledger/audit.py``): its defaults (the built-in suites consulted, skipped lines and duplicated pairs
refused), counts that add up over files and records, the one entry a flaky pass is counted for, a refused-now
record kept apart from its entry's unlisted ones, the device a refusal is consulted on, and ``--json``'s
``refused_now`` objects key by key.  Each test names the survivors it kills; docs/guides/mutation-testing.md."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from conformance.cases.case import AttentionCase
from conformance.ledger.audit import Group, audit, refused_now
from conformance.ledger.entries import Ledger, load_ledger_dir
from conformance.records import CheckResult, ErrorStats, Header, Status
from conformance.results_writer import append_record

#: torch-flash rejects a head dim that is not a multiple of 8 (its adapter declares it: ``head dim 20: ...``)
HEAD_SIZE = "RuntimeError: head_size must be a multiple of 8, this is ensured by padding!"


def case(**kw) -> AttentionCase:
    base = dict(requests=((2, 40),), num_heads=2, num_kv_heads=2, head_dim=80, kv_layout="NHD", block_size=16)
    return AttentionCase(**{**base, **kw})


def contiguous(**kw) -> AttentionCase:
    return case(kv_layout="contiguous", block_size=None, **kw)


def rec(c: AttentionCase, status: str = "fail", *, backend: str = "kern", **kw) -> CheckResult:
    return CheckResult(c.id, backend, "fam", Status(status), c.to_json(), **{"version": "1.0", "reason": "r", **kw})


def write(path: Path, records: list[CheckResult], suite: str = "fuzz") -> Path:
    append_record(path, Header(suite=suite, backends={"kern": {"version": "1.0"}}, env={}))
    for r in records:
        append_record(path, r)
    return path


def ledger(tmp_path: Path, text: str, backend: str = "kern") -> Ledger:
    d = tmp_path / "ledgers"
    d.mkdir(exist_ok=True)
    (d / f"{backend}.toml").write_text(text)
    return load_ledger_dir(d)


D80 = '[[failure]]\nreason = "d80"\n[failure.when]\nhead_dim = 80\n'
D64 = '[[failure]]\nreason = "d64, a case of the smoke suite"\n[failure.when]\nhead_dim = 64\n'
FLAKY = '[[failure]]\nreason = "{}"\nflaky = true\n[failure.when]\nhead_dim = 96\n'


# ------------------------------------------------------------------------------------------------------ the defaults
def test_by_default_an_entry_matching_a_builtin_suite_case_is_not_stale(tmp_path: Path) -> None:
    """``suites`` (default on): an entry no record matches but a case of the built-in suites does (head dim 64: the
    smoke suite, built first) is not stale; without the suites it is.  (x_audit__mutmut_1, _114, _116, _117)"""
    led = ledger(tmp_path, D80 + D64)
    runs = write(tmp_path / "a.jsonl", [rec(case())])
    assert audit(led, [runs]).stale == []
    assert audit(led, [runs], suites=True).stale == []
    assert [e.reason for e in audit(led, [runs], suites=False).stale] == ["d64, a case of the smoke suite"]


def test_by_default_a_line_that_is_not_a_record_fails_the_audit(tmp_path: Path) -> None:
    """``allow_skipped`` is off by default: a cut line raises, naming the file.  (x_audit__mutmut_2)"""
    runs = write(tmp_path / "cut.jsonl", [rec(case())])
    with open(runs, "a") as fh:
        fh.write('{"type": "result", "cut sh')
    with pytest.raises(ValueError, match="cut.jsonl"):
        audit(Ledger([]), [runs], suites=False)


def test_by_default_a_pair_recorded_twice_fails_the_audit(tmp_path: Path) -> None:
    """``drop_duplicates`` is off by default: a (case, backend) pair twice in a file that is not a fuzz campaign
    raises, naming the file.  (x_audit__mutmut_3)"""
    runs = write(tmp_path / "twice.jsonl", [rec(case()), rec(case())], suite="smoke")
    with pytest.raises(ValueError, match="twice.jsonl"):
        audit(Ledger([]), [runs], suites=False)
    assert audit(Ledger([]), [runs], suites=False, drop_duplicates=True).dropped_duplicates == {str(runs): 1}


# ---------------------------------------------------------------------------------------------- counts that add up
def test_skipped_lines_are_counted_under_their_file(tmp_path: Path) -> None:
    """With ``allow_skipped``, :attr:`Audit.skipped` maps each file's path to its skipped lines.
    (x_audit__mutmut_31)"""
    runs = write(tmp_path / "cut.jsonl", [rec(case())])
    with open(runs, "a") as fh:
        fh.write('{"type": "result", "cut sh')
    assert audit(Ledger([]), [runs], suites=False, allow_skipped=True).skipped == {str(runs): 1}


def test_nonfinite_passes_add_up_over_files(tmp_path: Path) -> None:
    """A ``pass`` whose statistics are NaN is a fail; :attr:`Audit.nonfinite_passes` counts them over every file,
    not the last file's.  (x_audit__mutmut_28)"""
    nan = ErrorStats(math.nan, 0.0, 0.0, (0, 0, 0), 0.0, 0.0, 0.0, 0.0, 0.1, 1.0)
    one = write(tmp_path / "one.jsonl", [rec(case(head_dim=n), "pass", stats=nan) for n in (8, 16)])
    two = write(tmp_path / "two.jsonl", [rec(case(head_dim=24), "pass", stats=nan)])
    result = audit(Ledger([]), [one, two], suites=False)
    assert result.nonfinite_passes == 3 and result.problems == 3


def test_problems_explained_at_an_unknown_version_add_up(tmp_path: Path) -> None:
    """Every explained record whose version is not a PEP 440 one counts, not just whether one was.
    (x_audit__mutmut_55)"""
    led = ledger(tmp_path, D80.replace('reason = "d80"', 'reason = "d80"\nversions = ">=1.0"'))
    runs = write(tmp_path / "a.jsonl", [rec(case(requests=((n, 40),)), version="not installed") for n in (1, 2, 3)])
    result = audit(led, [runs], suites=False)
    assert (result.explained, result.unknown_version) == (3, 3)


def test_each_pass_of_a_flaky_case_is_counted_once_for_the_first_flaky_entry(tmp_path: Path) -> None:
    """Every pass of a flaky entry's case counts (two passes: 2), and for the first matching flaky entry only, as
    :meth:`Ledger.classify` gives a problem to its first entry.  (x_audit__mutmut_95, _96)"""
    led = ledger(tmp_path, FLAKY.format("first") + FLAKY.format("second"))
    runs = write(tmp_path / "a.jsonl", [rec(case(head_dim=96, requests=((n, 40),)), "pass") for n in (1, 2)])
    result = audit(led, [runs], suites=False)
    assert [(e.entry.reason, e.flaky_passes) for e in result.entries] == [("first", 2), ("second", 0)]


# ------------------------------------------------------------------------------------------------------- refused now
def test_a_refused_now_record_is_not_also_its_entrys_unlisted_problem(tmp_path: Path) -> None:
    """An error of an entry's case in a status the entry does not list, whose call the adapter now refuses, is
    listed as refused now only: not under the entry's unlisted problems, not counted among the unexplained.
    (x_audit__mutmut_68)"""
    led = ledger(tmp_path, '[[failure]]\nreason = "d20"\n[failure.when]\nhead_dim = 20\n', backend="torch-flash")
    error = rec(contiguous(head_dim=20), "error", backend="torch-flash", reason=HEAD_SIZE, device="cuda")
    fail = rec(contiguous(head_dim=20, requests=((3, 9),)), "fail", backend="torch-flash", device="cuda")
    crash = rec(contiguous(head_dim=20, requests=((4, 9),)), "crash", backend="torch-flash", device="cuda")
    runs = write(tmp_path / "a.jsonl", [error, fail, crash])
    result = audit(led, [runs], suites=False)
    assert [r.case_id for _, r, _ in result.refused_now] == [error.case_id]
    (entry,) = result.entries
    assert (entry.explained, [r.case_id for _, r in entry.unlisted]) == (1, [crash.case_id])
    assert result.unexplained_count == 1


def test_a_refusal_is_consulted_on_the_records_device_and_on_cuda_when_it_names_none() -> None:
    """The adapter's declarations on the record's device: torch-flash runs on CUDA only, so an error it recorded
    on the CPU is a call it now refuses ('runs on cuda, not cpu'); a record naming no device is read as a CUDA one
    (a case torch-flash runs there is not refused; head dim 20 gets its head-dim refusal, not a device one).
    (x_refused_now__mutmut_17, _18, _19)"""

    def error(c: AttentionCase, device: str) -> CheckResult:
        return rec(c, "error", backend="torch-flash", reason=HEAD_SIZE, device=device)

    d64, d20 = contiguous(head_dim=64), contiguous(head_dim=20)
    assert refused_now(error(d64, "cuda")) is None
    assert refused_now(error(d64, "cpu")) == "runs on cuda, not cpu"
    assert refused_now(error(d64, "")) is None
    why = refused_now(error(d20, ""))
    assert why is not None and why.startswith("head dim 20") and why == refused_now(error(d20, "cuda"))


def test_audit_json_states_each_refused_now_record_in_full(tmp_path: Path) -> None:
    """``--json``'s ``refused_now``: per record its file, backend, case, error (cut at 200 characters) and the
    declared refusal.  (xǁAuditǁto_json__mutmut_33, _34, _39, _40, _41, _42, _43)"""
    long = HEAD_SIZE + " " + "x" * 300
    error = rec(contiguous(head_dim=20), "error", backend="torch-flash", reason=long, device="cuda")
    runs = write(tmp_path / "a.jsonl", [error])
    result = audit(Ledger([]), [runs], suites=False)
    ((_, _, why),) = result.refused_now
    assert why.startswith("head dim 20")
    assert result.to_json()["refused_now"] == [
        {"file": str(runs), "backend": "torch-flash", "case_id": error.case_id, "error": long[:200], "refusal": why}
    ]


# ---------------------------------------------------------------------------------------- groups and unlisted texts
def test_a_group_counts_a_record_whose_case_names_no_head_dim_as_head_dim_0() -> None:
    """``head_dims`` of a group holding a record whose case JSON names no head dim (not a valid case): 0, beside
    the others'.  (xǁGroupǁto_json__mutmut_21)"""
    bare = CheckResult("x", "kern", "fam", Status.ERROR, {"requests": "bad"}, reason="E")
    group = Group("kern", "error | no case | E", [("a", bare), ("a", rec(case(head_dim=64)))])
    assert group.to_json()["head_dims"] == [0, 64]


def test_an_unlisted_problem_without_a_reason_is_grouped_under_an_empty_message(tmp_path: Path) -> None:
    """:meth:`EntryAudit.unlisted_groups`: a record with no reason has the message '' (the text output prints
    nothing after the status), never a placeholder.  (x__first_line__mutmut_12)"""
    runs = write(tmp_path / "a.jsonl", [rec(case(), "crash", reason=""), rec(case(requests=((3, 9),)), "crash")])
    (entry,) = audit(ledger(tmp_path, D80), [runs], suites=False).entries
    assert [(s, m, len(rs)) for s, m, rs in entry.unlisted_groups()] == [("crash", "", 1), ("crash", "r", 1)]
