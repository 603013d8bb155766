"""Promises of attnref.mla's helpers and refusals beyond test_mla.py (mutmut found them unchecked: docs
"Mutation testing"): dims of 1 are valid, ``split_latent`` names ``x`` by default, ``join_latent`` refuses exactly
an empty last dim (whatever the rank) and says which, and the refusals of a bad q, a kv on another device and a
kv with several heads say what was expected, naming the layout only where there is one."""

from __future__ import annotations

import pytest
import torch

from attnref.mla import attention_mla_paged, attention_mla_varlen, join_latent, split_latent


def test_dims_of_one_are_valid() -> None:
    x = torch.arange(6.0).reshape(3, 2)
    latent, rope = split_latent(x, 1, 1)
    assert latent.tolist() == [[0.0], [2.0], [4.0]] and rope.tolist() == [[1.0], [3.0], [5.0]]


def test_split_latent_names_x_by_default() -> None:
    with pytest.raises(ValueError, match=r"^x last dim must be > latent_dim = 4 "):
        split_latent(torch.zeros(2, 4), 4)
    with pytest.raises(ValueError, match=r"^x last dim must be latent_dim \+ rope_dim = 4 \+ 2 = 6, got 5$"):
        split_latent(torch.zeros(2, 5), 4, 2)


@pytest.mark.parametrize(
    ("latent_shape", "rope_shape"),
    [((4,), (2,)), ((2, 3, 4), (2, 3, 1)), ((2, 0, 4), (2, 0, 3))],
    ids=["1d", "rope_width_1", "no_rows"],
)
def test_join_latent_accepts_any_positive_widths(latent_shape, rope_shape) -> None:
    latent, rope = torch.randn(latent_shape), torch.randn(rope_shape)
    joined = join_latent(latent, rope)
    assert tuple(joined.shape) == latent_shape[:-1] + (latent_shape[-1] + rope_shape[-1],)
    assert torch.equal(joined[..., : latent_shape[-1]], latent) and torch.equal(joined[..., latent_shape[-1] :], rope)


@pytest.mark.parametrize(("latent_w", "rope_w"), [(0, 4), (4, 0)], ids=["empty_latent", "empty_rope"])
def test_join_latent_refuses_an_empty_last_dim_and_says_which(latent_w: int, rope_w: int) -> None:
    """Rank 3 with 3 rows per leading index: the message shows the last dims, not the middle one."""
    with pytest.raises(ValueError, match=rf"^latent and rope last dims must be positive, got {latent_w} and {rope_w}$"):
        join_latent(torch.zeros(2, 3, latent_w), torch.zeros(2, 3, rope_w))


def test_bad_q_rank_names_the_expected_width() -> None:
    kv, cu = torch.zeros(3, 1, 6), torch.tensor([0, 3], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"^q must have 3 dims \(total_q, heads, latent_dim \+ rope_dim = 6\), got"):
        attention_mla_varlen(torch.zeros(3, 6), kv, cu, cu, latent_dim=4, rope_dim=2)


def test_kv_on_another_device_is_refused_naming_both_devices() -> None:
    q, kv = torch.zeros(3, 2, 6), torch.zeros(3, 1, 6, device="meta")
    cu = torch.tensor([0, 3], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"^kv must be on q's device cpu, got meta$"):
        attention_mla_varlen(q, kv, cu, cu, latent_dim=4, rope_dim=2)


def test_kv_with_two_heads_is_refused_without_a_layout_in_varlen() -> None:
    q, kv, cu = torch.zeros(3, 2, 6), torch.zeros(3, 2, 6), torch.tensor([0, 3], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"kv must have 1 kv head .*, got 2, shape \(3, 2, 6\)$") as info:
        attention_mla_varlen(q, kv, cu, cu, latent_dim=4, rope_dim=2)
    assert "layout" not in str(info.value)


def test_kv_cache_with_two_heads_names_its_layout() -> None:
    q, cache = torch.zeros(3, 2, 6), torch.zeros(2, 4, 2, 6)
    cu, table = torch.tensor([0, 3], dtype=torch.int32), torch.tensor([[0]], dtype=torch.int32)
    want = r"kv_cache must have 1 kv head .*, got 2 in layout NHD, shape \(2, 4, 2, 6\)$"
    with pytest.raises(ValueError, match=want):
        attention_mla_paged(q, cache, table, torch.tensor([3]), cu, latent_dim=4, rope_dim=2)
