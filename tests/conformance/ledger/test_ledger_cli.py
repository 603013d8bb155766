"""``attnconf ledger audit``: per entry explained / claimed passes / problems of its cases in a status or with a
message it does not list (unlisted), unexplained problems grouped by signature, and its exit codes (0; 1 when an
entry claims a pass or, with --strict, a problem is unexplained; 2 for a malformed ledger or a missing, empty or
garbled results file); ``attnconf ledger fields``."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from conformance.cases.case import AttentionCase
from conformance.cli import main
from conformance.records import CheckResult, Header, Status
from conformance.results_writer import append_record

LEDGER = """
[[failure]]
reason = "d80 paged loader"
versions = ">=1.0"
[failure.when]
head_dim = 80
paged = true

[[failure]]
reason = "sometimes"
flaky = true
[failure.when]
head_dim = 96
"""


def case(**kw) -> AttentionCase:
    base = dict(requests=((2, 40),), num_heads=2, num_kv_heads=2, head_dim=80, kv_layout="NHD", block_size=16)
    return AttentionCase(**{**base, **kw})


def write(path: Path, records: list[tuple[AttentionCase, str, str]]) -> Path:
    append_record(path, Header(suite="fuzz", backends={"kern": {"version": "1.0"}}, env={}))
    for c, status, version in records:
        append_record(
            path,
            CheckResult(c.id, "kern", "fam", Status(status), c.to_json(), version=version, reason="max_error: too far"),
        )
    return path


@pytest.fixture
def ledger_dir(tmp_path: Path) -> Path:
    d = tmp_path / "ledgers"
    d.mkdir()
    (d / "kern.toml").write_text(LEDGER)
    return d


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["ledger", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_audit_counts_explained_unexplained_and_groups_them(tmp_path: Path, ledger_dir: Path, capsys) -> None:
    runs = write(
        tmp_path / "a.jsonl",
        [
            (case(), "fail", "1.0"),
            (case(requests=((3, 50),)), "fail", "1.2"),  # another shape, same cause: explained
            (case(head_dim=96), "pass", "1.0"),  # flaky entry: its pass proves nothing
            (case(head_dim=64), "fail", "1.0"),  # unexplained
            (case(head_dim=64, requests=((5, 9),)), "fail", "1.0"),  # same signature: one group
            (case(head_dim=64, causal=True), "fail", "1.0"),  # another group
        ],
    )
    code, out, err = run(capsys, "audit", str(runs), "--ledger-dir", str(ledger_dir), "--no-suites")
    assert code == 0, err
    assert "6 records: 5 problems, 2 explained, 3 unexplained; passes claimed by non-flaky entries: 0" in out
    assert "kern.toml[0]: explains 2 records (2 cases), claims 0 passes" in out
    assert "kern.toml[1] [flaky]: explains 0 records (0 cases), claims 0 passes, flaky or partial passes 1" in out
    assert "2 records,   2 cases | fail | paged NHD | plain | max_error: too far" in out
    assert "1 records,   1 cases | fail | paged NHD | causal | max_error: too far" in out
    code, out, _ = run(capsys, "audit", str(runs), "--ledger-dir", str(ledger_dir), "--no-suites", "--json")
    data = json.loads(out)
    assert code == 0 and (data["problems"], data["explained"], data["unexplained"]) == (5, 2, 3)
    assert [g["records"] for g in data["unexplained_groups"]] == [2, 1]
    code, _, _ = run(capsys, "audit", str(runs), "--ledger-dir", str(ledger_dir), "--no-suites", "--strict")
    assert code == 1  # --strict: an unexplained problem fails the audit


def test_an_entry_claiming_a_pass_fails_the_audit_and_an_upgrade_shows_fixed(
    tmp_path: Path, ledger_dir: Path, capsys
) -> None:
    (ledger_dir / "kern.toml").write_text(LEDGER.replace('versions = ">=1.0"', 'versions = ">=1.0,<2.0"'))
    runs = write(tmp_path / "b.jsonl", [(case(), "fail", "1.0"), (case(requests=((4, 44),)), "pass", "1.5")])
    code, out, _ = run(capsys, "audit", str(runs), "--ledger-dir", str(ledger_dir), "--no-suites")
    assert code == 1 and "claims 1 passes" in out and "CLAIMS PASS" in out
    fixed = write(tmp_path / "c.jsonl", [(case(), "fail", "1.0"), (case(requests=((4, 44),)), "pass", "2.0")])
    code, out, _ = run(capsys, "audit", str(fixed), "--ledger-dir", str(ledger_dir), "--no-suites")
    assert code == 0 and "fixed in 2.0: " in out and "fixed 1" in out


def test_stale_entries_are_listed(tmp_path: Path, ledger_dir: Path, capsys) -> None:
    runs = write(tmp_path / "d.jsonl", [(case(), "fail", "1.0")])
    code, out, _ = run(capsys, "audit", str(runs), "--ledger-dir", str(ledger_dir), "--no-suites")
    assert code == 0 and "STALE ledgers/kern.toml[1]" in out


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "no such file"),
        (b"", "empty file"),
        (b"not json at all\n", "holds no records"),
    ],
)
def test_unusable_results_files_exit_2(tmp_path: Path, ledger_dir: Path, capsys, content, message) -> None:
    path = tmp_path / "r.jsonl"
    if content is not None:
        path.write_bytes(content)
    code, out, err = run(capsys, "audit", str(path), "--ledger-dir", str(ledger_dir), "--no-suites")
    assert code == 2 and "r.jsonl" in err and message in err and out == ""
    assert len(err.strip().splitlines()) == 1


def test_skipped_lines_are_refused_unless_allowed(tmp_path: Path, ledger_dir: Path, capsys) -> None:
    runs = write(tmp_path / "e.jsonl", [(case(), "fail", "1.0")])
    with open(runs, "a") as fh:
        fh.write('{"type": "result", "cut sh')
    code, _, err = run(capsys, "audit", str(runs), "--ledger-dir", str(ledger_dir), "--no-suites")
    assert code == 2 and "e.jsonl" in err
    code, out, _ = run(capsys, "audit", str(runs), "--ledger-dir", str(ledger_dir), "--no-suites", "--allow-skipped")
    assert code == 0 and "1 lines that are not records skipped" in out


def test_gzipped_results_are_read(tmp_path: Path, ledger_dir: Path, capsys) -> None:
    plain = write(tmp_path / "f.jsonl", [(case(), "fail", "1.0")])
    gz = tmp_path / "f.jsonl.gz"
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    code, out, _ = run(capsys, "audit", str(gz), "--ledger-dir", str(ledger_dir), "--no-suites")
    assert code == 0 and "1 explained" in out


def test_a_malformed_ledger_exits_2_naming_the_file_entry_and_field(tmp_path: Path, ledger_dir: Path, capsys) -> None:
    (ledger_dir / "kern.toml").write_text('[[failure]]\nreason = "r"\n[failure.when]\nhead_dimm = 80\n')
    runs = write(tmp_path / "g.jsonl", [(case(), "fail", "1.0")])
    code, out, err = run(capsys, "audit", str(runs), "--ledger-dir", str(ledger_dir), "--no-suites")
    assert code == 2 and out == ""
    assert "kern.toml failure[0].when: unknown field 'head_dimm'" in err
    code, _, err = run(capsys, "audit", str(runs), "--ledger-dir", str(tmp_path / "absent"), "--no-suites")
    assert code == 2 and "no such directory" in err


def test_fields_lists_the_predicate_names(capsys) -> None:
    code, out, _ = run(capsys, "fields")
    assert code == 0
    names = {line.split()[0] for line in out.splitlines()}
    assert {"head_dim", "paged", "fa4_sm90_paged_loader", "fa2_window_misread", "rows_without_keys"} <= names


def test_audit_json_states_each_entry_in_full(tmp_path: Path, ledger_dir: Path, capsys) -> None:
    """``--json``: each entry's source, backend, reason, what it matches, its flags, what it explains (per file),
    the passes it claims and those past its range (file, case, version): the keys a CI job reads."""
    (ledger_dir / "kern.toml").write_text(LEDGER.replace('versions = ">=1.0"', 'versions = ">=1.0,<2.0"'))
    claimed, fixed = case(requests=((4, 44),)), case(requests=((5, 55),))
    runs = write(
        tmp_path / "a.jsonl",
        [(case(), "fail", "1.0"), (claimed, "pass", "1.5"), (fixed, "pass", "2.0"), (case(head_dim=96), "pass", "1.0")],
    )
    code, out, _ = run(capsys, "audit", str(runs), "--ledger-dir", str(ledger_dir), "--no-suites", "--json")
    assert code == 1
    loader, flaky = json.loads(out)["entries"]
    assert loader == {
        "source": loader["source"],
        "backend": "kern",
        "reason": "d80 paged loader",
        "matches": "head_dim = 80 and paged = true [versions <2.0,>=1.0]",
        "flaky": False,
        "partial": "",
        "explained": 1,
        "explained_cases": 1,
        "files": {str(runs): 1},
        "passes_claimed": [{"file": str(runs), "case_id": claimed.id, "version": "1.5"}],
        "flaky_passes": 0,
        "fixed": [{"file": str(runs), "case_id": fixed.id, "version": "2.0"}],
        "statuses": ["fail"],
        "messages": {},
        "unlisted": [],
        "collateral": [],
        "harness_fix": None,
    }
    assert loader["source"].endswith("kern.toml[0]") and flaky["source"].endswith("kern.toml[1]")
    assert (flaky["flaky"], flaky["flaky_passes"], flaky["explained"], flaky["files"]) == (True, 1, 0, {})


# ------------------------------------------------------------------ a known cause in a status its entry does not list
def write_reasons(path: Path, records: list[tuple[AttentionCase, str, str]]) -> Path:
    """Like :func:`write`, with each record's reason given: (case, status, reason), version 1.0."""
    append_record(path, Header(suite="fuzz", backends={"kern": {"version": "1.0"}}, env={}))
    for c, status, reason in records:
        append_record(path, CheckResult(c.id, "kern", "fam", Status(status), c.to_json(), version="1.0", reason=reason))
    return path


