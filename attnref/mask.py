"""The visibility rule: which keys a query row may see, and conversions between window spellings.

One rule for every kernel generation (``../shared/SEMANTICS.md`` section 2): with ``sq`` queries,
``sk`` keys and ``p = i + sk - sq`` (the row's diagonal position), row ``i`` sees key ``j`` iff::

    p - left <= j <= p + right            (None = unbounded on that side; causal: right = 0)
    c0 <= j < c0 + chunk                  (only with chunk; c0 = p - p mod chunk, floor modulo)

With context parallelism (``options.cp``, vLLM's FA3 fork's ``cp_world_size`` / ``cp_rank`` /
``cp_tot_seqused_k``) the ``sk`` keys are one rank's shard of a sequence of ``T = cp.total`` keys, local key
``j`` being absolute key ``a = j * world + rank``, and the causal rule holds in absolute positions::

    a <= i + T - sq   and   a < T

Since ``a`` grows with ``j`` the visible keys are still a prefix: ``j < floor((i + T - sq - rank) / world) + 1``.

The helpers here return half-open per-row bounds ``[lo, hi)`` clamped to ``[0, sk]``; a row with
``lo >= hi`` is fully masked.
"""

from __future__ import annotations

import torch

from .options import AttnOptions, Window

__all__ = ["row_bounds", "visible_mask", "window_from_fa2", "window_to_fa2", "window_to_fa4"]


def row_bounds(rows: torch.Tensor, sq: int, sk: int, options: AttnOptions) -> tuple[torch.Tensor, torch.Tensor]:
    """Half-open key bounds ``[lo, hi)`` (int64, clamped to ``[0, sk]``) for the given query rows."""
    if options.cp is not None:
        cp = options.cp
        if cp.total is None:
            raise ValueError("options.cp.total must be set for one sequence (its keys over all ranks)")
        diagonal = rows.to(torch.int64) + (cp.total - sq)  # the row's last visible absolute key
        hi = torch.div(diagonal - cp.rank, cp.world, rounding_mode="floor") + 1
        hi = torch.minimum(hi, torch.full_like(hi, cp.local_len()))
        return torch.zeros_like(hi), hi.clamp(0, sk)
    pos = rows.to(torch.int64) + (sk - sq)
    lo = torch.zeros_like(pos) if options.left is None else pos - options.left
    hi = torch.full_like(pos, sk) if options.right is None else pos + options.right + 1
    if options.chunk is not None:
        start = pos - torch.remainder(pos, options.chunk)
        lo = torch.maximum(lo, start)
        hi = torch.minimum(hi, start + options.chunk)
    # no mutate: for a query row i < sq, lo <= p = i + sk - sq <= sk - 1 (left >= 0, a chunk starts at or before p),
    # so the upper clamp of lo never bites; only lo's lower clamp and hi's clamps change a result
    lo = lo.clamp(0, sk)  # pragma: no mutate
    return lo, hi.clamp(0, sk)


def visible_mask(sq: int, sk: int, options: AttnOptions, device: torch.device | str = "cpu") -> torch.Tensor:
    """Dense boolean (sq, sk) mask; for tests and small cases (the reference itself never builds it)."""
    lo, hi = row_bounds(torch.arange(sq, device=device), sq, sk, options)
    j = torch.arange(sk, device=device)
    return (j[None, :] >= lo[:, None]) & (j[None, :] < hi[:, None])


def window_from_fa2(left: int, right: int) -> Window:
    """FA2/FA3 spelling (negative = unbounded) to :class:`Window`."""
    return Window(None if left < 0 else left, None if right < 0 else right)


def window_to_fa2(window: Window) -> tuple[int, int]:
    """:class:`Window` to FA2/FA3's ``window_size`` tuple (``-1`` = unbounded).

    Causality travels in the kernels' separate ``causal`` flag, as engines pass it (vLLM:
    ``causal=True, window_size=(-1, -1)``); the kernels set ``right = 0`` themselves, *after*
    dropping causality for ``seqlen_q == 1``.  Spelling causal as ``(-1, 0)`` instead gives the same
    numbers but disables FA2's GQA query packing for decode (``seqlenq_ngroups_swapped`` in
    ``flash_api.cpp`` needs ``right < 0``): measured 6-10x slower paged decode on an H200.
    """
    left = -1 if window.left is None else window.left
    right = -1 if window.right is None else window.right
    return left, right


def window_to_fa4(window: Window, causal: bool = False) -> tuple[int | None, int | None]:
    """:class:`Window` to FA4's ``window_size`` tuple (``None`` = unbounded, negatives are literal)."""
    return window.left, (0 if causal else window.right)
