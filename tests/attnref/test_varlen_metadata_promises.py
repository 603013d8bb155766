"""Promises of attnref/varlen.py's metadata handling the other tests left unchecked (mutmut found them: docs
"Mutation testing"): keys given by ``seqused_k`` alone, a batch of one or none, and refusals that name the
argument at fault in one whole line."""

from __future__ import annotations

import re

import pytest
import torch

from attnref import AttnOptions
from attnref.varlen import cp_sequence_options, sequence_spans


def test_seqused_k_alone_splits_the_keys_evenly_also_for_one_sequence() -> None:
    """With only ``seqused_k``, k holds ``batch * max_seqlen_k`` tokens: sequence ``b`` starts at ``b * width``."""
    assert sequence_spans(6, 1, None, torch.tensor([4], dtype=torch.int32)) == [(0, 4)]
    assert sequence_spans(6, 2, None, torch.tensor([3, 1], dtype=torch.int32)) == [(0, 3), (3, 1)]


def test_seqused_k_alone_with_no_sequence_is_refused() -> None:
    message = "k must hold batch * max_seqlen_k tokens when only seqused_k is given; got 0 tokens for batch 0"
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        sequence_spans(0, 0, None, torch.tensor([], dtype=torch.int32))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: sequence_spans(4, 1, None, None), "cu_seqlens_k or seqused_k must be given"),
        (
            lambda: cp_sequence_options(AttnOptions(causal=True, cp=(2, 0, 8)), [4], [8]),
            "give the totals either as options.cp.total or as cp_tot_seqused_k, not both",
        ),
        (
            lambda: cp_sequence_options(AttnOptions(causal=True, cp=(2, 0)), [4], [8.0]),
            "cp_tot_seqused_k must hold integers, got [8.0]",
        ),
    ],
    ids=["no-keys", "totals-twice", "float-totals"],
)
def test_refusals_name_the_argument(call, message: str) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        call()
