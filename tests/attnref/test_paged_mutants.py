"""Promises of attnref.paged that the mutation run (docs "Mutation testing") found unchecked: ``cache_geometry``
reads NHD by default, and a cache, key or value of the wrong kind is refused with a ``ValueError`` that names it
and shows the shape it got (``()`` for an object without one), never an ``AttributeError`` or ``TypeError``."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from attnref import cache_geometry, write_kv_cache

NB, BS, HK, D, DV = 3, 4, 2, 5, 6


def test_cache_geometry_reads_nhd_by_default() -> None:
    cache = torch.zeros(NB, BS, HK, D)
    assert cache_geometry(cache) == (NB, BS, HK, D) == cache_geometry(cache, "NHD")
    assert cache_geometry(cache, "HND") == (NB, HK, BS, D)


@pytest.mark.parametrize(
    "cache, shown",
    [
        (torch.zeros(NB, BS, HK), "(3, 4, 2)"),
        (np.zeros((NB, BS, HK, D)), "(3, 4, 2, 5)"),  # 4-D but no torch.Tensor: its shape is still shown
        ([[0.0]], "()"),
        (None, "()"),
    ],
    ids=["3d", "numpy", "list", "none"],
)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_bad_cache_is_refused_showing_its_shape(cache, shown: str, layout: str) -> None:
    want = rf"^cache must be 4-D \(num_blocks, \.\.\.\) in layout {layout}, got shape {re.escape(shown)}$"
    with pytest.raises(ValueError, match=want):
        cache_geometry(cache, layout)


def _write(**over) -> None:
    args = {
        "key": torch.randn(2, HK, D),
        "value": torch.randn(2, HK, DV),
        "k_cache": torch.zeros(NB, BS, HK, D),
        "v_cache": torch.zeros(NB, BS, HK, DV),
        "slot_mapping": torch.tensor([0, 5]),
    }
    args.update(over)
    write_kv_cache(**args)


def test_base_write_is_valid() -> None:
    _write()


@pytest.mark.parametrize(
    "bad, shown",
    [
        (torch.randn(2, HK * D), "(2, 10)"),
        (torch.randn(2, HK, D + 1), "(2, 2, 6)"),
        (np.zeros((2, HK, D)), "(2, 2, 5)"),
        ([[[0.0] * D] * HK] * 2, "()"),
        (None, "()"),
    ],
    ids=["2d", "wide", "numpy", "list", "none"],
)
def test_bad_key_is_refused_showing_its_shape(bad, shown: str) -> None:
    with pytest.raises(
        ValueError, match=rf"^key must have shape \(n, 2, 5\) to match k_cache, got {re.escape(shown)}$"
    ):
        _write(key=bad)


@pytest.mark.parametrize(
    "bad, shown",
    [
        (torch.randn(2, HK * DV), "(2, 12)"),
        (torch.randn(2, HK, D), "(2, 2, 5)"),
        (np.zeros((2, HK, DV)), "(2, 2, 6)"),
        ([[[0.0] * DV] * HK] * 2, "()"),
        (None, "()"),
    ],
    ids=["2d", "narrow", "numpy", "list", "none"],
)
def test_bad_value_is_refused_showing_its_shape(bad, shown: str) -> None:
    want = rf"^value must have shape \(n, 2, 6\) to match v_cache, got {re.escape(shown)}$"
    with pytest.raises(ValueError, match=want):
        _write(value=bad)
