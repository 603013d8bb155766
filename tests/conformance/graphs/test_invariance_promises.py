"""The kernel-level invariance verdict's promises that test_graph_mode.py leaves open (found by `nox -s mutation`):
the variants of each kind, the record's ``extra["invariance"]``, the notes and failure texts, what is promised."""

from __future__ import annotations

from typing import ClassVar

import pytest
import torch

from attnfast.base import KernelOutput, Support
from conformance.cases.case import AttentionCase
from conformance.graphs.invariance import INVARIANCE, variants
from conformance.records import Status
from conformance.verdict.check import check_backend, prepare_context
from tests.conformance.fakes import ExactBackend

GQA = dict(num_heads=4, num_kv_heads=2, head_dim=16, dtype="fp32", causal=True, kv_layout="NHD", block_size=8)


def _verdict(case: AttentionCase, backend):
    return check_backend(prepare_context(case, 0, "cpu"), backend)


class AloneUlpUp(ExactBackend):
    """Planted: a call of one request comes out one ulp up (rows 0 of 'alone' differ), on a kernel with splits."""

    name: ClassVar[str] = "fake-alone-ulp"

    def prepare(self, case, inputs):
        run = super().prepare(case, inputs)
        if case.batch > 1:
            return run
        return lambda: KernelOutput(torch.nextafter(run().out, torch.tensor(float("inf"))), run().lse)


class NoLse(ExactBackend):
    name: ClassVar[str] = "fake-no-lse"

    def prepare(self, case, inputs):
        run = super().prepare(case, inputs)
        return lambda: KernelOutput(run().out, None)


class RefusesAlone(ExactBackend):
    name: ClassVar[str] = "fake-refuses-alone"

    def supports(self, case, device):
        return Support(False, "planted: no batch of one") if case.batch == 1 else super().supports(case, device)


def test_run_variants_are_the_same_call_twice_and_splits_variants_name_their_split_count():
    case = AttentionCase(((2, 30), (1, 9)), invariance="run", **GQA)
    run = variants(case)
    assert [(v.label, v.picks, v.target_row) for v in run] == [
        ("first run", ((0, 30), (1, 9)), 0),
        ("second run", ((0, 30), (1, 9)), 0),
    ]
    assert all(v.case == case.replace(invariance="") for v in run)
    assert run[0].target_rows == slice(0, 2) and run[0].target_index == 0
    splits = variants(case.replace(invariance="splits"))
    assert [v.label for v in splits] == ["heuristic (num_splits None)", "num_splits 1", "num_splits 2", "num_splits 3"]
    assert all(v.case.invariance == "" and v.picks == run[0].picks for v in splits)


def test_batch_variants_place_request_0_and_cut_the_others_to_half_their_keys():
    """Causal: a cut request keeps at least its own query rows of keys; not causal, half its keys."""
    causal = AttentionCase(((3, 30), (2, 9), (4, 50)), invariance="batch", **GQA)
    last = variants(causal)[2]
    assert (last.label, last.picks, last.target_row, last.target_index) == (
        "in batch (last)",
        ((1, 9), (2, 50), (0, 30)),
        6,
        2,
    )
    assert last.target_rows == slice(6, 9) and last.case.requests == ((2, 9), (4, 50), (3, 30))
    assert variants(causal)[3].picks == ((0, 30), (1, 4), (2, 25))
    open_ = AttentionCase(((3, 30), (2, 3), (4, 50)), invariance="batch", **(GQA | dict(causal=False)))
    assert variants(open_)[3].picks == ((0, 30), (1, 1), (2, 25))
    one_key = AttentionCase(((3, 30), (2, 1), (4, 50)), invariance="batch", **(GQA | dict(causal=False)))
    assert variants(one_key)[3].picks == ((0, 30), (1, 0), (2, 25))  # not causal: half of one key is none
    causal_short = AttentionCase(((3, 30), (2, 3), (4, 50)), invariance="batch", **GQA)
    assert variants(causal_short)[3].picks == ((0, 30), (1, 2), (2, 25))  # 2 query rows need 2 keys


def test_an_unknown_invariance_is_refused_naming_the_kinds():
    case = AttentionCase(((1, 30),), **GQA)
    object.__setattr__(case, "invariance", "often")
    with pytest.raises(ValueError, match=r"^invariance must be one of run, batch, neighbour, splits; got 'often'$"):
        variants(case)


def test_an_invariance_is_supported_only_when_every_variant_is_and_names_the_refused_one():
    case = AttentionCase(((1, 30), (1, 9)), invariance="batch", **GQA)
    assert INVARIANCE.supports(case, ExactBackend(), "cpu") == Support(True)
    assert INVARIANCE.supports(case, RefusesAlone(), "cpu") == Support(False, "alone: planted: no batch of one")


