"""The online softmax's ``-inf`` guard (attnref/core.py), where plain-causal tests cannot see it.

Key tiles of a query tile start at the smallest first-visible key of its rows.  A row whose visible
keys start a whole key tile later sees only ``-inf`` scores in that first tile; without the guard
``m_safe = 0 where the running max is -inf``, ``exp(-inf - -inf)`` is NaN, the running sum stays NaN
and the row comes out 0 with LSE ``-inf`` instead of its attention (issue 17: up to 3.3 off at 2,048
keys with a window or a chunk).  Plain causal never builds such a row: every row sees key 0.

Two geometries reach that path:

* the real one: :func:`attnref.core.tile_shape` caps key tiles at 1,024 keys, so at the default tile
  budget a query tile holds every row of a 1,100-row sequence while its keys come in two tiles, and a
  window or chunk puts the first visible key of the late rows past key 1,024;
* small tiles forced by patching ``tile_shape`` (16 rows x 4 keys), which builds the same rows at
  tens of keys with every feature combined (GQA, ALiBi, soft-cap, sinks).

Both are checked against the independent float64 oracle (tests/attnref/oracle.py).
"""

from __future__ import annotations

import pytest
import torch
from refhelpers import check_against_oracle, make_packed

import attnref.core as core
from attnref import AttnOptions, Numerics, attention_varlen
from attnref.mask import row_bounds

DTYPES = [torch.float32, torch.float64]
LONG = 1100  # > 1,024 keys: two key tiles at the default budget, one query tile for all rows

#: Masks whose late rows start past key 1,024 at LONG keys (the default-budget geometry).
LONG_MASKS = {
    "window_causal": AttnOptions(causal=True, window=(8, 0)),
    "window_symmetric": AttnOptions(window=(8, 8)),
    "chunk": AttnOptions(causal=True, chunk=64),
}
#: The same kinds of mask at the scale of 16-row x 4-key tiles.
SMALL_MASKS = {
    "window_causal": AttnOptions(causal=True, window=(3, 0)),
    "window_symmetric": AttnOptions(window=(3, 3)),
    "chunk": AttnOptions(causal=True, chunk=8),
    "chunk_window": AttnOptions(causal=True, window=(5, 0), chunk=12),
}


def _late_rows(sq: int, sk: int, options: AttnOptions, tq: int, tk: int) -> int:
    """Rows whose visible keys all lie past the first key tile of their query tile (the guarded case)."""
    lo, hi = row_bounds(torch.arange(sq), sq, sk, options)
    late = 0
    for q0 in range(0, sq, tq):
        span_lo = int(lo[q0 : q0 + tq].min())
        rows = slice(q0, q0 + tq)
        late += int(((lo[rows] >= span_lo + tk) & (hi[rows] > lo[rows])).sum())
    return late


@pytest.mark.parametrize("mask", sorted(LONG_MASKS))
def test_rows_starting_past_the_first_key_tile_at_the_default_budget(mask: str) -> None:
    options, dtype = LONG_MASKS[mask], torch.float32
    numerics = Numerics(dtype)  # the default: fp32, 1 << 22 scores per tile
    h, hk, d = 2, 1, 8
    tq, tk = core.tile_shape(LONG, LONG, h, numerics.max_tile_elems)
    assert (tq, tk) == (LONG, 1024)  # the geometry this test relies on
    assert _late_rows(LONG, LONG, options, tq, tk) > 0
    p = make_packed(torch.Generator().manual_seed(17), [(LONG, LONG)], h, hk, d, dtype=dtype)
    res = attention_varlen(p.q, p.k, p.v, p.cu_q, p.cu_k, options=options, numerics=numerics)
    assert torch.isfinite(res.lse).all()  # every row of these masks sees at least one key
    check_against_oracle(res, p, options, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp64"])
@pytest.mark.parametrize("mask", sorted(SMALL_MASKS))
def test_rows_starting_past_the_first_key_tile_with_small_tiles(
    mask: str, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    options = SMALL_MASKS[mask]
    tq, tk = 16, 4
    monkeypatch.setattr(core, "tile_shape", lambda sq, sk, heads, budget: (min(tq, max(sq, 1)), tk))
    lens = [(40, 40), (13, 60), (1, 20)]
    assert sum(_late_rows(sq, sk, options, tq, tk) for sq, sk in lens) > 0
    gen = torch.Generator().manual_seed(29)
    h, hk, d = 4, 2, 8
    p = make_packed(gen, lens, h, hk, d, dtype=dtype, q_scale=3.0)
    alibi = torch.rand(h, generator=gen, dtype=torch.float64).to(dtype)
    sinks = torch.randn(h, generator=gen, dtype=torch.float64).to(dtype)
    capped = options.with_(softcap=5.0)
    for opts, kw in ((options, {}), (capped, {"alibi_slopes": alibi, "sinks": sinks})):
        res = attention_varlen(p.q, p.k, p.v, p.cu_q, p.cu_k, options=opts, numerics=Numerics(dtype), **kw)
        check_against_oracle(res, p, opts, dtype, alibi=kw.get("alibi_slopes"), sinks=kw.get("sinks"))
