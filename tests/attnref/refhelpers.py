"""Input builders and the comparison used by the attnref tests (kept apart from the oracle)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from oracle import options_kwargs, oracle_batch

__all__ = ["Packed", "make_packed", "cu", "tolerance", "assert_close_to", "check_against_oracle"]

# (rtol, atol) of the reference against the float64 oracle, per accumulation dtype.  fp64 is pure
# summation-order noise; fp32 is the rounding of O(1) values in a length <= ~1000 reduction.
_TOL = {torch.float64: (1e-10, 1e-10), torch.float32: (1e-5, 2e-5)}


def tolerance(dtype: torch.dtype) -> dict:
    rtol, atol = _TOL[dtype]
    return {"rtol": rtol, "atol": atol}


def cu(lengths: list[int]) -> torch.Tensor:
    """int32 cumulative offsets [0, l0, l0 + l1, ...]."""
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32)


@dataclass
class Packed:
    """Per-sequence tensors and their packed varlen form."""

    qs: list[torch.Tensor]
    ks: list[torch.Tensor]
    vs: list[torch.Tensor]
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    cu_q: torch.Tensor
    cu_k: torch.Tensor


def make_packed(
    gen: torch.Generator,
    lens: list[tuple[int, int]],
    h: int,
    hk: int,
    d: int,
    dv: int | None = None,
    *,
    dtype: torch.dtype = torch.float32,
    q_scale: float = 1.0,
) -> Packed:
    """Random normal sequences with (sq, sk) lengths; ``q_scale`` stretches scores (for soft-caps)."""
    dv = d if dv is None else dv
    qs = [torch.randn(sq, h, d, generator=gen, dtype=torch.float64).to(dtype) * q_scale for sq, _ in lens]
    ks = [torch.randn(sk, hk, d, generator=gen, dtype=torch.float64).to(dtype) for _, sk in lens]
    vs = [torch.randn(sk, hk, dv, generator=gen, dtype=torch.float64).to(dtype) for _, sk in lens]
    return Packed(
        qs,
        ks,
        vs,
        torch.cat(qs, 0) if qs else torch.zeros(0, h, d, dtype=dtype),
        torch.cat(ks, 0) if ks else torch.zeros(0, hk, d, dtype=dtype),
        torch.cat(vs, 0) if vs else torch.zeros(0, hk, dv, dtype=dtype),
        cu([sq for sq, _ in lens]),
        cu([sk for _, sk in lens]),
    )


def assert_close_to(
    out: torch.Tensor, lse: torch.Tensor, want_out: torch.Tensor, want_lse: torch.Tensor, dtype: torch.dtype
) -> None:
    """Output and LSE against expected values at the tolerance of accumulation dtype ``dtype``.

    Infinite LSE entries (fully masked rows) must match exactly, sign included.
    """
    tol = tolerance(dtype)
    assert out.dtype == dtype and lse.dtype == dtype, (out.dtype, lse.dtype, dtype)
    torch.testing.assert_close(out.to(torch.float64), want_out.to(torch.float64), **tol, msg=lambda m: "out: " + m)
    torch.testing.assert_close(lse.to(torch.float64), want_lse.to(torch.float64), **tol, msg=lambda m: "lse: " + m)


def check_against_oracle(result, packed: Packed, options, dtype: torch.dtype, *, alibi=None, sinks=None) -> None:
    """Compare a varlen-layout ``AttnResult`` with the oracle of the same per-sequence tensors."""
    want_out, want_lse = oracle_batch(
        packed.qs, packed.ks, packed.vs, alibi=alibi, sinks=sinks, **options_kwargs(options)
    )
    assert_close_to(result.out, result.lse, want_out, want_lse, dtype)
