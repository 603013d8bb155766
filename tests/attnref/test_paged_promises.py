"""Promises of attnref.paged.gather_kv and attnref.quant.expand_descale beyond test_identities.py and
test_quant.py (mutmut found them unchecked: docs "Mutation testing"): a bad ``seqlens`` is refused naming
``seqlens``, ``cu_seqlens`` is int32 as the docstring says, an empty batch gives an empty ``(0, hk, d)`` copy in
either layout, and ``expand_descale`` refuses a bool count and names the type of a non-tensor scale."""

from __future__ import annotations

import pytest
import torch

from attnref import gather_kv
from attnref.paged import as_layout
from attnref.quant import expand_descale


def _cache(layout: str, nb: int = 3, bs: int = 4, hk: int = 2, d: int = 5) -> torch.Tensor:
    shape = (nb, bs, hk, d) if layout == "NHD" else (nb, hk, bs, d)
    return torch.randn(shape, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("bad", [[1.5], torch.tensor([1.0]), torch.tensor([[1]])], ids=["floats", "float_t", "2d"])
def test_bad_seqlens_is_refused_naming_seqlens(bad) -> None:
    with pytest.raises(ValueError, match=r"^seqlens must "):
        gather_kv(_cache("NHD"), torch.zeros(1, 1, dtype=torch.int32), bad)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_cu_seqlens_is_int32_running_sum(layout: str) -> None:
    cache = _cache(layout)
    keys, cu = gather_kv(cache, torch.tensor([[2, 0], [1, 2]], dtype=torch.int32), [5, 3], layout)
    assert cu.dtype == torch.int32 and cu.tolist() == [0, 5, 8]
    assert tuple(keys.shape) == (8, 2, 5)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_empty_batch_gives_an_empty_copy_of_shape_0_hk_d(layout: str) -> None:
    """block_size 4, hk 2, d 5: the empty copy is (0, hk, d) = (0, 2, 5) in both layouts."""
    cache = _cache(layout)
    keys, cu = gather_kv(cache, torch.zeros(0, 1, dtype=torch.int32), [], layout)
    assert tuple(keys.shape) == (0, 2, 5) and keys.dtype == cache.dtype
    assert cu.dtype == torch.int32 and cu.tolist() == [0]


@pytest.mark.parametrize("arg", ["batch", "num_kv_heads"])
def test_expand_descale_refuses_a_bool_count(arg: str) -> None:
    counts = {"batch": 2, "num_kv_heads": 3, arg: True}
    with pytest.raises(ValueError, match=rf"^{arg} must be an int >= [01], got True"):
        expand_descale(torch.tensor(1.0), counts["batch"], counts["num_kv_heads"])


def test_expand_descale_names_the_type_of_a_non_tensor_scale() -> None:
    with pytest.raises(ValueError, match=r"^k_descale must be a torch.Tensor, got list$"):
        expand_descale([1.0], 2, 1, name="k_descale")
    with pytest.raises(ValueError, match=r"^descale must be a torch.Tensor, got float$"):
        expand_descale(0.5, 2, 1)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_as_layout_returns_a_paged_layout_unchanged(layout: str) -> None:
    assert as_layout(layout) == layout


@pytest.mark.parametrize("bad", ["contiguous", "nhd", "NDH", ""])
def test_as_layout_refuses_anything_else_naming_it(bad: str) -> None:
    with pytest.raises(ValueError, match=rf"^layout must be 'NHD' or 'HND', got {bad!r}$"):
        as_layout(bad)
