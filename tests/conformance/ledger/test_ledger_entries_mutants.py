"""What a ledger file's entry keeps and how each malformed key is refused (``conformance/ledger/entries.py``), written
against the mutants of ``_entry`` and ``Ledger.classify`` that outlived the suite (docs/guides/mutation-testing.md,
twelfth session): a message that names the key at fault, the values an entry keeps as given, and no case parsed for a
record no entry of its backend could match."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from conformance.cases.case import AttentionCase
from conformance.ledger import entries as entries_mod
from conformance.ledger.entries import load_ledger
from conformance.records import CheckResult, Status

GLOB = '[[failure]]\npattern = "*_win*"\nglob_reason = "ids only in this test"\nreason = "r"\n'
WHEN = '[[failure]]\nreason = "r"\n[failure.when]\nhead_dim = 80\n'


def _one(tmp_path: Path, text: str):
    (tmp_path / "kern.toml").write_text(text)
    (entry,) = load_ledger(tmp_path).entries
    return entry


@pytest.mark.parametrize(
    "text, message",
    [
        ('[[failure]]\npattern = 5\nglob_reason = "g"\nreason = "r"\n', r"'pattern'|pattern"),
        (WHEN.replace('reason = "r"\n', 'reason = "r"\npartial = ""\n'), r"'partial' must say why .*got ''"),
        (WHEN.replace('reason = "r"\n', 'reason = "r"\npartial = "   "\n'), r"'partial' must say why .*got '   '"),
        (GLOB + 'partial = "inside the glob, passes prove nothing"\n', r"'partial' needs 'when'"),
    ],
)
def test_each_malformed_key_is_refused_naming_it(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "kern.toml").write_text(text)
    with pytest.raises(ValueError, match=message):
        load_ledger(tmp_path)


def test_an_entry_that_is_not_a_table_is_refused_by_the_entry_reader_too() -> None:
    """``load_ledger`` refuses such a file first ("an array of tables"); ``_entry`` holds its own contract."""
    with pytest.raises(ValueError, match=r"^here: each \[\[failure\]\] must be a table, got 3$"):
        entries_mod._entry("kern", 3, "src", "here")


def test_a_pattern_that_is_not_strings_names_the_key(tmp_path: Path) -> None:
    (tmp_path / "kern.toml").write_text('[[failure]]\npattern = 5\nglob_reason = "g"\nreason = "r"\n')
    with pytest.raises(ValueError) as info:
        load_ledger(tmp_path)
    assert "'pattern'" in str(info.value) or " pattern " in str(info.value)
    assert "PATTERN" not in str(info.value) and "XXpatternXX" not in str(info.value)


def test_an_entry_keeps_what_the_file_says(tmp_path: Path) -> None:
    glob = _one(tmp_path, GLOB + 'evidence = ["run.jsonl", "https://example.org/1"]\nstatuses = "crash"\n')
    assert glob.glob_reason == "ids only in this test"
    assert glob.evidence == ("run.jsonl", "https://example.org/1")
    assert glob.statuses == ("crash",)  # one status may be written as a string
    when = _one(tmp_path, WHEN)
    assert when.glob_reason == "" and when.partial == "" and when.statuses == ("fail",)


def test_no_case_is_parsed_for_a_record_no_entry_of_its_backend_could_match(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``classify`` reads a record's case only when its backend has entries, and the stale scan reads a suite item
    as a case only when it is one (ids are matched by globs): a run of backends the ledger does not name parses no
    case JSON."""
    (tmp_path / "kern.toml").write_text(WHEN)
    ledger = load_ledger(tmp_path)
    parsed: list[object] = []
    real = entries_mod.case_view

    def counting(case):
        parsed.append(case)
        return real(case)

    monkeypatch.setattr(entries_mod, "case_view", counting)
    case = AttentionCase(requests=((4, 30),), num_heads=2, num_kv_heads=2, head_dim=80)
    other = CheckResult(case.id, "other", "fam", Status.FAIL, case.to_json())
    kern = CheckResult("x-000000", "kern", "fam", Status.FAIL, {})  # kern ran; its entry matched no record
    verdict = ledger.classify([other, kern], suite_case_ids=lambda: ["some_id-000000", case])
    assert [r.case_id for r in verdict.unexpected] == [case.id, "x-000000"]
    assert verdict.stale == []  # the suite's case matched the entry
    assert parsed == [{}, case]  # kern's record and the suite's case: neither the other backend's record nor the id


@pytest.mark.parametrize(
    ("error", "reason"),
    [(OSError(errno.ENAMETOOLONG, "File name too long"), "File name too long"), (OSError("quota"), "quota")],
    ids=["strerror", "message-only"],
)
def test_a_ledger_folder_the_file_system_refuses_is_named_with_its_flag_and_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: OSError, reason: str
) -> None:
    """Python < 3.12's ``Path.exists()`` raises for a name longer than the file system allows; Python 3.12 returns
    False, so the branch is emulated: one line with the flag the user gave, the folder and the system's reason."""
    # kills x_load_ledger_dir__mutmut_9..15 (that refusal's folder, reason, flag; `and` for `or`), which survive on
    # Python 3.12, where test_long_names.py's real long name no longer reaches the branch

    def refuse(self: Path) -> bool:
        raise error

    monkeypatch.setattr(Path, "exists", refuse)
    folder = tmp_path / "ledgers"
    with pytest.raises(entries_mod.LedgerDirError) as info:
        entries_mod.load_ledger_dir(folder, "--ledgers")
    assert str(info.value) == f"--ledgers {folder}: cannot be read: {reason}"
    assert info.value.path == str(folder) and info.value.reason == f"cannot be read: {reason}"
