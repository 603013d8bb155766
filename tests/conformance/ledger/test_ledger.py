"""Known-failure ledgers: matching, unexpected passes, fixed defects, stale entries, malformed files."""

from __future__ import annotations

import fnmatch
from pathlib import Path

import pytest

from conformance.ledger.entries import DEFAULT_DIR, builtin_suite_cases, load_ledger
from conformance.ledger.fields import case_view
from conformance.cases.case import AttentionCase
from conformance.records import CheckResult, Status
from conformance.results_file import read_records


def result(case_id: str, backend: str, status: str) -> CheckResult:
    return CheckResult(case_id=case_id, backend=backend, family="fam", status=Status(status), case={})


LEDGER = """
# a header comment, as every ledger file starts
[[failure]]
pattern = "*_win*"
glob_reason = "a test ledger of ids"
reason = "window off by one"
evidence = "https://example.org/issue/1"

[[failure]]
pattern = "*_sink-*"
glob_reason = "a test ledger of ids"
reason = "sinks crash the kernel"
evidence = ["run.jsonl", "https://example.org/issue/2"]
statuses = ["crash", "error"]

[[failure]]
pattern = "*_alibi-*"
glob_reason = "a test ledger of ids"
reason = "fixed upstream long ago"
"""


@pytest.fixture
def ledger_dir(tmp_path: Path) -> Path:
    (tmp_path / "kern.toml").write_text(LEDGER)
    (tmp_path / "other.toml").write_text(
        '[[failure]]\npattern = "*"\nglob_reason = "g"\nreason = "everything, for a backend that did not run"\n'
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
        ('[[failure]]\npattern = "*"\nglob_reason = "g"\nreason = "x"\nstatuses = ["pass"]\n', "statuses"),
        ('[[failure]]\npattern = "*"\nglob_reason = "g"\nreason = "x"\nwhy = "typo"\n', "unknown keys"),
        ('[known]\npattern = "*"\n', "top-level"),
        ("[[failure]\npattern = ", "bad.toml"),
        ('[[failure]]\npattern = []\nglob_reason = "g"\nreason = "r"\n', "a list of them"),
        ('[[failure]]\npattern = ["*_a-*", ""]\nglob_reason = "g"\nreason = "r"\n', "a list of them"),
        ('[[failure]]\npattern = "*"\nreason = "r"\n', "needs glob_reason"),
        ("failure = 3\n", "array of tables"),
    ],
)
def test_malformed_ledgers_name_the_file(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "bad.toml").write_text(text)
    with pytest.raises(ValueError, match=message):
        load_ledger(tmp_path)


