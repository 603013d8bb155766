"""Every registered adapter's ``batch_invariance_via``: declared exactly when its kernel call passes the case's split
count (issue 31: sdpa-cuda failed a batch invariance it never promised, SDPA having no split count).

The verdict reads the declaration (:meth:`attnfast.base.Backend.pins_splits`); these tests check it against the
call the adapter really makes, read without a GPU: the FA-family and FlashMLA plans' keyword arguments, and for
the torch adapters the arguments their torch function is called with (recorded).  An adapter added to the
registry needs a line in :data:`CALLS` (how its kernel call is read), else its test fails.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from unittest import mock

import pytest
import torch

from attnfast import fa3, fa3_vllm, fa4
from attnfast.fa2 import fa2_plan
from attnfast.fa3 import fa3_plan
from attnfast.fa3_vllm import fa3_vllm_plan
from attnfast.fa4 import fa4_plan
from attnfast.flashmla import flashmla_plan
from attnfast.registry import BUILTIN, available_names, get_backend
from attnfast.torch_flash import torch_flash_plan
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import CaseInputs, make_inputs

GQA = dict(num_heads=4, num_kv_heads=2, head_dim=64, causal=True)
#: cases with a pinned split count, over the entry points the adapters choose between
PINNED = {
    "decode_paged256": AttentionCase(((1, 300), (1, 17), (1, 90)), kv_layout="NHD", block_size=256, **GQA),
    "decode_paged16": AttentionCase(((1, 60), (1, 17), (1, 90)), kv_layout="NHD", block_size=16, **GQA),
    "mixed_contiguous": AttentionCase(((5, 40), (1, 17), (30, 60)), **GQA),
    "mla_decode_paged64": AttentionCase(
        ((1, 100), (1, 30)),
        num_heads=16,
        num_kv_heads=1,
        head_dim=64,
        head_dim_v=512,
        qv=True,
        causal=True,
        kv_layout="NHD",
        block_size=64,
    ),  # fmt: skip
}
PINNED = {k: c.replace(num_splits=1) for k, c in PINNED.items()}


def _recorded(target: str, result: Callable[..., Any]) -> Callable[[Any, AttentionCase, CaseInputs], list[dict]]:
    """The keyword arguments of every call of ``target`` (a torch function an adapter calls), recorded while the
    adapter's prepared callable runs (``result`` builds what the function returns)."""

    def read(backend: Any, case: AttentionCase, inputs: CaseInputs) -> list[dict]:
        calls: list[dict] = []

        def record(*args: Any, **kwargs: Any) -> Any:
            calls.append(kwargs)
            return result(*args, **kwargs)

        with mock.patch(target, record):
            backend.prepare(case, inputs)()
        assert calls, f"{backend.name}: no call of {target} recorded"
        return calls

    return read


def _sdpa_out(q, k, v, **kwargs):
    return q.new_zeros(*q.shape[:-1], v.shape[-1])


def _flex_out(q, k, v, **kwargs):
    return q.new_zeros(*q.shape[:-1], v.shape[-1]), q.new_zeros(q.shape[:-1], dtype=torch.float32)


def _chunked_out(q, k, v, **kwargs):
    return q.new_zeros(*q.shape[:-1], v.shape[-1], dtype=torch.float32), q.new_zeros(q.shape[1], q.shape[0])


def _planned(plan: Callable[..., Any], *extra: Any) -> Callable[[Any, AttentionCase, CaseInputs], list[dict]]:
    return lambda backend, case, inputs: [dict(plan(case, inputs, *extra).kwargs)]


#: registry name -> the keyword arguments of the kernel calls the adapter makes for (case, inputs)
CALLS: dict[str, Callable[[Any, AttentionCase, CaseInputs], list[dict]]] = {
    "fa2": _planned(fa2_plan),
    "fa3": _planned(fa3_plan),
    "fa3-vllm": _planned(fa3_vllm_plan, None),
    "fa4": _planned(fa4_plan),
    "flashmla": _planned(flashmla_plan, None),
    "torch-flash": _planned(torch_flash_plan),
    "sdpa-cpu": _recorded("torch.nn.functional.scaled_dot_product_attention", _sdpa_out),
    "sdpa-cuda": _recorded("torch.nn.functional.scaled_dot_product_attention", _sdpa_out),
    "flex-cpu": _recorded("attnfast.flex._flex_call", _flex_out),
    # the repository's example of a third-party adapter (examples/attnfast_example_backend)
    "example-chunked": _recorded("attnfast_example_chunked.chunked_attention", _chunked_out),
}


def _supports(backend: Any, case: AttentionCase) -> bool:
    """The adapter's answer on its own device, FA3-family limits as on an H100 (sm_90)."""
    with (
        mock.patch.object(fa3, "compute_capability", lambda device="cuda": (9, 0)),
        mock.patch.object(fa3_vllm, "compute_capability", lambda device="cuda": (9, 0)),
        mock.patch.object(fa4, "compute_capability", lambda device="cuda": (9, 0)),
    ):
        return bool(backend.supports(case, backend.devices[0]))


@pytest.mark.parametrize("name", available_names())
def test_the_declared_argument_is_the_one_the_call_pins(name):
    if name not in CALLS and name not in BUILTIN and name != "example-chunked":
        pytest.skip(f"{name}: an entry point installed here; its kernel call is not read by this test")
    backend = get_backend(name)
    assert name in CALLS, f"{name}: add to CALLS how its kernel call is read, to check its batch_invariance_via"
    assert backend.batch_invariance_via in (None, "num_splits"), backend.batch_invariance_via
    pinned_somewhere = False
    checked = 0
    for label, case in PINNED.items():
        if not _supports(backend, case):
            continue
        checked += 1
        inputs = make_inputs(case, 0, "cpu")
        calls = CALLS[name](backend, case, inputs)
        passes = all(c.get("num_splits") == case.num_splits for c in calls)
        assert backend.pins_splits(case) is passes, (name, label, [sorted(c) for c in calls])
        assert not backend.pins_splits(case.replace(num_splits=None)), (name, label)
        pinned_somewhere |= passes
    assert checked, f"{name}: supports none of the probe cases {list(PINNED)}"
    assert pinned_somewhere is (backend.batch_invariance_via is not None), name


@pytest.mark.parametrize("name", ["sdpa-cpu", "sdpa-cuda", "flex-cpu", "torch-flash", "flashmla"])
def test_kernels_without_a_split_count_declare_none(name):
    assert get_backend(name).batch_invariance_via is None
    assert not get_backend(name).pins_splits(PINNED["decode_paged16"])


def test_fa2_pins_only_through_flash_attn_with_kvcache():
    fa2 = get_backend("fa2")
    assert fa2.batch_invariance_via == "num_splits"
    assert fa2.pins_splits(PINNED["decode_paged256"])  # flash_attn_with_kvcache(num_splits=1)
    assert not fa2.pins_splits(PINNED["mixed_contiguous"])  # flash_attn_varlen_func has no num_splits
