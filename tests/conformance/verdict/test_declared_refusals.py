"""Every composition over the field combinations the case model accepts: a case it cannot compose is refused up front.

A composition (graph replay, kernel and engine invariance, backward, every engine's replay:
:func:`conformance.verdict.check.composition_of`) that cannot run a case's combination of fields must say so in its
declaration (``refuses``, then ``supports``), so the record is UNSUPPORTED with the reason, decided before any
tensor exists; a ``ValueError`` (or a broken kernel contract) raised inside the check is an ERROR record that a
declaration could have prevented (issue 31: an MLA bucket with HND pages on fa3-vllm raised "graph: an MLA (qv)
bucket is NHD only" as an error).

Each grid is a base case and axes of field changes; the cases are a covering array over the combinations the case
model accepts (strength 2 here, the growing-neighbour grids excepted, 3 in the slow test: every pair, every triple
of levels meets in some case, e.g. graph x qv x HND).  Every case is asked of every registered adapter's
declarations with a stand-in kernel (:class:`~tests.conformance.fakes.DeclaredBackend`: the GPU adapters' paths on
CPU, their inputs checked against the kernel contract) and of the real CPU backends (each level once here, every
pair in the slow test).  The test fails on any ERROR record.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import pytest

from attnfast.registry import BUILTIN, get_backend
from conformance.cases.case import AttentionCase, CaseError
from conformance.cases.covering import Strength, covering_array
from conformance.engines import engine_cases
from conformance.records import Status
from conformance.verdict.check import check_backend, prepare_context, refusal
from tests.conformance.fakes import DeclaredBackend

Axes = Mapping[str, Sequence[Any]]

GQA = dict(num_heads=4, num_kv_heads=2, head_dim=64)
MLA = dict(num_heads=2, num_kv_heads=1, head_dim=64, head_dim_v=512, qv=True)  # FlashMLA's and FA3's qv dims
DV = dict(num_heads=4, num_kv_heads=2, head_dim=64, head_dim_v=32)
MODS = [{}, dict(sinks=True), dict(window=(7, 0)), dict(alibi=True), dict(softcap=30.0), dict(scale=0.1)]
PAGED = [dict(kv_layout=layout, block_size=bs) for layout, bs in (("NHD", 16), ("HND", 16), ("NHD", 64), ("NHD", 256))]
DECODE = ((1, 20), (1, 5), (1, 33), (1, 9))

#: grid name -> (base case fields, axes: each level a value of the field, or a dict of fields to set)
GRIDS: dict[str, tuple[dict[str, Any], dict[str, list[Any]]]] = {
    "graph": (
        dict(requests=DECODE, graph=(2, 1, 1), causal=True, **GQA),
        dict(
            heads=[{}, MLA, DV],
            dtype=["bf16", "fp16", "fp32"],
            mods=MODS,
            layout=PAGED,
            graph_fill=[0, 1],
            num_splits=[None, 1, 2],
            scheduler_metadata=[False, True],
            verify=[{}, dict(requests=tuple((3, kv) for _, kv in DECODE))],
        ),
    ),
    "invariance": (
        dict(requests=((1, 40), (1, 17), (1, 25)), causal=True, **GQA),
        dict(
            invariance=["run", "batch", "splits"],
            heads=[{}, MLA, DV],
            dtype=["bf16", "fp32"],
            mods=MODS + [dict(chunk=8)],
            layout=[{}] + PAGED,
            num_splits=[None, 1, 2],
            quant=[{}, dict(quant="fp8_e4m3"), dict(quant="int8_t1"), dict(quant="fp8_e4m3", quant_q=False)],
            extra=[{}, dict(append=True), dict(head_dim_v=32, v_padded=True), dict(scheduler_metadata=True)]
            + [dict(cp_world=2, cp_rank=1)],
            batch=[{}, dict(requests=((5, 40), (1, 17), (30, 25)))],  # mixed, one request with q_len > kv_len
        ),
    ),
    "backward": (
        dict(requests=((20, 20), (7, 7)), causal=True, backward=True, **GQA),
        dict(
            heads=[{}, DV, dict(num_heads=4, num_kv_heads=4, head_dim=128)],
            dtype=["bf16", "fp16", "fp32"],
            mods=MODS + [dict(chunk=8)],
            deterministic=[False, True],
            data=["", "outliers", "peaked", "offset_v"],
            causal=[True, False],
        ),
    ),
}
#: the axes an engine case is varied over (its scenario fixes most fields: the engine refuses the rest up front)
ENGINE_AXES: dict[str, list[Any]] = dict(
    dtype=[{}, dict(dtype="fp16"), dict(dtype="fp32")],
    layout=[{}, dict(kv_layout="contiguous", block_size=None)] + PAGED[:3],
    mods=MODS + [dict(chunk=8)],
    num_splits=[{}, dict(num_splits=None), dict(num_splits=1), dict(num_splits=2)],
    quant=[{}, dict(quant="fp8_e4m3"), dict(quant="int8_t1")],
    invariance=[
        {},
        dict(invariance=""),
        dict(invariance="run"),
        dict(invariance="batch"),
        dict(invariance="neighbour"),
    ],
    extra=[{}, dict(append=True), dict(scheduler_metadata=True), dict(head_dim_v=32), MLA],
)


def _engine_grids() -> dict[str, tuple[dict[str, Any], dict[str, list[Any]]]]:
    """One grid per (engine, kind of scenario): an eager step, a graph replay, an invariance, a growing neighbour."""
    out = {}
    for case in engine_cases():
        inv = "neighbour" if case.invariance == "neighbour" else "invariance"
        kind = "graph" if case.graph else inv if case.invariance else "eager"
        key = f"engine-{case.engine}-{kind}"
        if key not in out:
            fields = {f: getattr(case, f) for f in case.to_json()}
            out[key] = (fields, ENGINE_AXES)
    return out


GRIDS.update(_engine_grids())

#: the fast test's levels where they are fewer (every axis keeps the levels that raised before issue 31's fix); the
#: slow test takes every level of :data:`GRIDS`
FAST: dict[str, dict[str, list[Any]]] = {
    "invariance": dict(
        dtype=["bf16"],
        mods=MODS[:5],
        layout=[{}] + PAGED[:3],
        num_splits=[None, 1],
        quant=[{}, dict(quant="fp8_e4m3"), dict(quant="int8_t1")],
    ),
    "engine": dict(
        dtype=[{}, dict(dtype="fp32")],
        layout=[{}, dict(kv_layout="contiguous", block_size=None), PAGED[1]],
        num_splits=[{}, dict(num_splits=None), dict(num_splits=1)],
        quant=[{}, dict(quant="fp8_e4m3")],
        invariance=[{}, dict(invariance=""), dict(invariance="batch")],
    ),
}


def fast_axes(name: str) -> dict[str, list[Any]]:
    """The axes of grid ``name`` in the fast test."""
    axes = GRIDS[name][1]
    return {**axes, **FAST.get(name.split("-")[0], {})}


def _changes(axes: Axes, point: Mapping[str, int]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, i in point.items():
        level = axes[name][i]
        out.update(level if isinstance(level, dict) else {name: level})
    return out


def _case(base: Mapping[str, Any], axes: Axes, point: Mapping[str, int]) -> AttentionCase | None:
    try:
        return AttentionCase(**{**base, **_changes(axes, point)})
    except CaseError:
        return None


def accepted(base: Mapping[str, Any], axes: Axes) -> list[tuple[int, ...]]:
    """Every combination of levels (as level indices) that the case model accepts."""
    names = list(axes)
    return [
        combo
        for combo in itertools.product(*(range(len(axes[n])) for n in names))
        if _case(base, axes, dict(zip(names, combo))) is not None
    ]


def covering_cases(base: Mapping[str, Any], axes: Axes, t: int) -> tuple[list[AttentionCase], int]:
    """A covering array of strength ``t`` over the accepted combinations (its cases), and how many there are."""
    names = list(axes)
    rows = accepted(base, axes)
    projections: dict[tuple[str, ...], set[tuple[int, ...]]] = {}

    def projected(sub: Sequence[str]) -> set[tuple[int, ...]]:
        key = tuple(sub)
        if key not in projections:
            idx = [names.index(a) for a in key]
            projections[key] = {tuple(r[i] for i in idx) for r in rows}
        return projections[key]

    def extensible(point: Mapping[str, Hashable]) -> bool:
        sub = [a for a in names if a in point]
        return tuple(point[a] for a in sub) in projected(sub)  # type: ignore[misc]

    levels = {n: tuple(range(len(axes[n]))) for n in names}
    points = covering_array(
        [Strength(tuple(names), min(t, len(names)))], levels=levels, possible=projected, extensible=extensible
    )
    cases = [_case(base, axes, p) for p in points]  # type: ignore[arg-type]
    assert all(c is not None for c in cases)
    return cases, len(rows)  # type: ignore[return-value]


def declared_backends() -> list[DeclaredBackend]:
    """Every built-in adapter's declarations, on CPU (the stand-in kernel)."""
    return [DeclaredBackend(get_backend(name)) for name in BUILTIN]


