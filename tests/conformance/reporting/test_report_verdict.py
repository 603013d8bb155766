"""The report opens on its verdict (issue 28): a line per backend, the unexpected problems grouped by cause, the
changes against ``--baseline``, the details, the environment last and folded; Markdown notes rendered in the HTML.

The page as a browser lays it out: test_report_browser.py.  The run it reports: report_data.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conformance.cli import main
from conformance.records import CheckResult, Header, Status
from conformance.reporting.report import build_context, load_runs, problem_groups
from conformance.ledger.entries import load_ledger
from conformance.reporting.report_render import _inline_md, write_report
from conformance.results_writer import append_record
from tests.conformance.reporting.report_data import WINDOWS, write_files


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_files(tmp_path_factory.mktemp("verdict"))


@pytest.fixture(scope="module")
def report(files: dict[str, Path]) -> dict[str, str]:
    out = files["tmp"] / "rep"
    args = ["report", str(files["new"]), "--baseline", str(files["old"]), "--ledger-dir", str(files["ledgers"])]
    assert main([*args, "--out", str(out)]) == 0
    return {"md": (out / "report.md").read_text(), "html": (out / "report.html").read_text()}


def _order(text: str, *marks: str) -> list[int]:
    positions = [text.find(m) for m in marks]
    assert -1 not in positions, [m for m, p in zip(marks, positions) if p == -1]
    return positions


def test_the_markdown_opens_on_the_verdict_and_ends_on_the_folded_environment(report: dict[str, str]) -> None:
    md = report["md"]
    marks = (
        "## Verdict",
        "## Unexpected problems (6)",
        "## Changes against the baseline",
        "## Details",
        "## Environment",
    )
    positions = _order(md, *marks)
    assert positions == sorted(positions)
    assert md.index("[Verdict](#verdict)") < positions[0]  # the links come first
    assert md.index("## Verdict: 6 unexpected problem(s) in kern (1 known); 1 backend(s) judged nothing: refuser")
    verdict = md[positions[0] : positions[1]]
    assert "- `kern` 1.0: 10 judged, 3 passed, 6 unexpected, 1 known; 1 unsupported" in verdict
    assert "- `other` 1.0: 12 judged, 12 passed, 0 unexpected, 0 known" in verdict
    assert "- **`refuser` 1.0: NOTHING JUDGED**: unsupported: refuses every case: planted" in verdict
    assert "on device cpu (CPU backends only: no GPU kernel ran, and no CUDA graph was captured)" in verdict
    environment = md[positions[4] :]
    assert environment.index("<details>") < environment.index("host `box`") < environment.index("</details>")
    assert "host `box`" not in md[: positions[4]]  # the machine is described nowhere else
    assert "### Known failures (1)" in md[positions[3] : positions[4]] and "KNOWN-WINDOW-BUG" in md


def test_the_html_has_the_sections_in_order_with_links_and_the_environment_folded(report: dict[str, str]) -> None:
    html = report["html"]
    sections = re.findall(r'<section id="([a-z]+)"', html)
    assert sections == ["verdict", "unexpected", "baseline", "details", "environment"]
    nav = re.search(r'<nav class="sections" aria-label="sections">(.*?)</nav>', html).group(1)
    assert re.findall(r'href="#([a-z]+)"', nav) == sections
    assert html.index("<nav") < html.index('<section id="verdict"')
    assert '<li class="nothing-judged"><code>refuser</code> 1.0: nothing judged:' in html
    env = html[html.index('<section id="environment"') :]
    assert env.index("<details>") < env.index("<table>") < env.index("</details>")
    assert "<details open" not in env
    for anchor in re.findall(r'href="#([a-z-]+)"', html):  # every link reaches its section
        assert f'id="{anchor}"' in html, anchor


def test_unexpected_problems_are_grouped_by_cause_with_their_repro_lines(report: dict[str, str]) -> None:
    md = report["md"]
    section = md[md.index("## Unexpected problems") : md.index("## Changes against the baseline")]
    heads = re.findall(r"^### (.*)$", section, re.M)
    assert heads == [
        "`kern` fail: failed max_error (3)",
        "`kern` fail: failed lse (2)",
        "`kern` crash: worker killed by SIGSEGV (exit status N) (1)",
    ]
    assert section.count("  - repro: `attnconf run --backend kern --case-json @") == 6
    assert WINDOWS[-1].id not in section  # the known failure is not unexpected
    html = report["html"]
    assert html.count('<div class="problem">') == 6 and html.count('<div class="group">') == 3


def test_the_cause_leaves_names_whole_and_numbers_out() -> None:
    def problem(status: str, reason: str) -> CheckResult:
        return CheckResult(
            case_id=f"c{len(reason)}", backend="b", family="b", status=Status(status), case={}, reason=reason
        )

    groups = problem_groups(
        [
            problem("error", "RuntimeError: bf16 head_dim 72 not supported\n  at line 3"),
            problem("error", "RuntimeError: bf16 head_dim 104 not supported"),
            problem("timeout", "no reply within 5.0 s; worker killed"),
            problem("error", ""),
        ]
    )
    assert [(g["status"], g["cause"], g["count"]) for g in groups] == [
        ("error", "RuntimeError: bf16 head_dim N not supported", 2),
        ("error", "(no reason recorded)", 1),
        ("timeout", "no reply within N s; worker killed", 1),
    ]


def test_the_baseline_section_is_compares_own_summary(report: dict[str, str], files: dict[str, Path]) -> None:
    md = report["md"]
    section = md[md.index("## Changes against the baseline") : md.index("## Details")]
    assert f"**regressed** against `{files['old']}`" in section
    assert f"### Compare: {files['old']} -> {files['new']}: REGRESSED" in section  # compare's, two levels down
    assert "#### New failures (7)" in section and "| new failures | 7 |" in section
    html = report["html"]
    part = html[html.index('<section id="baseline"') : html.index('<section id="details"')]
    assert "<table>" in part and "<h4>New failures (7)</h4>" in part and "| new failures" not in part


def test_without_a_baseline_there_is_no_baseline_section(files: dict[str, Path]) -> None:
    md_path, html_path = write_report([files["new"]], files["tmp"] / "plain", files["ledgers"])
    assert "Changes against the baseline" not in md_path.read_text()
    html = html_path.read_text()
    assert 'id="baseline"' not in html and 'href="#baseline"' not in html


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("missing", "--baseline {old}: no such file"),
        ("garbage", "--baseline {old}: "),
        ("other-suite", "--baseline {old}: cannot be compared with {new}: a run of suite smoke, but {old} is of suite"),
        ("two-results", "--baseline {old}: compares one results file, not 2"),
        ("is-the-json", "--json {old}: is an input of this command"),
    ],
)
def test_a_baseline_that_cannot_be_read_or_compared_is_one_line_and_exit_2(
    files: dict[str, Path], tmp_path: Path, capsys, case: str, message: str
) -> None:
    old = tmp_path / "old.jsonl"
    results = [str(files["new"])]
    extra: list[str] = []
    if case == "garbage":
        old.write_text("not a results file\n")
    elif case == "other-suite":
        append_record(old, Header(suite="default", backends={}, env={}, sweep={"suite": "default", "tol": []}))
        records = files["new"].read_text().split("\n", 1)[1]  # the new run's records under another suite's header
        with old.open("a") as fh:
            fh.write(records)
    elif case == "two-results":
        old.write_bytes(files["old"].read_bytes())
        results.append(str(files["old"]))
    elif case == "is-the-json":
        old.write_bytes(files["old"].read_bytes())
        extra = ["--json", str(old)]
    out = tmp_path / "rep"
    assert main(["report", *results, "--baseline", str(old), "--out", str(out), *extra]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("attnconf report: " + message.format(old=old, new=files["new"])), err
    assert not (out / "report.md").exists() and not (out / "report.html").exists()


def test_a_refused_baseline_is_in_the_json_summary(files: dict[str, Path], tmp_path: Path, capsys) -> None:
    missing = tmp_path / "nope.jsonl"
    code = main(["report", str(files["new"]), "--baseline", str(missing), "--out", str(tmp_path / "r"), "--json", "-"])
    assert code == 2
    summary = json.loads(capsys.readouterr().out)
    assert summary["exit_status"] == 2 and summary["refusal"] == {"file": str(missing), "reason": "no such file"}


def test_notes_are_rendered_markdown_and_their_html_is_escaped(report: dict[str, str]) -> None:
    assert _inline_md("a `b_c` and <script>x</script> *d*") == (
        "a <code>b_c</code> and &lt;script&gt;x&lt;/script&gt; <em>d</em>"
    )
    html = report["html"]
    notes = re.findall(r"<li>(.*?)</li>", html[html.index('<section id="details"') :])
    assert notes and not [n for n in notes if "`" in n]
    assert any("No graph captured on device <code>cpu</code>" in n for n in notes)


def test_a_cpu_run_does_not_claim_a_cuda_graph(report: dict[str, str]) -> None:
    for text in (report["md"], report["html"]):
        assert "kept 1/1, no graph captured" in text  # one graph case of two replays, on a CPU
        assert not re.search(r"kept \d+/\d+(?!, no graph captured)", text)
        assert "not a CUDA graph" in text


def test_the_verdict_context_counts(files: dict[str, Path]) -> None:
    ctx = build_context(load_runs([files["new"]]), load_ledger(files["ledgers"]), plots=False)
    lines = {b["backend"]: b for b in ctx["verdict"]["lines"]}
    assert {k: lines["kern"][k] for k in ("judged", "passed", "unexpected", "known", "unsupported")} == {
        "judged": 10,
        "passed": 3,
        "unexpected": 6,
        "known": 1,
        "unsupported": 1,
    }
    assert lines["refuser"]["judged"] == 0 and lines["refuser"]["nothing_judged"].startswith("unsupported: ")
    assert lines["kern"]["nothing_judged"] is None and ctx["verdict"]["bad"]


def test_a_selected_backend_with_no_record_is_a_line_that_judged_nothing(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    info = {"name": "absent", "family": "absent", "version": "2", "available": "no", "unavailable_reason": "gone"}
    append_record(path, Header(suite="smoke", backends={"absent": info}, env={"run": {"device": "cuda"}}))
    ctx = build_context(load_runs([path]), load_ledger(None), plots=False)
    assert ctx["verdict"]["lines"] == [
        {
            "backend": "absent",
            "version": "2",
            "total": 0,
            "judged": 0,
            "passed": 0,
            "unexpected": 0,
            "known": 0,
            "unsupported": 0,
            "nothing_judged": "not available here: gone",
        }
    ]
    assert "judged nothing: absent" in ctx["verdict"]["headline"] and "CPU" not in ctx["verdict"]["ran"]


def test_a_large_cause_group_shows_its_first_problems_and_folds_the_rest(tmp_path: Path) -> None:
    from conformance.cases.case import AttentionCase
    from conformance.reporting.report import GROUP_SHOWN

    path = tmp_path / "r.jsonl"
    append_record(path, Header(suite="smoke", backends={}, env={"run": {"device": "cuda"}}))
    n = GROUP_SHOWN + 3
    for i in range(n):
        case = AttentionCase(requests=((1, 1 + i),), num_heads=1, num_kv_heads=1, head_dim=8)
        reason = f"worker killed by SIGSEGV (exit status -11) at pair {i}"
        append_record(path, CheckResult(case.id, "b", "b", Status.CRASH, case.to_json(), reason, repro=f"r{i}"))
    md_path, html_path = write_report([path], tmp_path / "rep")
    html = html_path.read_text()
    assert html.count('<div class="group">') == 1 and html.count('<div class="problem">') == n
    folded = html[html.index("<details><summary>3 more of this cause</summary>") :]
    assert folded.count('<div class="problem">') == 3 and "<code>r0</code>" not in folded
    md = md_path.read_text()
    assert f"### `b` crash: worker killed by SIGSEGV (exit status N) at pair N ({n})" in md
    assert all(f"repro: `r{i}`" in md for i in range(n))
