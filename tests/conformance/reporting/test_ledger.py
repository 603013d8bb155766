"""Known-failure ledgers: matching, unexpected passes, stale entries, malformed files."""

from __future__ import annotations

import fnmatch
from pathlib import Path

import pytest

from conformance.reporting.ledger import DEFAULT_DIR, load_ledger
from conformance.records import CheckResult, Status


def result(case_id: str, backend: str, status: str) -> CheckResult:
    return CheckResult(case_id=case_id, backend=backend, family="fam", status=Status(status), case={})


LEDGER = """
# a header comment, as every ledger file starts
[[failure]]
pattern = "*_win*"
reason = "window off by one"
evidence = "https://example.org/issue/1"

[[failure]]
pattern = "*_sink-*"
reason = "sinks crash the kernel"
evidence = ["run.jsonl", "https://example.org/issue/2"]
statuses = ["crash", "error"]

[[failure]]
pattern = "*_alibi-*"
reason = "fixed upstream long ago"
"""


@pytest.fixture
def ledger_dir(tmp_path: Path) -> Path:
    (tmp_path / "kern.toml").write_text(LEDGER)
    (tmp_path / "other.toml").write_text(
        '[[failure]]\npattern = "*"\nreason = "everything, for a backend that did not run"\n'
    )
    return tmp_path


def test_entries_are_read_per_backend(ledger_dir: Path) -> None:
    ledger = load_ledger(ledger_dir)
    kern = ledger.for_backend("kern")
    assert [e.pattern for e in kern] == ["*_win*", "*_sink-*", "*_alibi-*"]
    assert kern[0].statuses == ("fail",) and kern[0].evidence == ("https://example.org/issue/1",)
    assert kern[1].statuses == ("crash", "error") and len(kern[1].evidence) == 2
    assert kern[0].source.endswith("kern.toml[0]")


def test_classify(ledger_dir: Path) -> None:
    ledger = load_ledger(ledger_dir)
    results = [
        result("a_win8-0-1", "kern", "fail"),  # known
        result("b_win8-0-2", "kern", "crash"),  # matches, but the entry expects fail: unexpected
        result("c_sink-3", "kern", "crash"),  # known (statuses list crash)
        result("d_sink-4", "kern", "pass"),  # unexpected pass
        result("e_plain-5", "kern", "fail"),  # no entry: unexpected
        result("f_win8-0-6", "elsewhere", "fail"),  # another backend's failure: the kern ledger does not apply
        result("g_win8-0-7", "kern", "unsupported"),  # neither a problem nor a pass
    ]
    verdict = ledger.classify(results)
    assert [(r.case_id, e.pattern) for r, e in verdict.known] == [
        ("a_win8-0-1", "*_win*"),
        ("c_sink-3", "*_sink-*"),
    ]
    assert [r.case_id for r in verdict.unexpected] == ["b_win8-0-2", "e_plain-5", "f_win8-0-6"]
    assert [(r.case_id, e.pattern) for r, e in verdict.unexpected_passes] == [("d_sink-4", "*_sink-*")]
    # *_alibi-* matched nothing of "kern", which ran; "other" did not run, so its entry is not stale.
    assert [(e.backend, e.pattern) for e in verdict.stale] == [("kern", "*_alibi-*")]
    assert ledger.explain(results[0]).reason == "window off by one"
    assert ledger.explain(results[1]) is None and ledger.explain(results[3]) is None


@pytest.mark.parametrize(
    "text, message",
    [
        ('[[failure]]\nreason = "no pattern"\n', "pattern"),
        ('[[failure]]\npattern = "*"\nreason = "x"\nstatuses = ["pass"]\n', "statuses"),
        ('[[failure]]\npattern = "*"\nreason = "x"\nwhy = "typo"\n', "unknown keys"),
        ('[known]\npattern = "*"\n', "top-level"),
        ("[[failure]\npattern = ", "bad.toml"),
        ('[[failure]]\npattern = []\nreason = "r"\n', "a list of them"),
        ('[[failure]]\npattern = ["*_a-*", ""]\nreason = "r"\n', "a list of them"),
    ],
)
def test_malformed_ledgers_name_the_file(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "bad.toml").write_text(text)
    with pytest.raises(ValueError, match=message):
        load_ledger(tmp_path)


