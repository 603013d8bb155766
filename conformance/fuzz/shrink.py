"""Shrinking one failing (case, backend) to a minimal case that still fails the same way.

Greedy and domain-aware: :func:`candidates` lists simpler versions of a case, biggest simplifications first (drop
requests, an uneven append keeping the kept requests' new keys; drop quantization, qv, V padding, scheduler metadata,
append, splits, ALiBi, sinks, soft-cap, scale; fewer new keys per request; paged -> contiguous, HND -> NHD, smaller
blocks; window/chunk -> causal -> no mask, smaller windows and chunks; fewer heads keeping GQA divisibility; equal and
smaller head dims; a simpler dtype; shorter q and kv lengths). :func:`shrink` evaluates them in order and moves to the
first candidate that still fails *the same way* (:func:`same_failure`), then starts over from the new case, until no
candidate fails (a local minimum: no single listed simplification keeps the failure), the evaluation budget
(``max_steps``) is spent, or the campaign's deadline passes. Every candidate is strictly simpler by :func:`complexity`
(so the walk cannot cycle), is a valid :class:`~conformance.cases.case.AttentionCase`, and is evaluated only if
``admissible`` (the campaign passes the case space's constraints and the backend's declared refusals), at most once.

Why not Hypothesis's shrinker: it shrinks the byte stream a strategy consumed, one failure per test function
and in-process, and it needs many cheap evaluations.  Here each evaluation is a round trip to a crash-isolated
worker (tens of milliseconds on CPU, a kernel launch and a possible crash or timeout on a GPU), a campaign has
many independent failures, each to be shrunk within a budget and recorded as it goes (so an interrupted run
resumes), and the passes that matter (keep GQA divisible, keep d/dv legal, window -> causal -> none) are
moves in the case model, which generic byte-stream shrinking reaches only by luck and many evaluations.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from conformance.cases.case import AttentionCase, append_fields
from conformance.cases.fields import FIELD_SPECS
from conformance.records import HARNESS_ERROR, CheckResult, Status

__all__ = ["ShrinkResult", "candidates", "complexity", "failure_kind", "same_failure", "shrink"]

_DTYPE_RANK = {"bf16": 0, "fp16": 1, "fp32": 2}
#: Case fields the passes below simplify by name (the rows of :data:`~conformance.cases.fields.FIELD_SPECS` marked
#: ``shrunk``); any other field (one added to the case model after this module) is simplified by resetting it to its
#: default (:func:`_other_moves`).
_HANDLED = frozenset(spec.name for spec in FIELD_SPECS if spec.shrunk)


def _others(case: AttentionCase) -> dict[str, object]:
    """Fields outside :data:`_HANDLED` whose value is not the default."""
    return {
        f.name: f.default
        for f in dataclasses.fields(case)
        if f.name not in _HANDLED and f.default is not dataclasses.MISSING and getattr(case, f.name) != f.default
    }


def complexity(case: AttentionCase) -> int:
    """A size that every :func:`candidates` move strictly lowers: requests, lengths, heads, dims, dtype, layout
    and block size, mask extents, and one count per mode that is on (the weights keep every move a decrease)."""
    c = 100_000 * (case.batch - 1) + sum(q + k for q, k in case.requests)
    c += 50 * (case.num_heads + case.num_kv_heads) + case.head_dim + case.dv + 5 * _DTYPE_RANK.get(case.dtype, 3)
    if case.paged:
        c += 1000 + (case.kv_layout == "HND") + (case.block_size or 0)
    c += case.causal + sum(2 + w for w in case.window if w is not None)
    c += 0 if case.chunk is None else 2 + case.chunk
    c += (case.softcap is not None) + case.alibi + case.sinks + (case.scale is not None) + case.append
    c += case.append_len is not None
    c += (1 + sum(case.append_lens)) if case.append_lens else 0  # respelled as append_len or q_len: lower
    c += 0 if case.num_splits is None else 1 + case.num_splits
    if case.quant != "none":
        c += 5 + (case.descale is not None) + (not case.quant_q)
    return c + case.qv + case.v_padded + case.scheduler_metadata + len(_others(case))


def _smaller(x: int, lo: int, step: int = 1) -> list[int]:
    """Values below ``x`` down to ``lo``, nearest-to-``lo`` first and then halving the distance: ``lo``,
    ``x - (x - lo) / 2``, ``x - (x - lo) / 4``, ..., ``x - step`` (multiples of ``step`` when ``step`` > 1)."""
    if x <= lo:
        return []
    out = [lo]
    gap = (x - lo) // 2
    while gap >= step:
        out.append(x - (gap // step) * step)
        gap //= 2
    out.append(x - step)
    return [v for v in dict.fromkeys(out) if lo <= v < x]


def _try(case: AttentionCase, **changes) -> AttentionCase | None:
    try:
        return case.replace(**changes)
    except ValueError:
        return None


def _with_requests(case: AttentionCase, keep: list[int], requests: tuple[tuple[int, int], ...] | None = None):
    """``case`` with the requests ``keep`` (indices; ``requests`` their new lengths, default unchanged); an uneven
    append keeps each kept request's new keys, spelled as :func:`~conformance.cases.case.append_fields` spells them
    (a sub-batch may say them as ``append_len``)."""
    reqs = tuple(case.requests[i] for i in keep) if requests is None else requests
    if not case.append_lens:
        return _try(case, requests=reqs)
    new = [case.append_lens[i] for i in keep]
    return _try(case, requests=reqs, **append_fields([q for q, _ in reqs], new))


def _batch_moves(case: AttentionCase) -> Iterator[tuple[str, AttentionCase | None]]:
    reqs = case.requests
    n = len(reqs)
    if n == 1:
        return
    for i in sorted(range(n), key=lambda i: (sum(reqs[i]), i)):
        yield f"keep only request {i} {reqs[i]}", _with_requests(case, [i])
    if n > 3:
        yield "keep the first half of the requests", _with_requests(case, list(range(n // 2)))
        yield "keep the second half of the requests", _with_requests(case, list(range(n // 2, n)))
    for i in range(n):
        yield f"drop request {i} {reqs[i]}", _with_requests(case, [j for j in range(n) if j != i])


def _mode_moves(case: AttentionCase) -> Iterator[tuple[str, AttentionCase | None]]:
    if case.quant != "none":
        yield f"quant {case.quant} -> none", _try(case, quant="none", descale=None, quant_q=True)
    if case.qv:
        yield "drop qv", _try(case, qv=False)
    if case.v_padded:
        yield "drop V padding", _try(case, v_padded=False)
    if case.scheduler_metadata:
        yield "drop scheduler metadata", _try(case, scheduler_metadata=False)
    if case.append_len is not None:
        yield f"append_len {case.append_len} -> None", _try(case, append_len=None)
    if case.append_lens:
        yield f"append_lens {list(case.append_lens)} -> None", _try(case, append_lens=())
        for i, n in enumerate(case.append_lens):
            for m in _smaller(n, 0):
                new = case.append_lens[:i] + (m,) + case.append_lens[i + 1 :]
                yield f"append_lens[{i}] {n} -> {m}", _try(case, **append_fields(case.q_lens, new))
    if case.append:
        yield "drop append", _try(case, append=False, append_len=None, append_lens=())
    if case.num_splits is not None:
        yield f"num_splits {case.num_splits} -> None", _try(case, num_splits=None)
    for name in ("alibi", "sinks"):
        if getattr(case, name):
            yield f"drop {name}", _try(case, **{name: False})
    for name in ("softcap", "scale"):
        if getattr(case, name) is not None:
            yield f"drop {name} {getattr(case, name):g}", _try(case, **{name: None})
    if case.descale is not None:
        yield f"descale {case.descale} -> default", _try(case, descale=None)
    if not case.quant_q:
        yield "quantize q too", _try(case, quant_q=True)
    if case.num_splits is not None and case.num_splits > 1:
        for s in _smaller(case.num_splits, 1):
            yield f"num_splits {case.num_splits} -> {s}", _try(case, num_splits=s)


def _other_moves(case: AttentionCase) -> Iterator[tuple[str, AttentionCase | None]]:
    others = _others(case)
    if len(others) > 1:  # fields that are only valid together (e.g. a rank and its world size)
        yield f"reset {', '.join(others)} to defaults", _try(case, **others)
    for name, default in others.items():
        yield f"reset {name} to {default!r}", _try(case, **{name: default})


def _layout_moves(case: AttentionCase) -> Iterator[tuple[str, AttentionCase | None]]:
    if not case.paged:
        return
    yield f"{case.kv_layout} paged -> contiguous", _try(case, kv_layout="contiguous", block_size=None)
    if case.kv_layout == "HND":
        yield "HND -> NHD", _try(case, kv_layout="NHD")
    assert case.block_size is not None
    for bs in _smaller(case.block_size, 1):
        yield f"block size {case.block_size} -> {bs}", _try(case, block_size=bs)


def _mask_moves(case: AttentionCase) -> Iterator[tuple[str, AttentionCase | None]]:
    left, right = case.window
    if case.chunk is not None:
        yield f"drop chunk {case.chunk}", _try(case, chunk=None)
    if case.has_window:
        yield f"drop window {case.window}", _try(case, window=(None, None))
        if not case.causal:
            yield f"window {case.window} -> causal", _try(case, window=(None, None), causal=True)
    if case.causal and not case.has_window and case.chunk is None:
        yield "causal -> no mask", _try(case, causal=False)
    elif case.causal:
        yield "drop causal (window / chunk kept)", _try(case, causal=False)
    for side, w in (("left", left), ("right", right)):
        if w is None or (side == "left" and right is None):
            continue
        other = (None, right) if side == "left" else (left, None)
        yield f"window {side} {w} -> unbounded", _try(case, window=other)
    for w in _smaller(left, 0) if left is not None else ():
        yield f"window left {left} -> {w}", _try(case, window=(w, right))
    for w in _smaller(right, 0) if right is not None else ():
        yield f"window right {right} -> {w}", _try(case, window=(left, w))
    for c in _smaller(case.chunk, 1) if case.chunk is not None else ():
        yield f"chunk {case.chunk} -> {c}", _try(case, chunk=c)


def _head_moves(case: AttentionCase) -> Iterator[tuple[str, AttentionCase | None]]:
    h, hk = case.num_heads, case.num_kv_heads
    g = h // hk
    pairs = set()
    for hk2 in {1, 2, hk // 2, hk - 1, hk}:
        for g2 in {1, 2, g // 2, g - 1, g}:
            if hk2 >= 1 and g2 >= 1 and hk2 <= hk and g2 * hk2 <= h and (g2 * hk2, hk2) != (h, hk):
                pairs.add((g2 * hk2, hk2))
    for h2, hk2 in sorted(pairs):
        yield f"heads {h}/{hk} -> {h2}/{hk2}", _try(case, num_heads=h2, num_kv_heads=hk2)


def _dim_moves(case: AttentionCase) -> Iterator[tuple[str, AttentionCase | None]]:
    d, dv = case.head_dim, case.dv

    def dims(d2: int, dv2: int) -> AttentionCase | None:
        return _try(case, head_dim=d2, head_dim_v=None if dv2 == d2 else dv2)

    if dv < d:
        yield f"head_dim {d} -> head_dim_v {dv}", dims(dv, dv)
    elif d < dv:
        yield f"head_dim_v {dv} -> head_dim {d}", dims(d, d)
    for name, x in (("head dims", d), ("head_dim", d), ("head_dim_v", dv)):
        if name == "head dims" and d != dv:
            continue
        step = 8 if x % 8 == 0 else 1
        for y in _smaller(x, step, step):
            if name == "head dims":
                yield f"head dims {d} -> {y}", dims(y, y)
            elif name == "head_dim" and d != dv:
                yield f"head_dim {d} -> {y}", dims(y, dv)
            elif name == "head_dim_v" and d != dv:
                yield f"head_dim_v {dv} -> {y}", dims(d, y)


def _dtype_moves(case: AttentionCase) -> Iterator[tuple[str, AttentionCase | None]]:
    rank = _DTYPE_RANK.get(case.dtype, 3)
    for dt, r in _DTYPE_RANK.items():
        if r < rank:
            yield f"dtype {case.dtype} -> {dt}", _try(case, dtype=dt)


def _length_moves(case: AttentionCase) -> Iterator[tuple[str, AttentionCase | None]]:
    reqs = case.requests

    def with_req(i: int, q: int, k: int) -> AttentionCase | None:
        return _with_requests(case, list(range(len(reqs))), reqs[:i] + ((q, k),) + reqs[i + 1 :])

    for i, (q, k) in enumerate(reqs):
        lo = max(0, q - k) if q <= k else 0
        for q2 in _smaller(q, 0) if q and k else ():  # both shorter by the same amount: keeps kv_len - q_len
            if k - (q - q2) >= 0:
                yield f"request {i} {(q, k)} -> {(q2, k - (q - q2))}", with_req(i, q2, k - (q - q2))
        for k2 in _smaller(k, lo):
            yield f"request {i} kv_len {k} -> {k2}", with_req(i, q, k2)
        for q2 in _smaller(q, 0):
            yield f"request {i} q_len {q} -> {q2}", with_req(i, q2, k)


#: The passes, in the order they are tried (biggest simplifications first).
_PASSES: tuple[Callable[[AttentionCase], Iterator[tuple[str, AttentionCase | None]]], ...] = (
    _batch_moves,
    _mode_moves,
    _other_moves,
    _layout_moves,
    _mask_moves,
    _head_moves,
    _dim_moves,
    _dtype_moves,
    _length_moves,
)


def candidates(case: AttentionCase) -> Iterator[tuple[str, AttentionCase]]:
    """``(label, simpler case)`` in the order the shrinker tries them; moves the case model rejects are left out."""
    for moves in _PASSES:
        for label, cand in moves(case):
            if cand is not None and cand != case:
                yield label, cand


def failure_kind(result: CheckResult) -> str:
    """What kind of problem a record shows: ``fail`` (numerical), ``fail:shape``, ``error:<exception type>``
    (``error:harness`` when the harness itself failed), ``crash:<how the worker died>``, ``timeout``; ``""``
    for pass and unsupported."""
    status, reason = result.status, result.reason.strip()
    if status is Status.FAIL:
        return "fail" if result.stats is not None else "fail:" + reason.split(":", 1)[0]
    if status is Status.ERROR:
        if reason.startswith(HARNESS_ERROR.strip()):
            return "error:harness"
        return "error:" + reason.split(":", 1)[0].split()[0] if reason else "error"
    if status is Status.CRASH:
        first = reason.splitlines()[0] if reason else ""
        return "crash:" + (first.split(" by ", 1)[1].split()[0] if " by " in first else first)
    if status is Status.TIMEOUT:
        return "timeout"
    return ""


def same_failure(original: CheckResult, candidate: CheckResult) -> bool:
    """True when ``candidate`` fails the way ``original`` does: the same :func:`failure_kind`, and for a
    numerical failure at least one sub-check (max_error, lse, ...) failing in both."""
    kind = failure_kind(original)
    if not kind or failure_kind(candidate) != kind:
        return False
    if kind == "fail" and original.stats is not None and candidate.stats is not None:
        return bool(set(original.stats.failed_checks) & set(candidate.stats.failed_checks))
    return True


@dataclass
class ShrinkResult:
    """The minimal case found and how: ``steps`` the accepted moves in order, ``tried`` the candidates
    evaluated, ``complete`` False when the evaluation budget or the deadline stopped the search early."""

    case: AttentionCase
    result: CheckResult
    steps: list[str] = field(default_factory=list)
    tried: int = 0
    complete: bool = True


def shrink(
    case: AttentionCase,
    result: CheckResult,
    evaluate: Callable[[AttentionCase], CheckResult],
    *,
    reference: CheckResult | None = None,
    max_steps: int = 200,
    deadline: float | None = None,
    admissible: Callable[[AttentionCase], bool] = lambda c: True,
    on_step: Callable[[ShrinkResult], None] | None = None,
) -> ShrinkResult:
    """Shrink ``case`` (whose record ``result`` is a failure) with ``evaluate`` (one (case, backend) check).

    A candidate is kept when it fails as ``reference`` does (default: ``result``; a resumed shrink starts from
    an intermediate case and still compares with the original failure).  ``max_steps`` bounds the evaluations,
    ``deadline`` (a ``time.monotonic()`` value) the time; ``admissible`` filters candidates before they cost an
    evaluation; ``on_step`` sees the state after every accepted move.
    """
    reference = result if reference is None else reference
    if not failure_kind(reference):
        raise ValueError(f"result must be a failure (fail, error, crash, timeout), got {reference.status.value}")
    state = ShrinkResult(case, result)
    seen = {case.id}
    progress = True
    while progress:
        progress = False
        for label, cand in candidates(state.case):
            if cand.id in seen or not admissible(cand):
                continue
            if state.tried >= max_steps or (deadline is not None and time.monotonic() >= deadline):
                state.complete = False
                return state
            seen.add(cand.id)
            state.tried += 1
            outcome = evaluate(cand)
            if same_failure(reference, outcome):
                state.case, state.result = cand, outcome
                state.steps.append(label)
                if on_step is not None:
                    on_step(state)
                progress = True
                break
    return state
