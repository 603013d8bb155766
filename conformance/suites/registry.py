"""Named suites: unions of declarative sweeps (:mod:`conformance.cases.sweep`), deduplicated by case id and returned
in a stable order.  The sweeps live by suite family (:mod:`conformance.suites.smoke`,
:mod:`~conformance.suites.default`, :mod:`~conformance.suites.full`; ``perf``'s written-out cases in
:mod:`~conformance.suites.perf`); this module assembles them into :data:`SUITES`.  Adding a sweep is a one-line
change there (a new axis, level or constraint of the case space: :mod:`conformance.cases.space`); the runner,
reports and tests pick it up without edits.

Suites (sizes: ``attnconf cases --suite NAME --count``): ``smoke`` (small cases of every mode, a minute on 2
CPU cores, small graph, invariance and backward cases included), ``default`` (the CI suite on a GPU: hand-picked
sweep cases, covering-array cases, the fuzzer's findings, :mod:`conformance.suites.found`, the small graph and
invariance cases and the backward cases, :mod:`conformance.suites.backward`), ``full`` (sweep cases with long
contexts up to 32k, default's covering, found and backward cases and covering cases of its own), ``perf`` (long
prefill and paged decode for timing against the roofline), ``engines`` (engine replays), ``models`` (real
models' configurations, :mod:`conformance.models`), ``graphs`` (CUDA-graph mode and invariances,
:mod:`conformance.graphs`), ``limits`` (probes of the kernels' limits, :mod:`conformance.suites.limits`),
``training`` (backward cases as training builds them: packed documents and unpadded batches of sliding-window,
soft-cap and sink models, :mod:`conformance.backward.training`), ``peer-*`` (the kernels' own test grids, one
module per source: :mod:`conformance.suites.peers`).

Covering arrays (:mod:`conformance.cases.covering` over :mod:`conformance.cases.space`): ``default`` adds the cases
that make it cover every pair of levels of all axes and every triple of the kernel axes
(:data:`~conformance.cases.covering.DEFAULT_STRENGTHS`), ``full`` every triple of all axes
(:data:`~conformance.cases.covering.FULL_STRENGTHS`).  The generator is seeded with the sweep cases, so only tuples
they leave uncovered add cases, and the sweep cases keep their ids and come first; the tuples of plain levels
(:data:`~conformance.cases.space.PLAIN`) are covered by plain cases first, so a backend that refuses fp8, sinks or
an HND cache still runs them; the added cases use the space's small canonical batches.  ``attnconf cases --suite S
--coverage [--backend B]`` prints the figures.  The added cases (and their ids) change when the sweeps or the space
change, except that a level added to an axis with its earlier levels in :data:`~conformance.cases.space.EARLIER`
only adds cases after them; the sweep cases never change.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from functools import lru_cache

from conformance.backward.training import training_cases
from conformance.cases import covering
from conformance.cases.case import AttentionCase
from conformance.suites.cache import cached_cases
from conformance.suites.found import found_cases
from conformance.suites.backward import DEFAULT_BACKWARD, SMOKE_BACKWARD, backward_covering
from conformance.suites.default import DEFAULT, QUANT_MLA
from conformance.suites.full import FULL
from conformance.suites.peers import PEER_SUITES
from conformance.suites.perf import perf_cases
from conformance.suites.smoke import SMOKE
from conformance.cases.sweep import BATCHES, MASKS, Sweep
from conformance.suites.limits import limits_cases
from conformance.graphs.suite import graphs_suite
from conformance.graphs.suite import small_cases as graph_small_cases
from conformance.suites.models import model_cases

__all__ = [
    "BATCHES",
    "DEFAULT",
    "FULL",
    "MASKS",
    "QUANT_MLA",
    "SMOKE",
    "Sweep",
    "SUITES",
    "all_case_ids",
    "backward_cases",
    "covering_cases",
    "suite_names",
    "get_suite",
]


def _engine_cases() -> list[AttentionCase]:
    from conformance.engines import engine_cases  # the engines import the case model: import late

    return engine_cases()


#: The covering arrays' tie-breaking seed: changing it changes the added cases (and their ids).
COVERING_SEED = 0


@lru_cache(maxsize=None)
def covering_cases(name: str) -> tuple[AttentionCase, ...]:
    """The cases the covering arrays add to suite ``default`` or ``full`` (after its sweep cases), seeded with
    them (``full``: its sweeps and default's covering cases), plain tuples by plain cases first
    (:func:`conformance.cases.covering.cover`); built once per machine and source version
    (:mod:`conformance.suites.cache`), then read from the disk cache."""
    if name == "default":
        return cached_cases(
            "covering-default", lambda: covering.cover(covering.DEFAULT_STRENGTHS, _union(DEFAULT), seed=COVERING_SEED)
        )
    if name == "full":
        return cached_cases(
            "covering-full",
            lambda: covering.cover(
                covering.FULL_STRENGTHS, _union(FULL, covering_cases("default")), seed=COVERING_SEED
            ),
        )
    raise ValueError(f"covering_cases: name must be 'default' or 'full', got {name!r}")


@lru_cache(maxsize=None)
def backward_cases(name: str) -> tuple[AttentionCase, ...]:
    """The backward cases of suite ``smoke`` (its small sweeps) or ``default`` (its sweeps and the covering array
    of the backward sub-space, :mod:`conformance.suites.backward`, built once per machine and source version
    like :func:`covering_cases`; ``full`` holds them too)."""
    if name == "smoke":
        return tuple(_union(SMOKE_BACKWARD))
    if name == "default":
        hand = _union(DEFAULT_BACKWARD)
        return tuple(hand) + cached_cases("backward-default", lambda: backward_covering(hand, seed=COVERING_SEED))
    raise ValueError(f"backward_cases: name must be 'smoke' or 'default', got {name!r}")


SUITES: dict[str, Callable[[], list[AttentionCase]]] = {
    "smoke": lambda: _union(SMOKE, tuple(graph_small_cases()) + backward_cases("smoke")),
    "default": lambda: _union(
        DEFAULT, covering_cases("default") + found_cases() + tuple(graph_small_cases()) + backward_cases("default")
    ),
    "full": lambda: _union(
        FULL,
        covering_cases("default")
        + covering_cases("full")
        + found_cases()
        + tuple(graph_small_cases())
        + backward_cases("default"),
    ),
    "perf": perf_cases,
    "engines": _engine_cases,
    "models": model_cases,
    "graphs": graphs_suite,
    "limits": limits_cases,
    "training": training_cases,
    **PEER_SUITES,
}


def _union(sweeps: Sequence[Sweep], extra: Iterable[AttentionCase] = ()) -> list[AttentionCase]:
    seen: dict[str, AttentionCase] = {}
    for sweep in sweeps:
        for case in sweep.cases():
            seen.setdefault(case.id, case)
    for case in extra:
        seen.setdefault(case.id, case)
    return list(seen.values())


def suite_names() -> list[str]:
    return list(SUITES)


def all_case_ids() -> list[str]:
    """The case id of every case of every built-in suite, sorted and deduplicated (seconds to build: the covering
    arrays included)."""
    return sorted({case.id for build in SUITES.values() for case in build()})


def get_suite(name: str) -> list[AttentionCase]:
    """Cases of a named suite, in a stable order; ``ValueError`` lists the names."""
    if name not in SUITES:
        raise ValueError(f"suite must be one of {suite_names()}, got {name!r}")
    return SUITES[name]()
