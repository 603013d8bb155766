"""Documented promises of the verdict that no other test held (issue 17, item 5: untested promises).

* :func:`compare` refuses a kernel output or LSE of another shape than the reference's (a ValueError naming
  both shapes) instead of broadcasting it;
* :func:`check_backend`: a broken ``version()`` probe does not hide the verdict; a raising ``supports()`` is
  an ERROR naming the exception; ``notes`` on the prepared callable reach ``extra["notes"]``;
* the built-in tolerance tables are checked at import (``_check_tables``), and a TOML table of a scope must
  hold a table of fields.
"""

from __future__ import annotations

import math

import pytest
import torch

from attnfast.base import KernelOutput
from attnref import AttnResult
from conformance.cases.case import AttentionCase
from conformance.records import Status
from conformance.verdict import tolerance as tolerance_mod
from conformance.verdict.check import check_backend, compare, prepare_context
from conformance.verdict.tolerance import DTYPE_DEFAULTS, Tolerance, load_toml
from tests.conformance import fakes

CASE = AttentionCase(requests=((4, 7), (1, 3)), num_heads=2, num_kv_heads=1, head_dim=16, causal=True)


def _ref() -> tuple[AttnResult, tuple[torch.Tensor, torch.Tensor]]:
    out = torch.randn(5, 2, 3, generator=torch.Generator().manual_seed(3))
    lse = torch.randn(2, 5, generator=torch.Generator().manual_seed(4))
    return AttnResult(out, lse), (out.clone(), lse.clone())


def test_compare_refuses_other_shapes():
    ref, base = _ref()
    tol = DTYPE_DEFAULTS["fp32"]
    with pytest.raises(ValueError, match=r"kernel out must have the reference's shape \(5, 2, 3\), got \(5, 2, 4\)"):
        compare(ref, base, KernelOutput(torch.zeros(5, 2, 4), None), tol)
    with pytest.raises(ValueError, match=r"kernel lse must have the reference's shape \(2, 5\), got \(5, 2\)"):
        compare(ref, base, KernelOutput(ref.out.clone(), ref.lse.T.clone()), tol)
    # a broadcastable (1, 5) LSE is refused too, not stretched over the heads
    with pytest.raises(ValueError, match="kernel lse must have"):
        compare(ref, base, KernelOutput(ref.out.clone(), ref.lse[:1].clone()), tol)


def test_check_backend_reports_a_wrong_lse_shape_as_a_failure():
    class LseTransposed(fakes.ExactBackend):
        name = "fake-lse-transposed"

        def finish(self, case, out, lse):
            return KernelOutput(out.to(case.torch_dtype), lse.T.contiguous().float())

    result = check_backend(prepare_context(CASE), LseTransposed())
    assert result.status is Status.FAIL and result.reason.startswith("shape: lse (5, 2) != reference (2, 5)")


def test_broken_version_probe_keeps_the_verdict():
    class NoVersion(fakes.ExactBackend):
        name = "fake-no-version"

        def version(self):
            raise RuntimeError("probe broke\nsecond line")

    result = check_backend(prepare_context(CASE), NoVersion())
    assert result.status is Status.PASS
    assert result.version == "unknown (RuntimeError: probe broke)"


def test_raising_supports_is_an_error():
    class BadSupports(fakes.ExactBackend):
        name = "fake-bad-supports"

        def supports(self, case, device):
            raise KeyError("head_dim")

    result = check_backend(prepare_context(CASE), BadSupports())
    assert result.status is Status.ERROR
    assert result.reason == "supports() raised KeyError: 'head_dim'"
    assert result.stats is None and result.kernel_s == 0


def test_notes_of_the_prepared_callable_reach_the_record():
    class Noted(fakes.ExactBackend):
        name = "fake-noted"

        def prepare(self, case, inputs):
            run = super().prepare(case, inputs)

            def call():
                call.notes.append("called once")
                return run()

            call.notes = []
            return call

    result = check_backend(prepare_context(CASE), Noted())
    assert result.status is Status.PASS and result.extra["notes"] == ["called once"]
    assert "notes" not in check_backend(prepare_context(CASE), fakes.ExactBackend()).extra


@pytest.mark.parametrize(
    "table, value, message",
    [
        ("DTYPE_DEFAULTS", lambda t: {k: v for k, v in t.items() if k != "fp16"}, "must cover every case dtype"),
        ("DTYPE_DEFAULTS", lambda t: {**t, "bf16": Tolerance(factor=2)}, r"DTYPE_DEFAULTS\[bf16\] leaves"),
        ("FEATURE_RULES", lambda t: {**t, "softcapp": Tolerance(factor=3)}, "unknown features"),
    ],
)
def test_inconsistent_tables_fail_at_import(monkeypatch, table, value, message):
    monkeypatch.setattr(tolerance_mod, table, value(getattr(tolerance_mod, table)))
    with pytest.raises(RuntimeError, match=message):
        tolerance_mod._check_tables()


def test_builtin_tables_are_consistent():
    tolerance_mod._check_tables()
    assert all(not t.missing() for t in DTYPE_DEFAULTS.values())


def test_toml_scope_entry_must_be_a_table(tmp_path):
    path = tmp_path / "tol.toml"
    path.write_text("[dtype]\nbf16 = 3\n")
    with pytest.raises(ValueError, match=r"\[dtype.bf16\] must be a table of tolerance fields, got 3"):
        load_toml(path)


def test_tolerance_inf_switches_a_bound_off_but_nan_is_refused():
    assert Tolerance(atol=math.inf).atol == math.inf
    with pytest.raises(ValueError, match="atol must be a number"):
        Tolerance(atol=math.nan)
