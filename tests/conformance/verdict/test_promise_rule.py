"""The promise rule: a kernel promises batch invariance only through an argument its call takes (the adapter's
``batch_invariance_via``), and the invariance verdicts read that declaration.

Issue 31: sdpa-cuda failed a ``batch`` invariance case with ``num_splits = 1``, though SDPA takes no split count
(torch-flash, refusing split counts, was already "reported, not failed").  Here a planted batch-dependent kernel
(exact, one ulp off in any call of more than one request) wears each registered adapter's declarations: a break
fails the case exactly where the adapter's call pins the split count, and is reported otherwise.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
import torch

from attnfast.base import KernelOutput
from attnfast.registry import BUILTIN, get_backend
from conformance.cases.case import AttentionCase
from conformance.engines import get_engine
from conformance.records import Status
from conformance.verdict.check import check_backend, prepare_context
from tests.conformance.fakes import ExactBackend

CASE = AttentionCase(
    ((1, 30), (1, 9), (1, 50)), num_heads=4, num_kv_heads=2, head_dim=64, causal=True, kv_layout="NHD",
    block_size=16, invariance="batch", num_splits=1,
)  # fmt: skip


def _ulp_up(res: KernelOutput) -> KernelOutput:
    out = res.out.clone()
    out[0, 0, 0] = torch.nextafter(out[0, 0, 0], torch.tensor(float("inf"), dtype=out.dtype))
    return KernelOutput(out, res.lse)


class BatchDependentAs(ExactBackend):
    """Planted: a request's output depends on the rest of its batch (a split heuristic reading the batch size); its
    promise is ``real``'s declaration (``batch_invariance_via`` and ``pins_splits``)."""

    name: ClassVar[str] = "fake-batch-dependent-as"

    def __init__(self, real: Any) -> None:
        self.real = real
        self.name = f"fake-batch-dependent-as-{real.name}"  # type: ignore[misc]
        self.batch_invariance_via = real.batch_invariance_via  # type: ignore[misc]

    def pins_splits(self, case: AttentionCase) -> bool:
        return self.real.pins_splits(case)

    def prepare(self, case, inputs):
        run = super().prepare(case, inputs)
        return (lambda: _ulp_up(run())) if case.batch > 1 else run


_CONTEXTS: dict[str, Any] = {}


def _verdict(case: AttentionCase, backend: Any):
    if case.id not in _CONTEXTS:
        _CONTEXTS[case.id] = prepare_context(case, 0, "cpu")
    return check_backend(_CONTEXTS[case.id], backend)


def test_sdpa_cuda_batch_variance_is_reported_not_failed():
    r = _verdict(CASE, BatchDependentAs(get_backend("sdpa-cuda")))
    assert r.status is Status.PASS, r.reason
    inv = r.extra["invariance"]
    assert inv["promised"] is False and inv["kept"] is False
    assert not next(p for p in inv["pairs"] if p["b"] == "alone")["equal"]


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_a_batch_break_fails_exactly_where_the_call_pins_the_split_count(name):
    real = get_backend(name)
    r = _verdict(CASE, BatchDependentAs(real))
    inv = r.extra["invariance"]
    assert inv["kept"] is False
    assert inv["promised"] is (real.batch_invariance_via is not None), name  # every call here is a paged decode
    if inv["promised"]:
        assert r.status is Status.FAIL and "invariance batch: request 0 'alone' differs" in r.reason
    else:
        assert r.status is Status.PASS, r.reason


@pytest.mark.parametrize(
    ("engine", "scenario"),
    [("vllm_v1_fa", "inv_batch_invariant_decode"), ("sglang_fa", "inv_batch_decode_deterministic")],
)
def test_an_engines_batch_invariant_mode_promises_through_the_kernels_argument(engine, scenario):
    case = next(c for c in get_engine(engine).cases() if c.scenario == scenario)
    sdpa = _verdict(case, BatchDependentAs(get_backend("sdpa-cuda")))
    assert sdpa.status is Status.PASS, sdpa.reason
    assert sdpa.extra["invariance"]["promised"] is False and sdpa.extra["invariance"]["kept"] is False
    fa3 = _verdict(case, BatchDependentAs(get_backend("fa3-vllm")))
    assert fa3.status is Status.FAIL and fa3.extra["invariance"]["promised"] is True