IMA = "AcceleratorError: CUDA error: an illegal memory access was encountered"


def test_a_cause_in_a_status_its_entry_does_not_list_is_unlisted_and_fails_strict(
    tmp_path: Path, ledger_dir: Path, capsys
) -> None:
    """Issue 31: the d80 entry lists fail only; an error of its case is not explained, is named under the entry with
    its status and message (not as a new problem of no entry), and fails --strict."""
    runs = write_reasons(
        tmp_path / "u.jsonl",
        [
            (case(), "fail", "max_error: too far"),
            (case(requests=((3, 50),)), "error", IMA),  # the entry's case, a status it does not list
            (case(requests=((4, 60),)), "crash", "worker killed by SIGSEGV"),  # and another
            (case(head_dim=64), "error", IMA),  # no entry's case: a plain unexplained problem
        ],
    )
    argv = ("audit", str(runs), "--ledger-dir", str(ledger_dir), "--no-suites")
    code, out, _ = run(capsys, *argv)
    assert code == 0  # an unexplained problem fails only --strict
    assert "4 records: 4 problems, 1 explained, 3 unexplained" in out
    assert "2 of the unexplained are an entry's cases in a status or with a message the entry does not list" in out
    assert "kern.toml[0]: explains 1 records (1 cases), claims 0 passes" in out and "unlisted 2" in out
    assert "UNLISTED error (1 records, 1 cases; the entry lists fail): AcceleratorError: CUDA error: an illegal" in out
    assert "UNLISTED crash (1 records, 1 cases; the entry lists fail): worker killed by SIGSEGV" in out
    groups = out.split("unexplained problems, by backend and signature:")[1]
    assert "1 records,   1 cases | error | paged NHD | plain | AcceleratorError" in groups
    assert groups.count(" records, ") == 1 and "_d64_" in groups  # the unlisted ones are not listed twice
    code, out, _ = run(capsys, *argv, "--json")
    data = json.loads(out)
    assert (data["unexplained"], data["unlisted"], data["explained"]) == (3, 2, 1)
    (first, _) = data["entries"]
    assert [(u["status"], u["reason"][:16]) for u in first["unlisted"]] == [
        ("error", "AcceleratorError"),
        ("crash", "worker killed by"),
    ]
    assert [g["records"] for g in data["unexplained_groups"]] == [1]
    code, _, _ = run(capsys, *argv, "--strict")
    assert code == 1


