"""Backward records name the kernel variant that ran (issue 31 item 6): SDPA the backend torch picks for the
training call (read under that call's conditions), the FA adapters their entry point and ``deterministic``; the
report's *Kernel variants* and ``attnconf compare``'s variant changes then include backward records."""

from __future__ import annotations

import dataclasses
import json
import sys
import types
from pathlib import Path

import pytest
import torch

from attnfast.autograd import AutogradBackward, grad_leaves
from attnfast.fa2 import VARLEN, FA2Backend
from attnfast.fa4 import ENTRY as FA4_ENTRY
from attnfast.fa4 import FA4Backend, fa4_variant
from attnfast.registry import get_backend
from attnfast.sdpa import SdpaCpuBackend
from attnfast.sdpa_backward import sdpa_backward
from attnfast.torch_flash import ENTRY as TORCH_FLASH_ENTRY
from attnfast.torch_flash import TorchFlashBackend
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import make_inputs
from conformance.cli import main
from conformance.records import Status
from conformance.reporting.compare import compare_results
from conformance.reporting.variant_table import variant_sections
from conformance.results_writer import append_record
from conformance.verdict.check import check_backend, prepare_context
from tests.conformance.reporting.test_compare import HEADER

CASE = AttentionCase(
    ((3, 20), (4, 12)), num_heads=4, num_kv_heads=2, head_dim=16, dtype="bf16", causal=True, backward=True
)


def _record(case: AttentionCase = CASE):
    return check_backend(prepare_context(case, 0, "cpu"), get_backend("sdpa-cpu"))


# ------------------------------------------------------------------------------------------------ SDPA
@pytest.mark.parametrize("deterministic", [False, True])
def test_sdpa_cpu_backward_record_names_its_backend(deterministic: bool) -> None:
    """Before: a backward record had no ``extra["variant"]`` (the forward's had ``{"sdpa": "MATH"}``)."""
    r = _record(CASE.replace(deterministic=deterministic))
    assert r.status == Status.PASS and "backward" in r.extra
    assert r.extra["variant"] == {"sdpa": "MATH", "deterministic": deterministic}


def test_sdpa_backward_learned_sinks_name_their_backend_too() -> None:
    r = _record(CASE.replace(sinks=True))
    assert r.status == Status.PASS and r.extra["variant"] == {"sdpa": "MATH", "deterministic": False}


def test_sdpa_backward_reads_the_pick_under_the_calls_own_conditions() -> None:
    """The pick is read after the call, on the arguments the training call passed (leaves with requires_grad),
    with grad mode on and under the deterministic switch, even when the reader runs under no_grad; one read per
    request of the first call (the timer's later calls change nothing)."""
    seen: list[tuple] = []

    def choices(calls) -> str:
        seen.append(
            (
                len(calls),
                torch.is_grad_enabled(),
                all(c.q.requires_grad and c.k.requires_grad and c.v.requires_grad for c in calls),
                torch.are_deterministic_algorithms_enabled(),
            )
        )
        return "PICKED"

    case = CASE.replace(deterministic=True)
    call = sdpa_backward(SdpaCpuBackend(), case, make_inputs(case, seed=0), learn_sinks=False, choices=choices)
    assert call.variant == {} and seen == []  # nothing ran yet: nothing to name
    call()
    call()
    with torch.no_grad():
        assert call.variant == {"sdpa": "PICKED", "deterministic": True}
    assert seen == [(2, True, True, True)]
    assert not torch.are_deterministic_algorithms_enabled()  # the switch is restored after the read


def test_sdpa_backward_with_no_query_row_names_no_call() -> None:
    empty = CASE.replace(requests=((0, 5),))
    call = SdpaCpuBackend().prepare_backward(empty, make_inputs(empty, seed=0))
    call()
    assert call.variant == {"sdpa": "", "deterministic": False}  # as the forward's: no SDPA call ran


# ------------------------------------------------------------------------------------------------ AutogradBackward
def _autograd(variant) -> AutogradBackward:
    inputs = make_inputs(CASE, seed=0)
    return AutogradBackward(lambda leaves: (leaves.q * 1.0, None), grad_leaves(inputs), inputs.dout, variant=variant)