def test_an_entry_may_list_several_globs(tmp_path: Path) -> None:
    (tmp_path / "kern.toml").write_text(
        '[[failure]]\npattern = ["*_d80_*_pfvar_ps*", "*_d96_*_dec_ps*"]\nglob_reason = "g"\nreason = "paged loader"\n'
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
        '[[failure]]\npattern = "*_pg_*"\nglob_reason = "g"\nreason = "intermittent"\nflaky = true\n'
        'statuses = ["fail", "error"]\n[[failure]]\npattern = "*_win_*"\nglob_reason = "g"\nreason = "steady"\n'
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
    (tmp_path / "kern.toml").write_text('[[failure]]\npattern = "*"\nglob_reason = "g"\nreason = "r"\nflaky = "yes"\n')
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


def test_the_suites_are_read_only_until_every_unused_entry_matched(ledger_dir: Path) -> None:
    """The suites' cases are streamed: once each entry without a result has matched a case, no further case is
    built."""

    def suites():
        yield "y_plain-1"
        yield "x_alibi-9"
        raise AssertionError("read past the case that matched the last unused entry")

    results = [result("a_win8-0-1", "kern", "fail"), result("c_sink-3", "kern", "crash")]
    assert load_ledger(ledger_dir).classify(results, suite_case_ids=suites).stale == []


def test_the_stale_scan_reads_the_harnesss_own_suites_not_the_peer_grids(monkeypatch) -> None:
    """builtin_suite_cases never builds a peer-* suite (215,000 cases: a report with a stale entry would take
    minutes), and reads every other suite."""
    import conformance.suites.registry as suites

    own = AttentionCase(((1, 4),), num_heads=2, num_kv_heads=2, head_dim=8)

    def peer():
        raise AssertionError("a peer suite was built for the stale scan")

    monkeypatch.setattr(suites, "SUITES", {"smoke": lambda: [own], "peer-fa3": peer, "peer-sgl": peer})
    assert [c.id for c in builtin_suite_cases()] == [own.id]


def test_committed_ledger_entries_match_cases_of_the_builtin_suites() -> None:
    """Every committed entry matches a case the suites can generate, so no shipped entry is stale in a report of
    the suites; each OR'd table of a predicate matches one too, and each glob names a suite case or a case of the
    backend's committed fuzz campaigns (a typo in a glob cannot hide)."""
    reports = Path(__file__).resolve().parents[3] / "reports"
    entries = load_ledger().entries
    todo: dict[tuple[int, str, object], str] = {}  # (entry, what must match, which) -> what the failure says
    for k, entry in enumerate(entries):
        todo[(k, "entry", None)] = entry.source
        for i, when in enumerate(entry.predicate.whens if entry.predicate is not None else ()):
            todo[(k, "when", i)] = f"{entry.source} when {i}: {when.text()}"
        fuzzed = (
            {r.case_id for p in reports.glob(f"fuzz-*/**/fuzz-{entry.backend}.jsonl.gz") for r in read_records(p)[1]}
            if entry.patterns
            else set()
        )
        for glob in entry.patterns:
            if not any(fnmatch.fnmatchcase(c, glob) for c in fuzzed):
                todo[(k, "glob", glob)] = f"{entry.source} glob {glob}"
    for case in builtin_suite_cases():  # streamed: the suites are built only until every item has matched
        if not todo:
            break
        view = case_view(case)
        for key in list(todo):
            k, what, which = key
            entry = entries[k]
            if (
                (what == "entry" and entry.matches_view(view, case.id))
                or (what == "when" and entry.predicate.whens[which].holds(view))
                or (what == "glob" and fnmatch.fnmatchcase(case.id, which))
            ):
                del todo[key]
    assert not todo, list(todo.values())


# ---------------------------------------------------------------------------------- predicates and versions
PRED = """
[[failure]]
reason = "loader bug, d80 paged without a mask"
versions = ">=4.0.0b36,<4.1"
[failure.when]
head_dim = 80
paged = true
no_features = ["causal", "window"]

[[failure]]
reason = "never seen: d4096"
[failure.when]
head_dim = 4096
"""


def pcase(**kw) -> AttentionCase:
    base = dict(requests=((4, 300),), num_heads=2, num_kv_heads=2, head_dim=80, kv_layout="NHD", block_size=16)
    return AttentionCase(**{**base, **kw})


def precord(c: AttentionCase, status: str, version: str = "4.0.0b36") -> CheckResult:
    return CheckResult(c.id, "kern", "fam", Status(status), c.to_json(), version=version)


def test_classify_by_predicate_known_unexpected_may_be_fixed_and_fixed(tmp_path: Path) -> None:
    (tmp_path / "kern.toml").write_text(PRED)
    ledger = load_ledger(tmp_path)
    a, causal, other = pcase(), pcase(causal=True), pcase(head_dim=64)
    results = [
        precord(a, "fail"),  # known: a case outside any suite, described by its cause
        precord(causal, "fail"),  # the neighbour (causal): not this cause, unexpected
        precord(other, "pass"),  # nothing claims it
        precord(a.replace(requests=((9, 200),)), "pass"),  # in range: may be fixed (unexpected pass)
        precord(a.replace(requests=((7, 200),)), "pass", version="4.1.0"),  # past the range: fixed in 4.1.0
        precord(a.replace(requests=((5, 200),)), "fail", version="4.1.0"),  # past the range: not explained
        precord(a.replace(requests=((6, 200),)), "pass", version="4.0.0b30"),  # before the range: nothing
        precord(a.replace(requests=((8, 200),)), "fail", version="not installed"),  # unknown version: by its case
    ]
    verdict = ledger.classify(results, suite_case_ids=lambda: [pcase(head_dim=64)])
    assert [r.case_id for r, _ in verdict.known] == [results[0].case_id, results[7].case_id]
    assert [r.case_id for r in verdict.unexpected] == [results[1].case_id, results[5].case_id]
    assert [(r.case_id, e.reason) for r, e in verdict.unexpected_passes] == [
        (results[3].case_id, "loader bug, d80 paged without a mask")
    ]
    assert [(r.case_id, r.version) for r, _ in verdict.fixed] == [(results[4].case_id, "4.1.0")]
    # the d4096 entry matches no result and no suite case: stale; given a suite case it matches, it is not
    assert [e.reason for e in verdict.stale] == ["never seen: d4096"]
    assert ledger.classify(results, suite_case_ids=lambda: [pcase(head_dim=4096)]).stale == []
    assert ledger.explain(results[0]).reason.startswith("loader bug") and ledger.explain(results[1]) is None


def test_a_predicate_matches_a_record_without_a_suite_batch_name(tmp_path: Path) -> None:
    """A random case (no batch name, any shape) is recognised by its cause, which globs on today's batch names
    could not do; a record without a case (or with one this version cannot read) matches globs only."""
    (tmp_path / "kern.toml").write_text(PRED)
    ledger = load_ledger(tmp_path)
    drawn = pcase(requests=((1, 289), (97, 257), (64, 64)), num_heads=6, num_kv_heads=2, block_size=148)
    assert ledger.explain(precord(drawn, "fail")) is not None
    bare = CheckResult(drawn.id, "kern", "fam", Status.FAIL, {}, version="4.0.0b36")
    assert ledger.explain(bare) is None


def test_a_ledger_directory_that_cannot_be_used_is_refused_in_one_line_naming_the_option(tmp_path: Path) -> None:
    from conformance.exits import Exit
    from conformance.ledger.entries import LedgerDirError, load_ledger_dir

    missing, afile, bad = tmp_path / "none", tmp_path / "f.toml", tmp_path / "bad"
    afile.write_text("")
    bad.mkdir()
    (bad / "kern.toml").write_text("[[failure]]\n")
    for directory, flag, reason in (
        (missing, None, "no such directory"),
        (missing, "--ledgers", "no such directory"),  # the flag given is named: a mutmut survivor
        (afile, "--ledgers", "not a directory"),
        (afile, None, "not a directory"),
    ):
        with pytest.raises(LedgerDirError) as err:
            load_ledger_dir(directory) if flag is None else load_ledger_dir(directory, flag)
        assert str(err.value) == f"{flag or '--ledger-dir'} {directory}: {reason}"
        assert (err.value.path, err.value.reason, err.value.exit_code) == (str(directory), reason, Exit.USAGE)
    with pytest.raises(LedgerDirError, match=rf"^--ledger-dir {bad}: .*kern\.toml") as err:
        load_ledger_dir(bad)
    assert err.value.path == str(bad) and "kern.toml" in err.value.reason
    with pytest.raises(LedgerDirError, match=rf"^--ledgers {bad}: .*kern\.toml"):
        load_ledger_dir(bad, "--ledgers")  # the flag given is named: a mutmut survivor
    assert str(LedgerDirError("d", "why")) == "--ledger-dir d: why"


# ------------------------------------------------------------------ statuses and messages (issue 31)
def test_a_problem_of_an_entrys_case_in_a_status_it_does_not_list_names_the_entry(tmp_path: Path) -> None:
    """Not explained (unexpected), and ``unlisted`` names the entry; a harness error is neither the entry's nor
    unlisted: the inputs or the reference failed, not the kernel."""
    import dataclasses

    (tmp_path / "kern.toml").write_text('[[failure]]\npattern = "*_pg_*"\nglob_reason = "g"\nreason = "loader"\n')
    ledger = load_ledger(tmp_path)
    harness = "harness error (inputs or reference), not the kernel: AcceleratorError: illegal instruction"
    results = [
        result("a_pg_1", "kern", "fail"),
        dataclasses.replace(result("a_pg_2", "kern", "error"), reason="CUDA error: an illegal memory access"),
        result("b_win_3", "kern", "error"),  # no entry's case
        dataclasses.replace(result("a_pg_4", "kern", "fail"), reason=harness),  # no harness error is the kernel's
        result("a_pg_5", "kern", "timeout"),
    ]
    verdict = ledger.classify(results)
    assert [r.case_id for r, _ in verdict.known] == ["a_pg_1"]
    assert [r.case_id for r in verdict.unexpected] == ["a_pg_2", "b_win_3", "a_pg_4", "a_pg_5"]
    assert [(r.case_id, e.reason) for r, e in verdict.unlisted] == [("a_pg_2", "loader"), ("a_pg_5", "loader")]
    assert ledger.explain(results[0]) is not None and ledger.explain(results[3]) is None


@pytest.mark.parametrize(
    "messages, error",
    [
        ('"illegal memory access"', "must be a table of status = message"),
        ("{}", "must be a table of status = message"),
        ('{ crash = "SIGSEGV" }', "messages for ['crash'], a status the entry does not list"),
        ("{ error = [] }", "messages.error"),
        ('{ error = [""] }', "messages.error"),
        ("{ error = 3 }", "messages.error"),
    ],
)
def test_malformed_messages_name_the_file_entry_and_key(tmp_path: Path, messages: str, error: str) -> None:
    (tmp_path / "kern.toml").write_text(
        f'[[failure]]\npattern = "*"\nglob_reason = "g"\nreason = "r"\nstatuses = ["fail", "error"]\n'
        f"messages = {messages}\n"
    )
    with pytest.raises(ValueError, match="kern.toml failure\\[0\\]") as info:
        load_ledger(tmp_path)
    assert error in str(info.value)


def test_messages_are_read_per_status(tmp_path: Path) -> None:
    (tmp_path / "kern.toml").write_text(
        '[[failure]]\npattern = "*"\nglob_reason = "g"\nreason = "r"\nstatuses = ["fail", "error"]\n'
        'messages = { error = ["illegal memory access", "misaligned address"] }\n'
    )
    (entry,) = load_ledger(tmp_path).entries
    assert entry.messages == (("error", ("illegal memory access", "misaligned address")),)


def test_a_record_without_a_reason_carries_no_message(tmp_path: Path) -> None:
    """``lists`` reads a missing reason (an old record's ``null``) as no text: an entry that asks for a message does
    not list it, whatever the message (a mutmut survivor read it as a placeholder text)."""
    import dataclasses

    from conformance.cases.case import AttentionCase
    from conformance.records import CheckResult, Status

    (tmp_path / "kern.toml").write_text(
        '[[failure]]\npattern = "*"\nglob_reason = "g"\nreason = "r"\nstatuses = ["error"]\n'
        'messages = { error = "X" }\n'
    )
    (entry,) = load_ledger(tmp_path).entries
    c = AttentionCase(requests=((3, 3),), num_heads=2, num_kv_heads=1, head_dim=16)
    r = CheckResult(c.id, "kern", "fam", Status.ERROR, c.to_json(), reason="X marks it")
    assert entry.lists(r)
    assert not entry.lists(dataclasses.replace(r, reason=None))
    assert not entry.lists(dataclasses.replace(r, reason=""))
