"""torch-flash adapter: the aten call checked on the meta device and against a fake with the vendored
FA2's conventions on CPU; the real op against the fp32 reference on a GPU (skipped without CUDA)."""

from __future__ import annotations

import pytest
import torch

from attnfast._fa_common import PreparedKernel
from attnfast.torch_flash import TorchFlashBackend, torch_flash_plan
from conformance.cases.inputs import make_inputs
from fake_fa3 import (
    fa_case as C,
    assert_matches_reference,
    attend_sequences,
    fa2_convention_lse,
    options_from_fa,
    available_or_skip,
    check_declared_case,
)


BACKEND = TorchFlashBackend()


def fake_flash_attention_forward(
    query,
    key,
    value,
    cum_seq_q,
    cum_seq_k,
    max_q,
    max_k,
    dropout_p,
    is_causal,
    return_debug_mask,
    *,
    scale=None,
    window_size_left=None,
    window_size_right=None,
    seqused_k=None,
    alibi_slopes=None,
):
    """The aten schema, computed by attnref in the vendored FA2's conventions (+inf, causal ALiBi)."""
    assert dropout_p == 0.0 and not return_debug_mask
    cu_q, cu_k = cum_seq_q.tolist(), cum_seq_k.tolist()
    window = (
        -1 if window_size_left is None else window_size_left,
        -1 if window_size_right is None else window_size_right,
    )
    keys = [key[a:b] for a, b in zip(cu_k, cu_k[1:])]
    values = [value[a:b] for a, b in zip(cu_k, cu_k[1:])]
    res = attend_sequences(query, cu_q, keys, values, options_from_fa(is_causal, window, 0.0, scale), alibi_slopes)
    lse = fa2_convention_lse(res.lse, cu_q, [k.shape[0] for k in keys], alibi_slopes, is_causal, window, max_k)
    return res.out.to(query.dtype), lse, torch.empty(2), torch.empty(()), torch.empty(0)


@pytest.mark.parametrize(
    "case, reason",
    [
        (C([(3, 3)], softcap=5.0), "softcap: aten._flash_attention_forward has no softcap"),
        (C([(3, 3)], sinks=True), "sinks:"),
        (
            C([(3, 3)], kv_layout="NHD", block_size=16),
            "paged: aten._flash_attention_forward takes no block table",
        ),
        (C([(3, 3)], chunk=4), "local_chunk:"),
        (C([(3, 3)], head_dim_v=32), "dv:"),
        (C([(3, 3)], dtype="fp32"), "fp32:"),
        (C([(1, 3)], append=True), "append:"),
        (C([(1, 300)], num_splits=2), "splits:"),
        (C([(3, 3)], head_dim=320), "head dims up to 256"),
        (C([(3, 3)], head_dim=47), "multiple of 8"),
        (C([(3, 3)], head_dim=1), "multiple of 8"),
    ],
)
def test_refusal_reasons(case, reason):
    got = BACKEND.supports(case, "cuda")
    assert not got and reason in got.reason, got.reason


def test_call_matches_the_aten_schema_on_meta():
    """The op accepts every keyword the adapter passes, and the outputs come back in the varlen shapes."""
    case = C([(5, 9), (2, 2), (0, 4)], causal=True, window=(3, None), alibi=True, scale=0.2)
    inputs = make_inputs(case, device="meta")
    got = PreparedKernel(torch.ops.aten._flash_attention_forward, torch_flash_plan(case, inputs))()
    assert got.out.shape == (7, 4, 64) and got.lse.shape == (4, 7) and got.lse.dtype == torch.float32


@pytest.mark.parametrize(
    "kw, window",
    [
        (dict(causal=True), (-1, -1)),  # causal travels in the flag (FA2 sets right = 0 itself)
        (dict(causal=True, window=(32, None)), (32, -1)),
        (dict(window=(8, None)), (8, -1)),
        ({}, (-1, -1)),
    ],
)
def test_window_arguments(kw, window):
    case = C([(5, 9)], **kw)
    kwargs = torch_flash_plan(case, make_inputs(case)).kwargs
    assert (kwargs["window_size_left"], kwargs["window_size_right"]) == window
    assert kwargs["is_causal"] is case.causal and kwargs["seqused_k"] is None


CASES = {
    "prefill_causal": C([(33, 33), (1, 1), (70, 70)], causal=True),
    "mixed_causal": C([(1, 60), (24, 24), (10, 90)], causal=True),
    "sq_gt_sk": C([(40, 20), (9, 3), (16, 16)], causal=True),
    "empty_kv": C([(5, 0), (3, 3), (1, 0)]),
    "cross": C([(77, 300), (1, 77), (200, 50)]),
    "window_causal": C([(100, 200), (64, 64)], causal=True, window=(32, None)),
    "window_sym": C([(100, 200), (64, 64)], window=(16, 16)),
    "scale": C([(20, 40)], causal=True, scale=0.05),
    "mqa_d128_fp16": C([(30, 50), (1, 20)], num_heads=8, num_kv_heads=1, head_dim=128, dtype="fp16", causal=True),
    "d256": C([(30, 50)], head_dim=256, causal=True),
    "decode_gqa": C([(1, 16), (1, 300), (1, 1)], num_heads=8, num_kv_heads=2),
}
CPU_NAMES = [n for n in CASES if max(CASES[n].kv_lens) <= 200]


@pytest.mark.parametrize("name", CPU_NAMES)
def test_translation_against_fake(name):
    case = CASES[name]
    inputs = make_inputs(case)
    fn = PreparedKernel(fake_flash_attention_forward, torch_flash_plan(case, inputs))
    assert_matches_reference(case, inputs, fn(), label=f"fake torch-flash {name}")


# ------------------------------------------------------------------ GPU: the real op
@pytest.fixture(scope="module")
def gpu():
    return available_or_skip(BACKEND)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CASES))
def test_gpu_matches_reference(gpu, name):
    check_declared_case(gpu, name, CASES[name])
