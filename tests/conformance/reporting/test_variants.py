"""Which kernel variant ran (issue 31 item 6): recorded per record, grouped by the report, diffed by compare."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch

from attnfast._fa_common import KernelCall, PreparedKernel
from attnfast.fa4 import fa4_compile_key, fa4_sm90_tile_n, fa4_variant
from attnfast.registry import get_backend
from attnfast.sdpa import sdpa_choices
from conformance.cases.case import AttentionCase
from conformance.cli import main
from conformance.records import CheckResult, Status
from conformance.reporting.compare import compare_results, numbers_moved
from conformance.reporting.compare_markdown import render_markdown
from conformance.reporting.compare_summary import to_json
from conformance.reporting.variant_table import MAX_VARIANTS, variant_label, variant_sections
from conformance.results_writer import append_record
from conformance.verdict.check import check_backend, prepare_context
from tests.conformance.reporting.test_compare import HEADER
from tests.conformance.reporting.test_compare import rec as compare_rec

CASE = AttentionCase(((3, 20), (4, 12)), num_heads=4, num_kv_heads=2, head_dim=16, dtype="bf16", causal=True)


def rec(case_id: str, variant: dict | None, max_abs: float = 0.1, status: str = "pass") -> CheckResult:
    """test_compare's record of family ``k`` (every error statistic ``max_abs``), naming ``variant``."""
    extra = {} if variant is None else {"variant": variant}
    return dataclasses.replace(compare_rec(case_id, status, family="k", ratio=max_abs), extra=extra)


# ------------------------------------------------------------------------------------------------ adapters
def test_sdpa_records_the_backend_torch_dispatched_to():
    r = check_backend(prepare_context(CASE, 0, "cpu"), get_backend("sdpa-cpu"))
    assert r.status == Status.PASS and r.extra["variant"] == {"sdpa": "MATH"}


def test_sdpa_choices_counts_mixed_backends_and_never_raises():
    class Call:  # what sdpa_choices reads of a prepared request
        def __init__(self, backends, q):
            from torch.nn.attention import SDPBackend

            self.backends = [getattr(SDPBackend, b) for b in backends]
            self.q = self.k = self.v = q
            self.kwargs = {"scale": 0.25}

    q = torch.randn(1, 2, 5, 8)
    lower_right = Call(["MATH"], q)
    from torch.nn.attention.bias import causal_lower_right

    lower_right.kwargs = {"scale": 0.25, "attn_mask": causal_lower_right(5, 5)}  # CausalBias: its own dispatch
    assert sdpa_choices([lower_right]) == "MATH"  # no fused kernel on CPU; on CUDA it read "unknown (...)" before
    assert sdpa_choices([]) == ""
    assert sdpa_choices([Call(["MATH"], q), Call(["MATH"], q)]) == "MATH"
    assert sdpa_choices([Call(["MATH"], "not a tensor")]).startswith("unknown (")


def test_prepared_kernel_names_its_entry_and_the_arguments_that_select_a_variant():
    call = KernelCall(
        "mod.flash_attn_varlen_func",
        {"q": torch.zeros(1), "num_splits": 1, "pack_gqa": None, "scheduler_metadata": torch.zeros(3), "causal": True},
        finish=lambda x: x,
        variant={"tile_n": 128},
    )
    assert PreparedKernel(lambda **kw: None, call).variant == {
        "entry": "mod.flash_attn_varlen_func",
        "num_splits": 1,
        "scheduler_metadata": True,
        "tile_n": 128,
    }


def test_fa4_names_its_compile_key_and_key_tile():
    paged = CASE.replace(kv_layout="NHD", block_size=16)
    v = fa4_variant(paged)
    assert v == {"compile_key": "|".join(map(str, fa4_compile_key(paged))), "tile_n": fa4_sm90_tile_n(paged)}
    assert fa4_variant(CASE)["compile_key"] != v["compile_key"]  # contiguous keys: another kernel