def test_an_entry_explains_an_error_only_with_its_message(tmp_path: Path, ledger_dir: Path, capsys) -> None:
    """messages = { error = ... }: the kernel's message explains an error of the entry's case; another message (an
    adapter's shape error, say) is unlisted; a harness error (inputs or reference) is never the kernel's."""
    (ledger_dir / "kern.toml").write_text(
        LEDGER.replace(
            'versions = ">=1.0"',
            'versions = ">=1.0"\nstatuses = ["fail", "error"]\n'
            'messages = { error = ["illegal memory access", "misaligned address"] }',
        )  # fmt: skip
    )
    runs = write_reasons(
        tmp_path / "m.jsonl",
        [
            (case(), "error", IMA),
            (case(requests=((3, 50),)), "error", "AcceleratorError: CUDA error: misaligned address"),
            (case(requests=((4, 60),)), "error", "RuntimeError: shape '[1, 3, 1, 16]' is invalid"),
            (case(requests=((5, 70),)), "error", "harness error (inputs or reference), not the kernel: " + IMA),
            (case(requests=((6, 80),)), "fail", "max_error: too far"),  # no message for fail: any reason
        ],
    )
    code, out, _ = run(capsys, "audit", str(runs), "--ledger-dir", str(ledger_dir), "--no-suites", "--json")
    data = json.loads(out)
    assert (data["problems"], data["explained"], data["unexplained"], data["unlisted"]) == (5, 3, 2, 1)
    (first, _) = data["entries"]
    assert first["messages"] == {"error": ["illegal memory access", "misaligned address"]}
    assert [u["reason"][:12] for u in first["unlisted"]] == ["RuntimeError"]
    (group,) = data["unexplained_groups"]  # the harness error: a problem of no entry, in a group of its own
    assert "harness error" in group["signature"]
    code, out, _ = run(capsys, "audit", str(runs), "--ledger-dir", str(ledger_dir), "--no-suites")
    assert "the entry lists fail, error 'illegal memory access' 'misaligned address'" in out


