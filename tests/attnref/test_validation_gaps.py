"""Bad-input messages no other test reached (a coverage run of tests/attnref, issue 17 item 5).

Each call is valid but for one thing, and the ``ValueError`` must name that thing (the project's rule:
bad input gets one line naming the field and the constraint).
"""

from __future__ import annotations

import pytest
import torch

from attnref import ContextParallel, Window, attention_varlen, dequantize, merge_many, quant_format
from attnref.options import AttnOptions

H, HK, D = 4, 2, 8


def _varlen(**over):
    args = {
        "q": torch.randn(5, H, D),
        "k": torch.randn(7, HK, D),
        "v": torch.randn(7, HK, D),
        "cu_seqlens_q": torch.tensor([0, 2, 5], dtype=torch.int32),
        "cu_seqlens_k": torch.tensor([0, 3, 7], dtype=torch.int32),
    }
    args.update(over)
    return attention_varlen(**args)


def test_base_call_is_valid() -> None:
    _varlen()
    _varlen(cu_seqlens_q=[0, 2, 5])  # a list of ints is accepted where a tensor is


@pytest.mark.parametrize(
    "over, message",
    [
        ({"cu_seqlens_q": [0, 2.0, 5]}, r"cu_seqlens_q must hold integers, got \[0, 2.0, 5\]"),
        ({"cu_seqlens_q": [0, True, 5]}, "cu_seqlens_q must hold integers"),
        ({"q": [[0.0]]}, "q must be a torch.Tensor, got list"),
        ({"v": torch.randn(7, HK, 0)}, "head dims must be positive, got d=8, dv=0"),
        ({"cu_seqlens_q": torch.zeros(0, dtype=torch.int32)}, r"cu_seqlens_q must have at least one entry"),
        (
            {"seqused_k": torch.tensor([3, 2], dtype=torch.int32), "cu_seqlens_k": torch.tensor([0, 3, 8])},
            r"cu_seqlens_k\[-1\] must be <= the number of tokens \(7\), got 8",
        ),
    ],
)
def test_varlen_rejects(over, message) -> None:
    with pytest.raises(ValueError, match=message):
        _varlen(**over)


def test_seqused_k_allows_cu_seqlens_k_to_end_early() -> None:
    """Not exact with seqused_k: the last offset may be below the token count (the check is <=, not ==)."""
    _varlen(seqused_k=torch.tensor([3, 2], dtype=torch.int32), cu_seqlens_k=torch.tensor([0, 3, 6]))


def test_cp_totals_must_be_non_negative() -> None:
    opts = AttnOptions(causal=True, cp=ContextParallel(2, 0))
    with pytest.raises(ValueError, match=r"cp_tot_seqused_k\[1\] must be >= 0, got -1"):
        _varlen(options=opts, cp_tot_seqused_k=[6, -1])


def test_cp_local_len_needs_a_total() -> None:
    with pytest.raises(ValueError, match="cp.total must be set"):
        ContextParallel(2, 1).local_len()
    assert ContextParallel(2, 1).local_len(7) == 3 and ContextParallel(3, 2, total=8).local_len() == 2


def test_window_unbounded() -> None:
    assert Window().unbounded and not Window(0, None).unbounded and not Window(None, 3).unbounded


def test_merge_many_needs_parts_of_one_shape() -> None:
    outs = [torch.zeros(3, 2, 4), torch.zeros(3, 2, 5)]
    lses = [torch.zeros(2, 3), torch.zeros(2, 3)]
    with pytest.raises(ValueError, match=r"part 1: out shape \(3, 2, 5\) differs from part 0 \(3, 2, 4\)"):
        merge_many(outs, lses)
    with pytest.raises(ValueError, match="non-empty and of equal length, got 0 and 0"):
        merge_many([], [])


def test_quant_format_and_dequantize_reject() -> None:
    assert quant_format(torch.float8_e5m2).name == "fp8_e5m2"
    with pytest.raises(ValueError, match="fmt must be one of .* got torch.float16"):
        quant_format(torch.float16)
    with pytest.raises(ValueError, match="xq must be a torch.Tensor, got list"):
        dequantize([1, 2], 1.0)
