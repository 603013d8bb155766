"""Bad inputs raise ``ValueError`` whose message names the offending argument.

Every case first builds a valid call (checked to succeed once), then breaks one thing, so a test
passes only because of the broken thing and not because the base call was already invalid.
"""

from __future__ import annotations

import math

import pytest
import torch

from attnref import (
    AttnOptions,
    Numerics,
    Window,
    attention_padded,
    attention_paged,
    attention_varlen,
    gather_kv,
    merge_states,
    to_layout,
    write_kv_cache,
)

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


def _paged(**over):
    args = {
        "q": torch.randn(3, H, D),
        "k_cache": torch.randn(4, 16, HK, D),
        "v_cache": torch.randn(4, 16, HK, D),
        "block_table": torch.tensor([[2, 0], [1, 3]], dtype=torch.int32),
        "seqused_k": torch.tensor([20, 5], dtype=torch.int32),
        "cu_seqlens_q": torch.tensor([0, 1, 3], dtype=torch.int32),
    }
    args.update(over)
    return attention_paged(**args)


def test_base_calls_are_valid() -> None:
    _varlen()
    _paged()


@pytest.mark.parametrize(
    "over, match",
    [
        ({"cu_seqlens_q": torch.tensor([0, 3, 2, 5])}, r"cu_seqlens_q must be non-decreasing"),
        ({"cu_seqlens_q": torch.tensor([1, 2, 5])}, r"cu_seqlens_q must start at 0"),
        (
            {"cu_seqlens_q": torch.tensor([0, 2, 4])},
            r"cu_seqlens_q\[-1\] must equal the number of tokens \(5\)",
        ),
        ({"cu_seqlens_q": torch.tensor([0.0, 2.0, 5.0])}, r"cu_seqlens_q must be an integer tensor"),
        ({"cu_seqlens_q": torch.tensor([[0, 2, 5]])}, r"cu_seqlens_q must be 1-D"),
        ({"cu_seqlens_k": torch.tensor([0, 4, 3])}, r"cu_seqlens_k must be non-decreasing"),
        ({"cu_seqlens_k": torch.tensor([2, 3, 7])}, r"cu_seqlens_k must start at 0"),
        (
            {"cu_seqlens_k": torch.tensor([0, 3, 8])},
            r"cu_seqlens_k\[-1\] must equal the number of tokens \(7\)",
        ),
        ({"cu_seqlens_k": torch.tensor([0, 7])}, r"cu_seqlens_k must have 3 entries"),
        ({"cu_seqlens_k": None}, r"cu_seqlens_k or seqused_k must be given"),
        ({"seqused_k": torch.tensor([3, 5])}, r"seqused_k\[1\] = 5 exceeds the capacity of sequence 1 \(4\)"),
        ({"seqused_k": torch.tensor([-1, 2])}, r"seqused_k\[0\] must be >= 0"),
        ({"seqused_k": torch.tensor([1, 2, 3])}, r"seqused_k must have 2 entries"),
        (
            {
                "cu_seqlens_k": None,
                "seqused_k": torch.tensor([1, 2]),
                "k": torch.randn(7, HK, D),
                "v": torch.randn(7, HK, D),
            },
            r"k must hold batch \* max_seqlen_k tokens",
        ),
        ({"q": torch.randn(5, 5, D)}, r"q heads \(5\) must be a multiple of k/v heads \(2\)"),
        (
            {"k": torch.randn(7, 3, D), "v": torch.randn(7, 3, D)},
            r"q heads \(4\) must be a multiple of k/v heads \(3\)",
        ),
        ({"k": torch.randn(7, HK, D + 1)}, r"k head_dim must equal q head_dim \(8\)"),
        ({"v": torch.randn(6, HK, D)}, r"k and v must agree in every dim but the last"),
        ({"q": torch.randn(5, H, D, 1)}, r"q must have 3 dims"),
        ({"q": torch.ones(5, H, D, dtype=torch.int32)}, r"q must be a floating tensor"),
        ({"k": torch.randn(7, HK, D, dtype=torch.float64)}, r"q, k, v must share one dtype"),
        ({"v": torch.randn(7, HK, D, dtype=torch.bfloat16)}, r"q, k, v must share one dtype"),
        ({"k": torch.randn(7, HK, D, device="meta")}, r"q, k, v must be on one device"),
        ({"sinks": torch.randn(H + 1)}, r"sinks must have shape \(4,\)"),
        ({"sinks": torch.ones(H, dtype=torch.int64)}, r"sinks must be a floating tensor"),
        ({"sinks": torch.tensor([0.0, math.nan, 0.0, 0.0])}, r"sinks must be finite"),
        ({"sinks": torch.randn(H, device="meta")}, r"sinks must be on cpu"),
        ({"alibi_slopes": torch.rand(3, H)}, r"alibi_slopes must have shape \(4,\) or \(2, 4\)"),
        ({"alibi_slopes": torch.rand(HK)}, r"alibi_slopes must have shape"),
        ({"alibi_slopes": torch.ones(H, dtype=torch.int32)}, r"alibi_slopes must be a floating tensor"),
        ({"alibi_slopes": torch.rand(H, device="meta")}, r"alibi_slopes must be on cpu"),
    ],
)
def test_varlen_rejects(over: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _varlen(**over)


@pytest.mark.parametrize(
    "over, match",
    [
        (
            {"block_table": torch.tensor([[2, 4], [1, 3]])},
            r"block_table\[0, 1\] = 4 is outside the cache \(0 <= block < 4\)",
        ),
        ({"block_table": torch.tensor([[2, 0], [-1, 3]])}, r"block_table\[1, 0\] = -1 is outside the cache"),
        (
            {"block_table": torch.tensor([[2], [1]])},
            r"seqused_k\[0\] = 20 needs 2 blocks of 16 but block_table has 1 columns",
        ),
        ({"block_table": torch.tensor([2, 0])}, r"block_table must be a 2-D"),
        ({"block_table": torch.tensor([[2.0, 0.0], [1.0, 3.0]])}, r"block_table must be an integer tensor"),
        ({"block_table": torch.tensor([[2, 0]])}, r"block_table must have 2 rows"),
        ({"seqused_k": torch.tensor([65, 5])}, r"seqused_k\[0\] = 65 exceeds the capacity"),
        ({"seqused_k": torch.tensor([3])}, r"seqused_k must have 2 entries"),
        ({"v_cache": torch.randn(4, 8, HK, D)}, r"k_cache and v_cache must agree"),
        (
            {
                "k_cache": torch.randn(4, 16, HK, D, device="meta"),
                "v_cache": torch.randn(4, 16, HK, D, device="meta"),
            },
            r"q, k_cache, v_cache must be on one device",
        ),
        ({"k_cache": torch.randn(4, 16, HK, D, dtype=torch.float64)}, r"q, k, v must share one dtype"),
        (
            {"k_cache": torch.randn(4, 16, HK, D + 2), "v_cache": torch.randn(4, 16, HK, D)},
            r"k head_dim must equal q head_dim",
        ),
        (
            {"k_cache": torch.randn(4, 16, 3, D), "v_cache": torch.randn(4, 16, 3, D)},
            r"q heads \(4\) must be a multiple of k/v heads \(3\)",
        ),
        ({"k_cache": torch.randn(4, 16, HK)}, r"cache must be 4-D"),
        (
            {"k_cache": torch.randn(3, 4, 16, HK, D), "v_cache": None},
            r"a stacked kv cache must have shape \(2, num_blocks, ...\)",
        ),
        ({"layout": "NDH"}, r"layout must be 'NHD' or 'HND'"),
        ({"cu_seqlens_q": torch.tensor([0, 2, 1])}, r"cu_seqlens_q must be non-decreasing"),
    ],
)
def test_paged_rejects(over: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _paged(**over)


def test_padded_rejects() -> None:
    q, k = torch.randn(2, 3, H, D), torch.randn(2, 5, HK, D)
    attention_padded(q, k, k, seqlens_k=torch.tensor([5, 0]))
    with pytest.raises(ValueError, match=r"seqlens_k\[1\] = 6 exceeds the capacity"):
        attention_padded(q, k, k, seqlens_k=torch.tensor([5, 6]))
    with pytest.raises(ValueError, match=r"k batch \(3\) must equal q batch \(2\)"):
        attention_padded(q, torch.randn(3, 5, HK, D), torch.randn(3, 5, HK, D))
    with pytest.raises(ValueError, match=r"q must have 4 dims"):
        attention_padded(q[0], k, k)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: Window(-1, 0), r"window.left must be >= 0 or None"),
        (lambda: Window(0, -1), r"window.right must be >= 0 or None"),
        (lambda: AttnOptions(window=(-1, -1)), r"window.left must be >= 0"),
        (lambda: Window(1.5, None), r"window.left must be an int or None"),
        (lambda: Window(True, None), r"window.left must be an int or None"),
        (lambda: AttnOptions(window=[3, 0]), r"window must be a Window or a \(left, right\) tuple"),
        (lambda: AttnOptions(causal=True, window=(4, 1)), r"window.right must be None or 0 when causal=True"),
        (lambda: AttnOptions(softcap=0.0), r"softcap must be a positive finite float or None"),
        (lambda: AttnOptions(softcap=-30.0), r"softcap must be a positive finite float"),
        (lambda: AttnOptions(softcap=math.inf), r"softcap must be a positive finite float"),
        (lambda: AttnOptions(softcap=math.nan), r"softcap must be a positive finite float"),
        (lambda: AttnOptions(scale=math.nan), r"scale must be finite"),
        (lambda: AttnOptions(scale=math.inf), r"scale must be finite"),
        (lambda: AttnOptions(chunk=0), r"chunk must be a positive int"),
        (lambda: AttnOptions(chunk=-4), r"chunk must be a positive int"),
        (lambda: AttnOptions(chunk=True), r"chunk must be a positive int"),
        (lambda: Numerics(dtype=torch.float16), r"numerics.dtype must be torch.float32 or torch.float64"),
        (lambda: Numerics(max_tile_elems=0), r"numerics.max_tile_elems must be an int >= 1"),
    ],
)
def test_options_reject(make, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make()


def _write(slots, n: int = 3, layout: str = "NHD", key_shape=None) -> None:
    cache = torch.zeros(2, 2, 4, HK, D) if layout == "NHD" else torch.zeros(2, 2, HK, 4, D)
    key = torch.randn(*(key_shape or (n, HK, D)))
    write_kv_cache(key, torch.randn(n, HK, D), cache[0], cache[1], slots, layout=layout)


@pytest.mark.parametrize(
    "slots, kw, match",
    [
        (torch.tensor([0, 8, 1]), {}, r"slot_mapping\[1\] = 8 is outside the cache \(-1 or 0 <= slot < 8\)"),
        (torch.tensor([0, -2, 1]), {}, r"slot_mapping\[1\] = -2 is outside the cache"),
        (
            torch.tensor([0, 1]),
            {},
            r"slot_mapping \(2\), key \(3\) and value \(3\) must have one entry per token",
        ),
        (torch.tensor([0.0, 1.0, 2.0]), {}, r"slot_mapping must be an integer tensor"),
        (torch.tensor([[0, 1, 2]]), {}, r"slot_mapping must be 1-D"),
        (torch.tensor([0, 1, 2]), {"key_shape": (3, HK, D + 1)}, r"key must have shape \(n, 2, 8\)"),
        (torch.tensor([0, 1, 2]), {"layout": "HDN"}, r"layout must be 'NHD' or 'HND'"),
    ],
)
def test_write_kv_cache_rejects(slots, kw: dict, match: str) -> None:
    _write(torch.tensor([0, -1, 7]))
    with pytest.raises(ValueError, match=match):
        _write(slots, **kw)


def test_gather_merge_layout_reject() -> None:
    cache = torch.randn(4, 16, HK, D)
    table = torch.tensor([[1, 2]])
    gather_kv(cache, table, [20])
    with pytest.raises(ValueError, match=r"seqlens\[0\] must be >= 0"):
        gather_kv(cache, table, [-5])
    with pytest.raises(ValueError, match=r"block_table\[0, 1\] = 9 is outside"):
        gather_kv(cache, torch.tensor([[1, 9]]), [20])
    out, lse = torch.zeros(3, H, D), torch.zeros(H, 3)
    with pytest.raises(ValueError, match=r"part 1: out must be \(n, h, dv\) and lse \(h, n\)"):
        merge_states(out, lse, out, lse.T)
    with pytest.raises(ValueError, match=r"part 1: out shape \(2, 4, 8\) differs from part 0"):
        merge_states(out, lse, out[:2], lse[:, :2])
    with pytest.raises(ValueError, match=r"layout must be 'NHD' or 'HND'"):
        to_layout(cache, "NHD", "nhd")


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: AttnOptions(softcap="x"), "softcap must be a number"),
        (lambda: AttnOptions(scale="y"), "scale must be a number"),
        (lambda: Numerics(max_tile_elems=1.5), "max_tile_elems must be an int >= 1"),
    ],
)
def test_option_types_are_value_errors(make, message) -> None:
    with pytest.raises(ValueError, match=message):
        make()