# ------------------------------------------------------------------------------------------------ compare
def test_compare_lists_variant_changes_with_whether_the_numbers_moved():
    old = [rec("same", {"sdpa": "FLASH"}), rec("kernel", {"sdpa": "FLASH"}), rec("moved", {"sdpa": "FLASH"})]
    old += [rec("older", None), rec("gone", {"sdpa": "FLASH"})]
    new = [rec("same", {"sdpa": "FLASH"}), rec("kernel", {"sdpa": "CUDNN"}), rec("moved", {"sdpa": "CUDNN"}, 0.3)]
    new += [rec("older", {"sdpa": "CUDNN"}), rec("gone", None)]
    cmp = compare_results(old, new)
    assert [p.key[0] for p in cmp.variant_changes] == ["kernel", "moved"]  # one side without a variant: not listed
    assert [numbers_moved(p) for p in cmp.variant_changes] == [False, True]
    assert not cmp.regressed and cmp.exit_status == 0  # informational
    md = render_markdown(cmp)
    assert "## Kernel variant changed (not a regression by itself) (2)" in md
    assert "| k | kernel | sdpa=FLASH | sdpa=CUDNN | same | pass |" in md
    assert "| k | moved | sdpa=FLASH | sdpa=CUDNN | moved (ratio 0.1 -> 0.3) | pass |" in md
    summary = to_json(cmp)
    assert summary["counts"]["variant_changes"] == 2
    assert [(v["case_id"], v["numbers_moved"]) for v in summary["variant_changes"]] == [
        ("kernel", False),
        ("moved", True),
    ]
    assert summary["variant_changes"][0]["old_variant"] == {"sdpa": "FLASH"}


def test_numbers_moved_needs_numbers_on_both_sides():
    a, b = rec("x", {"v": 1}), rec("x", {"v": 2})
    pair = compare_results([a], [dataclasses.replace(b, stats=None, status=Status.UNSUPPORTED)])
    assert pair.variant_changes and numbers_moved(pair.variant_changes[0]) is None
    lse = compare_results([a], [dataclasses.replace(b, stats=dataclasses.replace(b.stats, lse_max_abs=1.0))])
    assert numbers_moved(lse.variant_changes[0]) is True


# ------------------------------------------------------------------------------------------------ report
def test_variant_sections_group_each_backend_by_variant():
    assert variant_sections([rec("a", None)], ["k-x"]) is None
    records = [rec(f"c{i}", {"entry": "f", "sdpa": "MATH"}) for i in range(3)]
    records += [rec("d", {"sdpa": "FLASH", "entry": "f"}, status="fail"), rec("e", None)]
    records += [rec("nan", {"entry": "f", "sdpa": "FLASH"}, max_abs=float("nan"))]  # a non-finite pass is a fail
    s = variant_sections(records, ["k-x"])
    assert s["rows"] == [
        {"backend": "k-x", "variant": "entry=f, sdpa=MATH", "records": 3, "counts": {"pass": 3}},
        {"backend": "k-x", "variant": "entry=f, sdpa=FLASH", "records": 2, "counts": {"fail": 2}},
    ]
    assert s["notes"] == ["k-x: 1 records name no variant (unsupported, a composition, or an older record)"]
    assert variant_label({"z": 1, "entry": "e", "a": 2}) == "entry=e, a=2, z=1"
    many = [rec(f"m{i}", {"i": i}) for i in range(MAX_VARIANTS + 5)]
    rows = variant_sections(many, ["k-x"])["rows"]
    assert len(rows) == MAX_VARIANTS + 1 and rows[-1]["variant"] == "(5 more variants)" and rows[-1]["records"] == 5


def test_report_and_compare_cli_show_variants(tmp_path: Path):
    old, new = tmp_path / "old.jsonl", tmp_path / "new.jsonl"
    for path, variant in ((old, {"sdpa": "MATH"}), (new, {"sdpa": "FLASH_ATTENTION"})):
        append_record(path, HEADER)
        r = check_backend(prepare_context(CASE, 0, "cpu"), get_backend("sdpa-cpu"))
        append_record(path, dataclasses.replace(r, extra={**r.extra, "variant": variant}))
    assert main(["report", str(new), "--out", str(tmp_path / "rep")]) == 0
    text = (tmp_path / "rep" / "report.md").read_text()
    assert "## Kernel variants" in text and "FLASH" in text.split("## Kernel variants")[1]
    out = tmp_path / "cmp.json"
    assert main(["compare", str(old), str(new), "--json", str(out)]) == 0
    assert json.loads(out.read_text())["counts"]["variant_changes"] == 1