def errors_of(cases: Sequence[AttentionCase], backends: Sequence[Any]) -> tuple[list[str], int, int]:
    """Every ERROR record of ``backends`` on ``cases`` (``"<backend>: <reason> | <case json>"``), the number of
    records and of those that ran (not refused)."""
    errors, records, ran = [], 0, 0
    for case in cases:
        runners = []
        for backend in backends:
            records += 1
            refused = refusal(case, backend, "cpu")
            if refused is None:
                runners.append(backend)
            elif refused.status is Status.ERROR:
                errors.append(f"{backend.name}: {refused.reason} | {case.to_json()}")
        if not runners:
            continue
        try:
            ctx = prepare_context(case, 0, "cpu")
        except Exception as exc:  # noqa: BLE001 - the worker turns this into an error record of every runner
            errors.append(f"prepare_context: {type(exc).__name__}: {exc} | {case.to_json()}")
            continue
        for backend in runners:
            ran += 1
            record = check_backend(ctx, backend)
            if record.status is Status.ERROR:
                errors.append(f"{backend.name}: {record.reason} | {case.to_json()}")
    return errors, records, ran


def _report(name: str, errors: list[str]) -> str:
    shown = "\n".join(sorted(set(errors))[:30])
    return f"{name}: {len(errors)} ERROR records a declaration could have prevented:\n{shown}"


