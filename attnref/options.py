"""Small frozen option objects shared by every reference entry point.

Window spelling (the one internal convention of this package)
------------------------------------------------------------
``Window(left, right)`` with ``None`` meaning *unbounded* and non-negative integers meaning
a literal extent.  For one sequence with ``sq`` queries and ``sk`` keys, query row ``i``
(0-based inside the sequence) may attend key ``j`` iff::

    i + sk - sq - left  <=  j  <=  i + sk - sq + right

(bottom-right aligned, ``../shared/SEMANTICS.md`` section 2).  ``causal=True`` is the same as
``right=0``.  This is FA4's spelling; FA2/FA3 write "unbounded" as ``-1`` and adapters convert
(:func:`attnref.mask.window_from_fa2`).  Negative values are rejected here: the meaning of
``-1`` differs between libraries, so this package never guesses it.

Chunked local attention (FA3 ``attention_chunk``, Llama-4 style) is ``chunk=C``: with
``p = i + sk - sq`` the row sees keys in ``[p - p % C, p - p % C + C)``, intersected with the
causal/window range.

Context parallelism (vLLM's FA3 fork: ``cp_world_size``, ``cp_rank``, ``cp_tot_seqused_k``) is
``cp=ContextParallel(world, rank, total)``: the call holds only one rank's interleave-1 shard of a
sequence of ``total`` keys, local key ``j`` being absolute key ``a = j * world + rank``, and row ``i``
(of ``sq``) sees local key ``j`` iff ``a <= i + total - sq`` and ``a < total``: the causal rule in
absolute positions.  The kernel applies it in its causal mask only, so ``cp`` needs ``causal=True``
and neither a window nor a chunk.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch

__all__ = ["AttnOptions", "ContextParallel", "Numerics", "Window"]


@dataclass(frozen=True)
class Window:
    """Visible key range around the (bottom-right aligned) diagonal; ``None`` = unbounded."""

    left: int | None = None
    right: int | None = None

    def __post_init__(self) -> None:
        for name in ("left", "right"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"window.{name} must be an int or None (unbounded), got {value!r}")
            if value < 0:
                raise ValueError(
                    f"window.{name} must be >= 0 or None (unbounded), got {value}; "
                    "use attnref.mask.window_from_fa2 to convert FA2/FA3's -1 spelling"
                )

    @property
    def unbounded(self) -> bool:
        return self.left is None and self.right is None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class ContextParallel:
    """One rank's key shard under context parallelism (see the module docstring).

    Attributes:
        world: ranks the sequence's keys are spread over (``cp_world_size``), >= 2.
        rank: this call's rank (``cp_rank``), ``0 <= rank < world``.
        total: the sequence's keys over all ranks (``cp_tot_seqused_k[b]``); None in a batch-level option,
            whose entry points take the totals per sequence (``attention_varlen(cp_tot_seqused_k=...)``).
    """

    world: int
    rank: int
    total: int | None = None

    def __post_init__(self) -> None:
        if not _is_int(self.world) or self.world < 2:
            raise ValueError(
                f"cp.world must be an int >= 2, got {self.world!r} (a world of 1 is no context parallelism: cp=None)"
            )
        if not _is_int(self.rank) or not 0 <= self.rank < self.world:
            raise ValueError(f"cp.rank must be an int in [0, {self.world}), got {self.rank!r}")
        if self.total is not None and (not _is_int(self.total) or self.total < 0):
            raise ValueError(f"cp.total must be an int >= 0 or None, got {self.total!r}")

    def local_len(self, total: int | None = None) -> int:
        """Keys of a ``total``-key sequence (default ``self.total``) this rank holds: ``#{a < total: a % world ==
        rank}``."""
        t = self.total if total is None else total
        if t is None:
            raise ValueError("cp.total must be set (the sequence's keys over all ranks)")
        return max(0, -(-(t - self.rank) // self.world))

    def with_total(self, total: int) -> "ContextParallel":
        return replace(self, total=total)


@dataclass(frozen=True)
class AttnOptions:
    """What the score function does besides ``q.k``; tensors (ALiBi slopes, sinks) travel separately.

    Attributes:
        causal: restrict to keys at or before the bottom-right aligned diagonal (``right = 0``).
        window: sliding window, see the module docstring.  Combined with ``causal`` the right
            extent must be ``None`` or ``0``.
        softcap: ``cap * tanh(s / cap)`` applied to scaled scores before masking; ``None`` = off.
        scale: softmax scale; ``None`` = ``1/sqrt(d)``.
        chunk: chunked local attention size (keys of the same chunk only); ``None`` = off.
        cp: context parallelism, the call's keys being one rank's shard (:class:`ContextParallel`, or a
            ``(world, rank)`` / ``(world, rank, total)`` tuple); ``None`` = off.  Needs ``causal`` and no
            window or chunk.
    """

    causal: bool = False
    window: Window = field(default_factory=Window)
    softcap: float | None = None
    scale: float | None = None
    chunk: int | None = None
    cp: ContextParallel | None = None

    def __post_init__(self) -> None:
        if isinstance(self.cp, tuple):  # convenience: AttnOptions(causal=True, cp=(2, 1, 17))
            object.__setattr__(self, "cp", ContextParallel(*self.cp))
        if self.cp is not None and not isinstance(self.cp, ContextParallel):
            raise ValueError(f"cp must be a ContextParallel, a (world, rank[, total]) tuple or None, got {self.cp!r}")
        if isinstance(self.window, tuple):  # convenience: AttnOptions(window=(128, 0))
            object.__setattr__(self, "window", Window(*self.window))
        if not isinstance(self.window, Window):
            raise ValueError(f"window must be a Window or a (left, right) tuple, got {self.window!r}")
        if self.causal and self.window.right not in (None, 0):
            raise ValueError(
                f"window.right must be None or 0 when causal=True (causal means right=0), got {self.window.right}"
            )
        for name in ("softcap", "scale"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise ValueError(f"{name} must be a number or None, got {value!r}")
        if self.softcap is not None and not (self.softcap > 0 and math.isfinite(self.softcap)):
            raise ValueError(f"softcap must be a positive finite float or None (off), got {self.softcap!r}")
        if self.scale is not None and not math.isfinite(self.scale):
            raise ValueError(f"scale must be finite or None (1/sqrt(d)), got {self.scale!r}")
        if self.chunk is not None and (
            isinstance(self.chunk, bool) or not isinstance(self.chunk, int) or self.chunk <= 0
        ):
            raise ValueError(f"chunk must be a positive int or None (off), got {self.chunk!r}")
        if self.cp is not None and (not self.causal or self.window.left is not None or self.chunk is not None):
            raise ValueError(
                "cp needs causal=True and no window or chunk (the kernel applies cp_* in its causal mask only), "
                f"got causal={self.causal}, window={self.window}, chunk={self.chunk}"
            )

    @property
    def left(self) -> int | None:
        return self.window.left

    @property
    def right(self) -> int | None:
        return 0 if self.causal else self.window.right

    def with_(self, **changes) -> "AttnOptions":
        return replace(self, **changes)


@dataclass(frozen=True)
class Numerics:
    """How the reference computes: accumulation dtype and the tile budget.

    ``max_tile_elems`` bounds the number of score elements (heads x query rows x keys) held at
    once, so memory is O(budget + s * h * d) instead of O(s^2).
    """

    dtype: torch.dtype = torch.float32
    max_tile_elems: int = 1 << 22

    def __post_init__(self) -> None:
        if self.dtype not in (torch.float32, torch.float64):
            raise ValueError(f"numerics.dtype must be torch.float32 or torch.float64, got {self.dtype}")
        if isinstance(self.max_tile_elems, bool) or not isinstance(self.max_tile_elems, int) or self.max_tile_elems < 1:
            raise ValueError(f"numerics.max_tile_elems must be an int >= 1, got {self.max_tile_elems!r}")


FP64 = Numerics(dtype=torch.float64)