# ------------------------------------------------------------------------------------------------ output digests
def test_output_digest_tells_bits_apart_where_error_statistics_cannot():
    """Before: compare called a pair unchanged when its max error and LSE error were equal; two kernels that both
    round right share those with other bits (smoke on sdpa-cuda against its efficient-only variant: 135 of 135
    'identical' on the H100).  The digest of the output's bits decides where both records carry one."""
    from attnfast.base import KernelOutput
    from conformance.verdict.fingerprint import output_digest

    out = torch.randn(7, 3, 8).to(torch.bfloat16)
    lse = torch.randn(3, 7)
    d = output_digest(KernelOutput(out, lse))
    assert d == output_digest(KernelOutput(out.clone(), lse.clone()))
    bumped = out.clone()
    bumped[3, 1, 2] = torch.nextafter(bumped[3, 1, 2].float(), torch.tensor(9.0)).to(torch.bfloat16)
    if torch.equal(bumped, out):  # the bf16 step: move by one bf16 ulp
        bumped.view(torch.int16)[3, 1, 2] += 1
    assert output_digest(KernelOutput(bumped, lse)) != d
    swapped = out.clone()
    swapped[[0, 1]] = out[[1, 0]]
    assert not torch.equal(swapped, out) and output_digest(KernelOutput(swapped, lse)) != d  # a permutation
    assert output_digest(KernelOutput(out, None)).endswith(":-")
    assert output_digest(KernelOutput(out.float(), lse)) != output_digest(KernelOutput(out, lse))
    r = check_backend(prepare_context(CASE, 0, "cpu"), get_backend("sdpa-cpu"))
    assert r.extra["digest"] == check_backend(prepare_context(CASE, 0, "cpu"), get_backend("sdpa-cpu")).extra["digest"]

    a, b = rec("x", None), rec("x", None)  # equal statistics
    a = dataclasses.replace(a, extra={"digest": "1.2.3:-"})
    same = compare_results([a], [dataclasses.replace(b, extra={"digest": "1.2.3:-"})])
    other = compare_results([a], [dataclasses.replace(b, extra={"digest": "1.2.4:-"})])
    legacy = compare_results([a], [b])  # no digest on one side: by the statistics
    assert (same.identical_errors, same.digest_compared) == (1, 1)
    assert (other.identical_errors, other.digest_compared) == (0, 1)
    assert (legacy.identical_errors, legacy.digest_compared) == (1, 0)
    assert "of those, 0 unchanged, 1 changed. All 1 compared bit for bit by their output digests." in (
        render_markdown(other)
    )
    assert "of those, 1 unchanged, 0 changed. All 1 compared by max error and LSE error" in render_markdown(legacy)
    numerics = to_json(other)["numerics"]
    assert {k: numerics[k] for k in ("compared", "identical", "by_digest")} == {
        "compared": 1,
        "identical": 0,
        "by_digest": 1,
    }
    assert [(c["case_id"], c["old_status"], c["new_status"]) for c in numerics["changed"]] == [("x", "pass", "pass")]
    assert to_json(same)["numerics"]["changed"] == [] and legacy.numerics_changed == []
    assert "## Numerics changed" in render_markdown(other) and "## Numerics changed" not in render_markdown(same)


def test_output_digest_is_the_same_in_chunks(monkeypatch):
    """Chunking bounds the temporaries; it does not change the digest."""
    from attnfast.base import KernelOutput
    from conformance.verdict import fingerprint as check

    out = KernelOutput(torch.randn(33, 5, 7), torch.randn(5, 33))
    whole = check.output_digest(out)
    monkeypatch.setattr(check, "_DIGEST_CHUNK", 10)
    assert check.output_digest(out) == whole
