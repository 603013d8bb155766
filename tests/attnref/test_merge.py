"""attnref.merge_states / merge_many: numerically safe at large LSEs, and the empty-part rule (issue 17).

* fp32 LSEs of +-100 to +-1000 (``exp`` overflows fp32 past 88.7, fp64 past 709.8) merge to what the
  float64 formula of the same values gives; a merge that exponentiates unshifted LSEs overflows here.
* an empty part has LSE ``-inf`` and weight 0; ``+inf`` (FA2's spelling of an empty part) and NaN are
  rejected with a ``ValueError`` naming the part and the position, by merge_states and merge_many alike.
* the compute dtype is fp64 if any part's LSE is fp64, else fp32.
"""

from __future__ import annotations

import math

import pytest
import torch

from attnref import merge_many, merge_states


def _parts(p: int, n: int = 7, h: int = 3, dv: int = 5, *, center: float = 0.0, spread: float = 3.0, seed: int = 0):
    """``p`` partial results: outs (n, h, dv) and lses (h, n) fp32 around ``center``."""
    gen = torch.Generator().manual_seed(seed)
    outs = [torch.randn(n, h, dv, generator=gen) for _ in range(p)]
    lses = [center + spread * torch.randn(h, n, generator=gen) for _ in range(p)]
    return outs, lses


def _merge_fp64(outs, lses):
    """The merge formula in float64 with an explicit max shift, written out here (not attnref's code)."""
    lse = torch.stack([x.double() for x in lses])  # (p, h, n)
    top = lse.amax(dim=0)
    w = torch.exp(lse - top)  # every weight in (0, 1]
    denom = w.sum(dim=0)
    total = top + torch.log(denom)
    out = sum(o.double() * (wi / denom).transpose(0, 1)[..., None] for o, wi in zip(outs, w))
    return out, total


@pytest.mark.parametrize("center", [100.0, -100.0, 300.0, 1000.0, -1000.0])
@pytest.mark.parametrize("p", [2, 3])
def test_fp32_merge_of_large_lses_matches_fp64(center: float, p: int) -> None:
    outs, lses = _parts(p, center=center, seed=int(abs(center)) + p)
    want_out, want_lse = _merge_fp64(outs, lses)
    got = merge_many(outs, lses) if p != 2 else merge_states(outs[0], lses[0], outs[1], lses[1])
    assert got.out.dtype == torch.float32 and got.lse.dtype == torch.float32
    assert torch.isfinite(got.out).all() and torch.isfinite(got.lse).all()
    # fp32 LSEs near 1000 carry 6e-5 of rounding: weights agree to that relative error
    torch.testing.assert_close(got.lse.double(), want_lse, rtol=1e-6, atol=1e-4)
    torch.testing.assert_close(got.out.double(), want_out, rtol=2e-4, atol=2e-4)


def test_merge_of_far_apart_lses_keeps_the_dominant_part() -> None:
    """LSEs 2,000 apart: the smaller part's weight underflows to exactly 0, the result is the larger part."""
    outs, lses = _parts(2)
    lses = [lses[0] + 1000.0, lses[1] - 1000.0]
    got = merge_states(outs[0], lses[0], outs[1], lses[1])
    torch.testing.assert_close(got.out, outs[0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got.lse, lses[0], rtol=0, atol=1e-4)


def test_merge_of_equal_large_lses_averages() -> None:
    outs, lses = _parts(2)
    same = torch.full_like(lses[0], 500.0)
    got = merge_states(outs[0], same, outs[1], same)
    torch.testing.assert_close(got.out, (outs[0] + outs[1]) / 2, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got.lse, same + math.log(2), rtol=0, atol=1e-4)


def test_an_empty_part_has_weight_zero() -> None:
    outs, lses = _parts(3)
    lses[1][:, ::2] = -math.inf  # part 1 saw no key on every other row
    outs[1][::2] = 0
    got = merge_many(outs, lses)
    want_out, want_lse = _merge_fp64([outs[0], outs[2]], [lses[0], lses[2]])
    torch.testing.assert_close(got.out[::2].double(), want_out[::2], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got.lse[:, ::2].double(), want_lse[:, ::2], rtol=1e-6, atol=1e-6)
    # only one part with keys: exactly that part
    only = merge_states(torch.zeros_like(outs[0]), torch.full_like(lses[0], -math.inf), outs[0], lses[0])
    assert torch.equal(only.out, outs[0]) and torch.equal(only.lse, lses[0])


def test_rows_empty_in_every_part_stay_zero_with_minus_inf() -> None:
    outs, lses = _parts(3)
    for i in range(3):
        lses[i][1, 4] = -math.inf
        outs[i][4, 1] = 0
    got = merge_many(outs, lses)
    assert torch.isneginf(got.lse[1, 4]) and (got.out[4, 1] == 0).all()
    assert torch.isfinite(got.out).all()
    assert int(torch.isneginf(got.lse).sum()) == 1


@pytest.mark.parametrize("bad", [math.inf, math.nan], ids=["+inf", "nan"])
@pytest.mark.parametrize("part", [0, 1])
def test_merge_states_rejects_plus_inf_and_nan(bad: float, part: int) -> None:
    """FA2's +inf for an empty part must be normalised by the caller; silently returning 0 dropped the other part."""
    outs, lses = _parts(2)
    lses[part][2, 5] = bad
    lses[part][0, 1] = bad
    message = rf"lses\[{part}\] must be finite or -inf .* at \(head 0, token 1\) in 2 entries"
    with pytest.raises(ValueError, match=message):
        merge_states(outs[0], lses[0], outs[1], lses[1])


@pytest.mark.parametrize("bad", [math.inf, math.nan], ids=["+inf", "nan"])
def test_merge_many_rejects_plus_inf_and_nan_in_any_part(bad: float) -> None:
    outs, lses = _parts(4)
    lses[3][1, 0] = bad
    with pytest.raises(ValueError, match=r"lses\[3\] must be finite or -inf"):
        merge_many(outs, lses)


def test_normalised_fa2_lse_merges_as_empty() -> None:
    """The documented normalisation of FA2's +inf gives what the -inf spelling gives."""
    outs, lses = _parts(2)
    fa2 = lses[0].clone()
    fa2[:, 3] = math.inf
    outs[0][3] = 0
    normalised = torch.where(torch.isposinf(fa2), -torch.inf, fa2)
    got = merge_states(outs[0], normalised, outs[1], lses[1])
    torch.testing.assert_close(got.out[3], outs[1][3])
    torch.testing.assert_close(got.lse[:, 3], lses[1][:, 3])


@pytest.mark.parametrize(
    "dtypes, want",
    [
        ((torch.float32, torch.float32), torch.float32),
        ((torch.float64, torch.float64), torch.float64),
        ((torch.float32, torch.float64), torch.float64),
        ((torch.bfloat16, torch.float16), torch.float32),
    ],
)
def test_compute_dtype(dtypes: tuple[torch.dtype, torch.dtype], want: torch.dtype) -> None:
    outs, lses = _parts(2)
    lses = [x.to(dt) for x, dt in zip(lses, dtypes)]
    got = merge_states(outs[0].double(), lses[0], outs[1], lses[1])
    assert got.out.dtype == want and got.lse.dtype == want
    want_out, want_lse = _merge_fp64(outs, lses)
    tol = 1e-12 if want == torch.float64 else 1e-5
    torch.testing.assert_close(got.lse.double(), want_lse, rtol=tol, atol=tol)
    torch.testing.assert_close(got.out.double(), want_out, rtol=tol, atol=tol)