def test_audit_json_states_the_run_and_each_unexplained_group_in_full(tmp_path: Path, ledger_dir: Path, capsys) -> None:
    """``--json``'s top level and its unexplained groups, key by key (mutmut survivors of ``Audit.to_json`` and
    ``Group.to_json``): what a CI job reads to tell a clean audit from one with new problems."""
    reason = "max_error: |out-ref| 0.7 at (token 1, head 1, dim 0)"
    a, b = case(head_dim=112, requests=((3, 30),)), case(head_dim=128, requests=((3, 30),))
    runs = write_reasons(
        tmp_path / "a.jsonl",
        [
            (case(), "fail", "max_error: too far"),
            (a, "fail", reason),
            (b, "fail", reason),
            (case(head_dim=64), "pass", ""),
        ],
    )
    code, out, _ = run(capsys, "audit", str(runs), "--ledger-dir", str(ledger_dir), "--no-suites", "--json")
    assert code == 0  # not --strict
    got = json.loads(out)
    got.pop("entries")
    assert got == {
        "files": [str(runs)],
        "records": 4,
        "problems": 3,
        "explained": 1,
        "unexplained": 2,
        "unlisted": 0,
        "collateral": 0,
        "passes_claimed": 0,
        "explained_at_unknown_version": 0,
        "skipped_lines": {},
        "nonfinite_passes": 0,
        "duplicates_dropped": {},
        "notes": [],
        "stale": ["ledgers/kern.toml[1]"],  # the flaky entry matched nothing here
        "unexplained_groups": [
            {
                "backend": "kern",
                "signature": f"fail | paged NHD | plain | {reason}",
                "records": 2,
                "cases": 2,
                "head_dims": [112, 128],
                "examples": [
                    {"file": str(runs), "case_id": a.id, "reason": reason},
                    {"file": str(runs), "case_id": b.id, "reason": reason},
                ],
            }
        ],
        "refused_now": [],
    }