def test_an_entry_may_list_several_globs(tmp_path: Path) -> None:
    (tmp_path / "kern.toml").write_text(
        '[[failure]]\npattern = ["*_d80_*_pfvar_ps*", "*_d96_*_dec_ps*"]\nreason = "paged loader"\n'
    )
    (entry,) = load_ledger(tmp_path).entries
    assert entry.patterns == ("*_d80_*_pfvar_ps*", "*_d96_*_dec_ps*") and " | " in entry.pattern
    verdict = load_ledger(tmp_path).classify(
        [
            result("x_d80_bf16_pfvar_ps16nhd-1", "kern", "fail"),
            result("x_d96_bf16_dec_ps1nhd-2", "kern", "fail"),
            result("x_d96_bf16_pf1_ps1nhd-3", "kern", "pass"),  # neither glob: not an unexpected pass
            result("x_d96_bf16_pf1_ps1nhd-4", "kern", "fail"),  # neither glob: unexpected
        ]
    )
    assert len(verdict.known) == 2 and not verdict.unexpected_passes
    assert [r.case_id for r in verdict.unexpected] == ["x_d96_bf16_pf1_ps1nhd-4"]


def test_a_flaky_entry_makes_no_unexpected_pass(tmp_path: Path) -> None:
    (tmp_path / "kern.toml").write_text(
        '[[failure]]\npattern = "*_pg_*"\nreason = "intermittent"\nflaky = true\nstatuses = ["fail", "error"]\n'
        '[[failure]]\npattern = "*_win_*"\nreason = "steady"\n'
    )
    verdict = load_ledger(tmp_path).classify(
        [
            result("a_pg_1", "kern", "pass"),  # flaky: its pass says nothing
            result("a_pg_2", "kern", "error"),
            result("a_win_3", "kern", "pass"),  # steady: the bug may be fixed
        ]
    )
    assert [r.case_id for r, _ in verdict.known] == ["a_pg_2"]
    assert [(r.case_id, e.reason) for r, e in verdict.unexpected_passes] == [("a_win_3", "steady")]
    (tmp_path / "kern.toml").write_text('[[failure]]\npattern = "*"\nreason = "r"\nflaky = "yes"\n')
    with pytest.raises(ValueError, match="'flaky' must be true or false"):
        load_ledger(tmp_path)


def test_shipped_ledgers_parse_and_missing_dir_is_empty(tmp_path: Path) -> None:
    assert {p.stem for p in DEFAULT_DIR.glob("*.toml")} >= {"sdpa-cpu", "flex-cpu", "fa2", "fa4"}
    load_ledger()  # every shipped file is valid
    assert load_ledger(tmp_path / "absent").entries == []


def test_entries_for_cases_the_run_did_not_include_are_not_stale(ledger_dir: Path) -> None:
    """An entry for cases of another suite is not exercised, not stale; one naming no case at all is."""
    ledger = load_ledger(ledger_dir)
    results = [result("a_win8-0-1", "kern", "fail"), result("c_sink-3", "kern", "crash")]
    verdict = ledger.classify(results, suite_case_ids=lambda: ["x_alibi-9", "y_plain-1"])
    assert verdict.stale == []
    verdict = ledger.classify(results, suite_case_ids=lambda: ["y_plain-1"])
    assert [e.pattern for e in verdict.stale] == ["*_alibi-*"]


def test_committed_ledger_patterns_name_cases_of_the_builtin_suites() -> None:
    """Every committed ledger entry names at least one case the suites can generate."""
    from conformance.cases.suites import all_case_ids

    ids = all_case_ids()
    for entry in load_ledger().entries:
        for glob in entry.patterns:  # each glob of a list names a case too
            assert any(fnmatch.fnmatchcase(c, glob) for c in ids), (entry.source, glob)