def test_the_record_holds_every_pair_and_a_promised_break_fails_with_each_differing_variant():
    case = AttentionCase(((1, 30), (1, 9), (1, 50)), invariance="batch", num_splits=1, **GQA)
    r = _verdict(case, AloneUlpUp())
    assert r.status is Status.FAIL
    assert "invariance batch: request 0 'alone' differs from 'in batch (first)': 1 of 1 rows differ" in r.reason
    inv = r.extra["invariance"]
    assert inv["kind"] == "batch" and inv["promised"] is True and inv["kept"] is False
    assert [(p["a"], p["b"], p["equal"], p["rows"], p["total_rows"]) for p in inv["pairs"]] == [
        ("in batch (first)", "alone", False, 1, 1),
        ("in batch (first)", "in batch (last)", True, 0, 1),
        ("in batch (first)", "beside shorter requests", True, 0, 1),
    ]
    assert 0 < inv["pairs"][0]["max_abs"] < 1e-5 and inv["pairs"][1]["max_abs"] == 0.0
    assert r.extra["notes"][:2] == [
        f"in batch (first): {variants(case)[0].case.summary()} (num_splits 1)",
        f"alone: {variants(case)[1].case.summary()} (num_splits 1)",
    ]


@pytest.mark.parametrize(("kind", "num_splits"), [("batch", None), ("splits", None)])
def test_a_break_that_is_not_promised_is_reported_not_failed(kind, num_splits):
    case = AttentionCase(((1, 30), (1, 9)), invariance=kind, num_splits=num_splits, **GQA)
    r = _verdict(case, AloneUlpUp() if kind == "batch" else ExactBackend())
    assert r.status is Status.PASS, r.reason
    assert r.extra["invariance"]["promised"] is False


def test_the_composition_output_is_every_variant_one_after_the_other_and_lse_only_when_every_call_has_one():
    case = AttentionCase(((2, 30), (1, 9)), invariance="run", **GQA)
    ctx = prepare_context(case, 0, "cpu")
    out = INVARIANCE.prepare(case, ctx.inputs, ExactBackend(), "cpu")()
    assert out.out.shape[0] == 2 * case.total_q and out.lse is not None and out.lse.shape[1] == 2 * case.total_q
    assert torch.equal(out.out[: case.total_q], out.out[case.total_q :])
    run = INVARIANCE.prepare(case, ctx.inputs, NoLse(), "cpu")
    assert run().lse is None and run.extra["invariance"]["kept"] is True
    ref = INVARIANCE.reference(case, ctx.inputs)
    assert ref.out.shape[0] == 2 * case.total_q and ref.lse.shape == (case.num_heads, 2 * case.total_q)
    base_out, base_lse = INVARIANCE.baseline(case, ctx.inputs)
    assert base_out.shape[0] == 2 * case.total_q and base_lse.shape == (case.num_heads, 2 * case.total_q)


class SplitsSpy(ExactBackend):
    """Records the split count of each call it is given, and of the inputs it is given with it."""

    name: ClassVar[str] = "fake-splits-spy"

    def __init__(self) -> None:
        self.calls: list[tuple[int | None, int | None]] = []

    def prepare(self, case, inputs):
        self.calls.append((case.num_splits, inputs.case.num_splits))
        return super().prepare(case, inputs)


def test_each_splits_variant_calls_the_kernel_with_its_own_split_count_and_inputs_that_say_so():
    case = AttentionCase(((1, 30), (1, 9)), invariance="splits", **GQA)
    spy = SplitsSpy()
    r = _verdict(case, spy)
    assert r.status is Status.PASS, r.reason
    assert spy.calls == [(None, None), (1, 1), (2, 2), (3, 3)]
    assert [n.rsplit(" (", 1)[1] for n in r.extra["notes"][:4]] == [
        "num_splits None)",
        "num_splits 1)",
        "num_splits 2)",
        "num_splits 3)",
    ]


def test_batch_invariance_is_promised_only_with_num_splits_1():
    """Another pinned split count is still a pinned count, but not the batch-invariant mode's promise."""
    case = AttentionCase(((1, 30), (1, 9), (1, 50)), invariance="batch", num_splits=2, **GQA)
    r = _verdict(case, AloneUlpUp())
    assert r.status is Status.PASS, r.reason
    assert r.extra["invariance"]["promised"] is False and r.extra["invariance"]["kept"] is False


class LseDriftsOnRerun(ExactBackend):
    """Planted: the same call's LSE comes out one ulp up from its second run on (the output itself stays)."""

    name: ClassVar[str] = "fake-lse-drifts"

    def __init__(self) -> None:
        self.runs = 0

    def prepare(self, case, inputs):
        run = super().prepare(case, inputs)

        def call():
            res, self.runs = run(), self.runs + 1
            return KernelOutput(
                res.out, torch.nextafter(res.lse, torch.tensor(float("inf"))) if self.runs > 1 else res.lse
            )

        return call


def test_the_lse_of_request_0_is_compared_too():
    case = AttentionCase(((1, 30), (1, 9)), invariance="run", **GQA)
    r = _verdict(case, LseDriftsOnRerun())
    assert r.status is Status.FAIL
    assert "invariance run: request 0 'second run' differs from 'first run': 1 of 1 rows differ" in r.reason