def test_autograd_backward_variant_static_absent_or_unread() -> None:
    assert _autograd(None).variant == {}
    static = {"entry": "k", "deterministic": False}
    assert _autograd(static).variant == static and _autograd(static).variant is not static

    def broken() -> dict:
        raise RuntimeError("no dispatcher here\nsecond line")

    assert _autograd(broken).variant == {"unread": "RuntimeError: no dispatcher here"}


def test_a_backward_without_a_variant_records_none() -> None:
    """An adapter whose training call names no variant (a third-party one) gets no ``extra["variant"]``."""

    class Plain(SdpaCpuBackend):
        def prepare_backward(self, case, inputs):
            call = super().prepare_backward(case, inputs)
            call._variant = None
            return call

    r = check_backend(prepare_context(CASE, 0, "cpu"), Plain())
    assert r.status == Status.PASS and "variant" not in r.extra


# ------------------------------------------------------------------------------------------------ FA adapters
@pytest.mark.parametrize("deterministic", [False, True])
def test_fa_backward_calls_name_entry_and_deterministic(monkeypatch: pytest.MonkeyPatch, deterministic: bool) -> None:
    """FA2 and FA4 pass ``deterministic`` to their entry point; torch-flash reads torch's global switch.  Before:
    their training calls carried no variant."""
    cute = types.ModuleType("flash_attn.cute")
    setattr(cute, "flash_attn_varlen_func", lambda *a, **kw: None)  # never called: the variant is known before it
    monkeypatch.setitem(sys.modules, "flash_attn", types.SimpleNamespace(cute=cute, flash_attn_varlen_func=None))
    monkeypatch.setitem(sys.modules, "flash_attn.cute", cute)
    case = CASE.replace(dtype="fp16", deterministic=deterministic)
    inputs = make_inputs(case, seed=0)
    assert FA2Backend().prepare_backward(case, inputs).variant == {"entry": VARLEN, "deterministic": deterministic}
    fa4 = FA4Backend().prepare_backward(case, inputs).variant
    assert fa4 == {"entry": FA4_ENTRY, "deterministic": deterministic, **fa4_variant(case)}
    assert f"('bwd', {deterministic}, " in fa4["compile_key"]  # the backward kernel it compiles (and its tile variant)
    tf = TorchFlashBackend().prepare_backward(case, inputs).variant
    assert tf == {"entry": TORCH_FLASH_ENTRY, "deterministic": deterministic}


# ------------------------------------------------------------------------------------------------ report, compare
def test_backward_variants_reach_the_report_and_compare(tmp_path: Path) -> None:
    r = _record()
    s = variant_sections([r], ["sdpa-cpu"])
    assert s is not None and s["rows"] == [
        {"backend": "sdpa-cpu", "variant": "deterministic=False, sdpa=MATH", "records": 1, "counts": {"pass": 1}}
    ]
    older = dataclasses.replace(r, extra={k: v for k, v in r.extra.items() if k != "variant"})
    assert not compare_results([older], [r]).variant_changes  # a record from before: readable, nothing listed
    old, new = tmp_path / "old.jsonl", tmp_path / "new.jsonl"
    for path, sdpa in ((old, "FLASH_ATTENTION"), (new, "CUDNN_ATTENTION")):
        append_record(path, HEADER)
        append_record(path, dataclasses.replace(r, extra={**r.extra, "variant": {**r.extra["variant"], "sdpa": sdpa}}))
    out = tmp_path / "cmp.json"
    assert main(["compare", str(old), str(new), "--json", str(out)]) == 0
    changes = json.loads(out.read_text())["variant_changes"]
    assert [(c["old_variant"]["sdpa"], c["new_variant"]["sdpa"]) for c in changes] == [
        ("FLASH_ATTENTION", "CUDNN_ATTENTION")
    ]
    assert main(["report", str(new), "--out", str(tmp_path / "rep")]) == 0
    section = (tmp_path / "rep" / "report.md").read_text().split("## Kernel variants")[1]
    assert "sdpa=CUDNN_ATTENTION" in section