def test_a_signature_names_status_layout_modes_keyless_rows_and_what_failed() -> None:
    """The unexplained groups' key, part by part (mutmut survivors of ``signature`` and ``_first_line``)."""
    import dataclasses

    from conformance.records import ErrorStats
    from conformance.ledger.audit import signature

    def rec(c, status="fail", reason="", stats=None):
        return CheckResult(c.id, "kern", "fam", Status(status), c.to_json(), reason=reason, stats=stats)

    plain = case(kv_layout="contiguous", block_size=None)
    assert (
        signature(rec(plain, reason="RuntimeError: boom\n  at line 2"))
        == "fail | contiguous | plain | RuntimeError: boom"
    )
    long = "x  y\t" + "z" * 80
    assert signature(rec(plain, "error", long)) == "error | contiguous | plain | " + ("x y " + "z" * 80)[:60]
    modes = case(causal=True, window=(4, 0), softcap=30.0, requests=((5, 3),))  # sq > sk: the top rows see no key
    got = signature(rec(modes, reason="r"))
    assert got == "fail | paged NHD | causal window softcap sq_gt_sk | keyless rows | r"
    stats = ErrorStats(1.0, 1.0, 1.0, (0, 0, 0), 0.0, 9.0, 0.1, 0.1, 0.1, 1.0)
    checked = rec(
        case(),
        reason="ignored when checks failed",
        stats=dataclasses.replace(stats, failed_checks=["max_error", "lse"]),
    )
    assert signature(checked) == "fail | paged NHD | plain | max_error+lse"
    nocase = CheckResult("x", "kern", "fam", Status.ERROR, {"requests": "bad"}, reason="E")
    assert signature(nocase) == "error | no case | E"
    engine = case(kv_layout="contiguous", block_size=None).replace(engine="vllm_v1_fa", scenario="prefill")
    assert signature(rec(engine, reason="r")).startswith("fail | engine vllm_v1_fa | contiguous | ")


def test_unlisted_records_are_stated_in_full_and_grouped_largest_first(tmp_path: Path, ledger_dir: Path) -> None:
    """Each unlisted record's file, case, version, status and reason (cut at 200), and the groups the text output
    shows: by status and the reason's first line, the largest first, then by status and message (mutmut survivors
    of ``EntryAudit.to_json`` and ``unlisted_groups``)."""
    from conformance.ledger.entries import load_ledger_dir
    from conformance.ledger.audit import audit

    long = "E" * 250
    runs = write_reasons(
        tmp_path / "u.jsonl",
        [
            (case(requests=((3, 50),)), "error", "worker: one"),
            (case(requests=((4, 60),)), "timeout", long),
            (case(requests=((5, 70),)), "timeout", long),
            (case(requests=((6, 80),)), "crash", "a crash"),
        ],
    )
    result = audit(load_ledger_dir(ledger_dir), [runs], suites=False)
    first = result.entries[0]
    assert first.to_json()["unlisted"][1] == {
        "file": str(runs),
        "case_id": case(requests=((4, 60),)).id,
        "version": "1.0",
        "status": "timeout",
        "reason": "E" * 200,
    }
    groups = [(s, m, len(rs)) for s, m, rs in first.unlisted_groups()]
    assert groups == [("timeout", "E" * 60, 2), ("crash", "a crash", 1), ("error", "worker: one", 1)]


def test_the_audit_adds_up_over_files_and_reads_files_without_a_header(tmp_path: Path, ledger_dir: Path) -> None:
    """Counts accumulate over every file (records, problems, explained, per-entry files, explained records whose
    version is not a PEP 440 one), and a file of records without a header line is read (mutmut survivors of
    ``audit``'s accumulators and ``need_header=False``)."""
    from conformance.ledger.entries import load_ledger_dir
    from conformance.ledger.audit import audit

    one = write_reasons(tmp_path / "one.jsonl", [(case(), "fail", "r"), (case(requests=((3, 50),)), "fail", "r")])
    bare = tmp_path / "bare.jsonl"  # records only: no header line
    c = case(requests=((4, 60),))
    append_record(bare, CheckResult(c.id, "kern", "fam", Status.FAIL, c.to_json(), version="not installed", reason="r"))
    append_record(
        bare, CheckResult(case(head_dim=64).id, "kern", "fam", Status.FAIL, case(head_dim=64).to_json(), reason="r")
    )
    result = audit(load_ledger_dir(ledger_dir), [one, bare], suites=False)
    assert (result.records, result.problems, result.explained) == (4, 4, 3)
    assert result.unknown_version == 1 and result.unexplained_count == 1
    assert result.entries[0].to_json()["files"] == {str(bare): 1, str(one): 2}


def test_an_unexplained_group_shows_three_examples_with_their_reasons_cut_at_200(tmp_path: Path) -> None:
    """(mutmut survivors of ``Group.to_json``: the example count and the reason's cut)."""
    from conformance.ledger.entries import Ledger
    from conformance.ledger.audit import audit

    reason = "max_error: " + "x" * 300
    runs = write_reasons(tmp_path / "g.jsonl", [(case(requests=((n, 40),)), "fail", reason) for n in (1, 2, 3, 4)])
    (group,) = audit(Ledger([]), [runs], suites=False).unexplained
    data = group.to_json()
    assert data["records"] == 4 and data["cases"] == 4
    assert [len(e["reason"]) for e in data["examples"]] == [200, 200, 200]