# ------------------------------------------------------------------------------------------------ the sweep
#: the growing-neighbour grids are left to the slow test below, whose triples cover every pair of their levels: each
#: of their cases that runs is an engine step of 8 variants beside a 129-query neighbour (their pairs took 33 s of CPU)
SLOW_ONLY = [name for name in GRIDS if name.endswith("-neighbour")]


@pytest.mark.parametrize("name", [name for name in GRIDS if name not in SLOW_ONLY])
def test_no_composition_raises_what_it_could_have_refused(name):
    base, axes = GRIDS[name][0], fast_axes(name)
    cases, n_accepted = covering_cases(base, axes, 2)
    assert n_accepted and cases
    errors, records, ran = errors_of(cases, declared_backends())
    assert ran, f"{name}: no declared backend ran any of the {len(cases)} cases (the grid reaches nothing)"
    assert not errors, _report(name, errors)
    if not name.startswith("engine"):  # every engine scenario runs on sdpa-cpu in tests/conformance/engines
        errors, _, _ = errors_of(covering_cases(base, axes, 1)[0], [get_backend("sdpa-cpu")])
        assert not errors, _report(f"{name} (sdpa-cpu)", errors)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(GRIDS))
def test_no_composition_raises_what_it_could_have_refused_every_triple(name):
    base, axes = GRIDS[name]
    cases, _ = covering_cases(base, axes, 3)
    errors, _, ran = errors_of(cases, declared_backends())
    assert ran, f"{name}: no declared backend ran any of the {len(cases)} cases (the grid reaches nothing)"
    assert not errors, _report(name, errors)
    pairs, _ = covering_cases(base, axes, 2)
    errors, _, _ = errors_of(pairs, [get_backend("sdpa-cpu"), get_backend("flex-cpu")])
    assert not errors, _report(f"{name} (CPU backends)", errors)


# ------------------------------------------------------------------------------------------------ what it found
def test_an_mla_bucket_with_hnd_pages_is_unsupported_with_its_reason():
    """Issue 31's case: an MLA (qv) graph bucket with HND pages raised inside the check on fa3-vllm."""
    case = AttentionCase(DECODE, graph=(2, 1, 1), causal=True, kv_layout="HND", block_size=16, **MLA)
    for name, device in (("fa3-vllm", "cuda"), ("sdpa-cpu", "cpu"), ("flex-cpu", "cpu")):
        r = refusal(case, get_backend(name), device)
        assert r is not None and r.status is Status.UNSUPPORTED, (name, r)
        assert r.reason.startswith("graph: an MLA (qv) bucket is NHD only"), r.reason


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        (dict(quant="fp8_e4m3"), "quantized inputs (quant)"),
        (dict(append=True), "the new keys of an append (k_new, v_new)"),
        (dict(cp_world=2, cp_rank=1), "context-parallel totals (cp_tot_seqused_k)"),
    ],
)
def test_invariance_refuses_what_its_variants_do_not_carry(changes, reason):
    case = AttentionCase(((1, 40), (1, 17), (1, 25)), causal=True, invariance="batch", **GQA, **changes)
    r = refusal(case, get_backend("sdpa-cpu"), "cpu")
    assert r is not None and r.status is Status.UNSUPPORTED
    assert r.reason.startswith("invariance: its batches are assembled from q, k, v only") and reason in r.reason


def test_an_engine_case_off_its_scenario_is_unsupported_naming_the_engine():
    case = next(c for c in engine_cases() if c.engine == "vllm_diff").replace(kv_layout="HND")
    r = refusal(case, get_backend("sdpa-cpu"), "cpu")
    assert r is not None and r.status is Status.UNSUPPORTED
    assert r.reason.startswith("engine vllm_diff: the cache must be NHD"), r.reason
    merge = next(c for c in engine_cases() if c.engine == "merge").replace(alibi=True)
    r = refusal(merge, get_backend("sdpa-cpu"), "cpu")
    assert r is not None and r.status is Status.UNSUPPORTED and "without ALiBi or sinks" in r.reason


def test_the_batch_variant_keeps_a_causal_request_with_fewer_keys_than_queries():
    from conformance.graphs.invariance import variants

    case = AttentionCase(((5, 40), (1, 17), (30, 25)), causal=True, invariance="batch", **GQA)
    assert variants(case)[-1].picks == ((0, 40), (1, 8), (2, 25))  # (30, 25) keeps its 25 keys


def test_qv_with_v_padded_is_refused_by_the_case_model():
    with pytest.raises(CaseError, match="v_padded cannot be combined with qv"):
        AttentionCase(((1, 40),), num_heads=2, num_kv_heads=1, head_dim=64, head_dim_v=32, qv=True, v_padded=True)
