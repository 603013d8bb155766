"""Promises of attnref/mask.py that the identity tests left unchecked (mutmut found them: docs "Mutation
testing"): the FA4 spelling's causal default, and the dense mask of plain (not context-parallel) options on
the device asked for."""

from __future__ import annotations

import torch

from attnref import AttnOptions, Window, visible_mask, window_to_fa4


def test_fa4_window_is_not_causal_unless_asked() -> None:
    """``window_to_fa4(window)`` keeps the window's right extent: causality is opt-in, as in FA4's API."""
    assert window_to_fa4(Window(3, 5)) == (3, 5)
    assert window_to_fa4(Window(None, None)) == (None, None)
    assert window_to_fa4(Window(3, 5), causal=True) == (3, 0)


def test_dense_mask_is_bottom_right_aligned() -> None:
    """Row ``i`` of ``sq`` sees key ``j`` of ``sk`` iff ``i + sk - sq - left <= j <= i + sk - sq + right``."""
    causal = [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    assert visible_mask(3, 5, AttnOptions(causal=True)).int().tolist() == causal
    band = [[0, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 0], [0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 1, 1]]
    assert visible_mask(4, 6, AttnOptions(window=Window(1, 1))).int().tolist() == band


def test_dense_mask_is_built_on_the_device_asked_for() -> None:
    """``meta`` stands in for an accelerator on a CPU-only machine: no index tensor may fall back to the CPU."""
    mask = visible_mask(3, 5, AttnOptions(causal=True), device="meta")
    assert mask.device == torch.device("meta") and mask.shape == (3, 5) and mask.dtype == torch.bool
