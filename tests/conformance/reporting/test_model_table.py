"""The models x kernels table: cells per model and kernel, the report section, ``--model`` selection."""

from __future__ import annotations

from pathlib import Path

import pytest

from conformance.cli import main
from conformance.suites.models import case_model, model_cases
from conformance.records import CheckResult, Header, Status
from conformance.results_writer import append_record
from conformance.reporting.model_table import model_sections
from conformance.reporting.report_render import write_report


@pytest.fixture(scope="module")
def cases():
    every = model_cases(lengths="small")
    gpt = [c for c in every if case_model(c).model == "gpt-oss-20b"]
    llama = [c for c in every if case_model(c).model == "llama-3.1-8b"]
    assert gpt and llama
    return gpt, llama


def rec(case, backend: str, status: str, reason: str = "") -> CheckResult:
    return CheckResult(
        case_id=case.id, backend=backend, family=backend, status=Status(status), case=case.to_json(), reason=reason
    )


def test_cells_sum_a_models_cases_per_kernel(cases):
    gpt, llama = cases
    results = [rec(c, "k1", "pass") for c in gpt + llama]
    results += [rec(c, "k2", "unsupported", "sinks: not declared") for c in gpt]
    results += [rec(llama[0], "k2", "fail", "error ratio 12\nmore")] + [rec(c, "k2", "pass") for c in llama[1:]]
    rows = {(r["model"], r["layer"]): r for r in model_sections(results, ["k1", "k2"])}
    assert {m for m, _ in rows} == {"gpt-oss-20b", "llama-3.1-8b"}
    g = rows[("gpt-oss-20b", "sliding")]
    assert g["cells"][0]["text"].startswith("pass ") and g["cells"][0]["status"] == "pass"
    assert g["cells"][1] == {
        "status": "unsupported",
        "text": "unsupported",
        "reason": "sinks: not declared",
        "case_id": g["cells"][1]["case_id"],
    }
    lrow = next(r for (m, _), r in rows.items() if m == "llama-3.1-8b")
    n = sum(1 for c in llama if case_model(c).layer == lrow["layer"])
    assert lrow["cells"][1]["text"] == f"FAIL 1/{n}" and lrow["cells"][1]["reason"] == "error ratio 12"
    assert any("FAIL" not in x and "fail" in x and llama[0].id in x for x in lrow["notes"])


def test_partial_refusal_shows_both_counts(cases):
    gpt, _ = cases
    layer = [c for c in gpt if case_model(c).layer == "global"]
    results = [rec(layer[0], "k", "unsupported", "fp8: no")] + [rec(c, "k", "pass") for c in layer[1:]]
    (row,) = model_sections(results, ["k"])
    assert row["cells"][0]["text"] == f"pass {len(layer) - 1}/{len(layer) - 1}, 1 unsupported"


def test_records_of_other_suites_are_not_rows():
    from conformance.cases.case import AttentionCase

    plain = AttentionCase(requests=((3, 3),), num_heads=2, num_kv_heads=2, head_dim=8)
    assert model_sections([rec(plain, "k", "pass")], ["k"]) == []


def test_report_has_the_models_section_first(cases, tmp_path: Path):
    gpt, _ = cases
    path = tmp_path / "r.jsonl"
    append_record(path, Header(suite="models", backends={"k": {"name": "k"}}, env={}))
    for c in gpt:
        append_record(path, rec(c, "k", "pass"))
    md, html = write_report([path], tmp_path / "rep", tmp_path / "no-ledger")
    text = md.read_text()
    assert "## Models x kernels" in text and "| gpt-oss-20b | sliding |" in text
    assert text.index("## Models x kernels") < text.index("## Totals")
    assert "Models &times; kernels" in html.read_text()


def test_cases_model_flag_selects_registry_models(capsys):
    assert main(["cases", "--suite", "models", "--model", "gpt-oss-20b,deepseek-v3", "--json"]) == 0
    import json

    ids = [c["id"] for c in json.loads(capsys.readouterr().out)]
    assert ids and all("@" in i and ("gpt-oss-20b@" in i or "deepseek-v3@" in i) for i in ids)
    assert any("deepseek-v3@" in i for i in ids) and any("gpt-oss-20b@" in i for i in ids)


def test_unknown_model_is_a_usage_error(capsys):
    assert main(["cases", "--suite", "models", "--model", "llama-9"]) == 2
    err = capsys.readouterr().err
    assert "--model 'llama-9' is not in the model registry" in err and "gpt-oss-120b" in err


def test_a_cell_whose_failures_the_ledger_explains_says_known(cases):
    gpt, _ = cases
    layer = [c for c in gpt if case_model(c).layer == "global"]
    results = [rec(layer[0], "k", "fail", "x")] + [rec(c, "k", "pass") for c in layer[1:]]
    (row,) = model_sections(results, ["k"], known=[(layer[0].id, "k")])
    assert row["cells"][0]["text"] == f"FAIL 1/{len(layer)} (known)"
    (row,) = model_sections(results, ["k"])
    assert row["cells"][0]["text"] == f"FAIL 1/{len(layer)}"