HEAD_SIZE = "RuntimeError: head_size must be a multiple of 8, this is ensured by padding!"


def test_an_error_of_a_call_the_adapter_now_refuses_is_refused_now_not_unexplained(tmp_path: Path, capsys) -> None:
    """Issue 31: torch-flash once passed head dim 20 to a kernel that rejects it (an error record); the adapter declares
    that refusal since, so the audit lists the record as refused now, with the declaration, apart from the
    unexplained.  A fail of that case (the kernel's answer), an error of a case the adapter runs and an error of an
    unknown backend stay unexplained."""
    path = tmp_path / "r.jsonl"
    append_record(path, Header(suite="fuzz", backends={"torch-flash": {"version": "2.11.0"}}, env={}))
    rows = [
        ("torch-flash", case(head_dim=20, kv_layout="contiguous", block_size=None), "error", HEAD_SIZE),
        ("torch-flash", case(head_dim=20, kv_layout="contiguous", block_size=None, requests=((3, 9),)), "fail", "max"),
        ("torch-flash", case(head_dim=64, kv_layout="contiguous", block_size=None), "error", HEAD_SIZE),
        ("nosuch", case(head_dim=20, kv_layout="contiguous", block_size=None), "error", HEAD_SIZE),
    ]
    for backend, c, status, reason in rows:
        rec = CheckResult(
            c.id, backend, "fam", Status(status), c.to_json(), version="2.11.0", reason=reason, device="cuda"
        )
        append_record(path, rec)
    empty = tmp_path / "none"
    empty.mkdir()
    argv = ("audit", str(path), "--ledger-dir", str(empty), "--no-suites")
    code, out, _ = run(capsys, *argv)
    assert "4 records: 4 problems, 0 explained, 3 unexplained" in out
    assert "1 error record(s) no entry explains are calls the adapter now refuses" in out
    refused = out.split("refused now (error records of calls the adapter declares it cannot run):")[1]
    assert "torch-flash: 1 record(s) | head dim 20: 'head_size must be a multiple of 8" in refused
    data = json.loads(run(capsys, *argv, "--json")[1])
    assert [(r["backend"], r["case_id"]) for r in data["refused_now"]] == [("torch-flash", rows[0][1].id)]
    assert data["unexplained"] == 3
    assert run(capsys, *argv, "--strict")[0] == 1  # the three others


def test_records_whose_reason_is_null_are_audited_with_an_empty_reason(
    tmp_path: Path, ledger_dir: Path, capsys
) -> None:
    """A record may hold ``"reason": null`` (the reader does not refuse it; the ledger's matching reads it as '');
    the audit's text and ``--json`` show such an unexplained, unlisted or refused-now record with an empty reason
    rather than stopping with a TypeError (found beside mutmut's survivor of ``_first_line``'s ``or ""``)."""
    path = tmp_path / "n.jsonl"
    append_record(path, Header(suite="fuzz", backends={"kern": {"version": "1.0"}}, env={}))
    contiguous = dict(kv_layout="contiguous", block_size=None)
    rows = [
        ("kern", case(head_dim=64), "fail"),  # no entry's case: a group
        ("kern", case(), "crash"),  # the d80 entry's case in a status it does not list: unlisted
        ("torch-flash", case(head_dim=20, **contiguous), "error"),  # a call torch-flash now refuses
    ]
    with open(path, "a") as fh:
        for backend, c, status in rows:
            data = CheckResult(
                c.id, backend, "fam", Status(status), c.to_json(), version="1.0", device="cuda"
            ).to_json()
            fh.write(json.dumps({**data, "reason": None}) + "\n")
    argv = ("audit", str(path), "--ledger-dir", str(ledger_dir), "--no-suites")
    code, out, err = run(capsys, *argv)
    assert code == 0 and err == "" and "3 records: 3 problems, 0 explained, 2 unexplained" in out
    assert f"e.g. {rows[2][1].id}:  ({path})" in out
    data = json.loads(run(capsys, *argv, "--json")[1])
    assert [e["reason"] for g in data["unexplained_groups"] for e in g["examples"]] == [""]
    assert [u["reason"] for u in data["entries"][0]["unlisted"]] == [""]
    assert [r["error"] for r in data["refused_now"]] == [""]
