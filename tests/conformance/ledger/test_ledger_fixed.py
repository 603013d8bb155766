"""A defect of this harness in the ledger (``fixed = { commit, date }``): it explains the problems, harness errors
included, of runs begun before its fix and nothing else: not a later run's (the fix regressed), not a record whose
run's start is unknown, not a live run's classification; it claims no pass and counts none as flaky."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from conformance.cases.case import AttentionCase
from conformance.ledger.audit import audit
from conformance.ledger.cli import _print
from conformance.ledger.entries import Ledger, load_ledger_dir
from conformance.records import HARNESS_ERROR, CheckResult, Header, Status
from conformance.results_writer import append_record

FIX = "2026-11-24T17:38:07+00:00"
FIXED = (
    '[[failure]]\nreason = "adapter: a bad append call"\nstatuses = ["error"]\n'
    'messages = { error = "If key is supplied" }\n'
    f'fixed = {{ commit = "703452a", date = "{FIX}" }}\n[failure.when]\nhead_dim = 80\n'
)
HARNESS = (
    '[[failure]]\nreason = "harness: the reference\'s assembly raised"\nstatuses = ["error"]\n'
    'messages = { error = "ValueError: picks:" }\n'
    f'fixed = {{ commit = "30c22f1", date = "{FIX}" }}\n[failure.when]\nhead_dim = 96\n'
)
BAD_CALL = "RuntimeError: If key is supplied, it must have seqlen <= the seqlen of the KV cache"
BEFORE, AFTER = "2026-11-24T16:44:17+00:00", "2026-11-24T18:02:22+00:00"


def case(head_dim: int, n: int = 40) -> AttentionCase:
    return AttentionCase(requests=((2, n),), num_heads=2, num_kv_heads=2, head_dim=head_dim)


def rec(c: AttentionCase, status: str = "error", reason: str = BAD_CALL) -> CheckResult:
    return CheckResult(c.id, "kern", "fam", Status(status), c.to_json(), version="1.0", reason=reason)


def ledger(tmp_path: Path, text: str = FIXED + HARNESS) -> Ledger:
    d = tmp_path / "ledgers"
    d.mkdir(exist_ok=True)
    (d / "kern.toml").write_text(text)
    return load_ledger_dir(d)


def write(path: Path, records: list[CheckResult], started: str) -> Path:
    append_record(path, Header(suite="fuzz", backends={"kern": {"version": "1.0"}}, env={}, started=started))
    for r in records:
        append_record(path, r)
    return path


def test_a_fixed_defect_explains_the_problems_of_runs_begun_before_its_fix(tmp_path: Path) -> None:
    led = ledger(tmp_path)
    before = write(tmp_path / "before.jsonl", [rec(case(80, 40)), rec(case(80, 41))], BEFORE)
    after = write(tmp_path / "after.jsonl", [rec(case(80, 42))], AFTER)
    result = audit(led, [before, after], suites=False)
    assert (result.problems, result.explained, result.unexplained_count) == (3, 2, 1)
    assert result.entries[0].explained == 2 and result.entries[0].files == {str(before): 2}
    [group] = result.unexplained  # the later run's: the fix regressed, nothing explains it
    assert [r.case_id for _, r in group.records] == [case(80, 42).id]


def test_a_run_whose_start_is_unknown_or_has_no_zone_is_not_excused(tmp_path: Path) -> None:
    led = ledger(tmp_path)
    for i, started in enumerate(("", "yesterday", "2026-11-24T16:44:17")):
        runs = write(tmp_path / f"r{i}.jsonl", [rec(case(80))], started)
        assert audit(led, [runs], suites=False).unexplained_count == 1, started


def test_a_harness_error_is_explained_by_a_fixed_harness_defect_only(tmp_path: Path) -> None:
    """A harness error is never a kernel's: a kernel's entry never explains one, a fixed harness defect does."""
    error = HARNESS_ERROR + "ValueError: picks: kv_len 1 of requests[1] must be in [0, 0]"
    kernels = '[[failure]]\nreason = "d96 errors"\nstatuses = ["error"]\n[failure.when]\nhead_dim = 96\n'
    runs = write(tmp_path / "r.jsonl", [rec(case(96), reason=error)], BEFORE)
    assert audit(ledger(tmp_path, kernels), [runs], suites=False).unexplained_count == 1
    result = audit(ledger(tmp_path, HARNESS), [runs], suites=False)
    assert (result.explained, result.unexplained_count) == (1, 0)


def test_a_fixed_defect_claims_no_pass_and_counts_none_as_flaky(tmp_path: Path) -> None:
    runs = write(tmp_path / "r.jsonl", [rec(case(80, 40), "pass", ""), rec(case(80, 41))], BEFORE)
    result = audit(ledger(tmp_path), [runs], suites=False)
    assert result.passes_claimed == 0 and result.entries[0].flaky_passes == 0 and result.explained == 1


def test_a_live_classification_never_applies_a_fixed_defect(tmp_path: Path) -> None:
    """``run``, ``report`` and pytest classify without a run start: a fixed harness defect explains nothing there,
    so its return is unexpected; with a start before the fix it explains."""
    led = ledger(tmp_path)
    r = rec(case(80))
    assert led.classify([r]).unexpected == [r] and led.explain(r) is None
    assert [e.reason for _, e in led.classify([r], started=lambda _: BEFORE).known] == ["adapter: a bad append call"]
    assert led.classify([r], started=lambda _: AFTER).unexpected == [r]
    assert led.entries[0].explains(r, BEFORE) and not led.entries[0].explains(r, AFTER)


def test_a_fixed_entry_matching_cases_is_not_stale(tmp_path: Path) -> None:
    runs = write(tmp_path / "after.jsonl", [rec(case(80), "pass", "")], AFTER)
    assert audit(ledger(tmp_path, FIXED), [runs], suites=False).stale == []


@pytest.mark.parametrize(
    "value",
    [
        '"703452a"',
        '{ commit = "703452a" }',
        f'{{ date = "{FIX}" }}',
        f'{{ commit = "70345", date = "{FIX}" }}',  # too short
        f'{{ commit = "703452G", date = "{FIX}" }}',  # not hex
        f'{{ commit = 7034520, date = "{FIX}" }}',  # not a string
        '{ commit = "703452a", date = "2026-11-24T17:38:07" }',  # no zone
        '{ commit = "703452a", date = "soon" }',
        '{ commit = "703452a", date = 2026 }',
        f'{{ commit = "703452a", date = "{FIX}", by = "me" }}',
    ],
)
def test_fixed_must_name_a_commit_and_an_aware_time(tmp_path: Path, value: str) -> None:
    with pytest.raises(ValueError, match=r"'fixed' must be \{ commit = "):
        ledger(tmp_path, FIXED.replace(f'{{ commit = "703452a", date = "{FIX}" }}', value))


def test_the_text_and_json_name_the_fix(tmp_path: Path) -> None:
    runs = write(tmp_path / "r.jsonl", [rec(case(80))], BEFORE)
    result = audit(ledger(tmp_path), [runs], suites=False)
    out = io.StringIO()
    _print(result, out)
    assert f"kern.toml[0] [harness defect, fixed in 703452a at {FIX}]: explains 1 records" in out.getvalue()
    entries = json.loads(json.dumps(result.to_json()))["entries"]
    assert entries[0]["harness_fix"] == {"commit": "703452a", "date": FIX} and entries[0]["explained"] == 1


def test_a_run_begun_at_the_fix_is_after_it(tmp_path: Path) -> None:
    runs = write(tmp_path / "r.jsonl", [rec(case(80))], FIX)
    assert audit(ledger(tmp_path), [runs], suites=False).unexplained_count == 1


def test_a_kernels_entry_applies_to_every_run(tmp_path: Path) -> None:
    """``before_fix`` is True for an entry that is no harness defect, whenever (or whether) its run began: a live
    classification (``explain``) finds it."""
    kernels = '[[failure]]\nreason = "d80 errors"\nstatuses = ["error"]\n[failure.when]\nhead_dim = 80\n'
    entry = ledger(tmp_path, kernels).entries[0]
    assert entry.before_fix(None) and entry.before_fix(AFTER) and entry.before_fix("")
    assert ledger(tmp_path, kernels).explain(rec(case(80))) is not None
