"""A run's plan, before any worker starts: what it selected (:func:`select_run`: the cases, backends, tolerance
overrides, worker placements and the sweep identity ``--resume`` checks) and the (case, backend) pairs still to run,
grouped by case and ordered for the workers (:func:`plan_pairs`).  Neither starts a worker nor touches an output;
:mod:`conformance.running.runner` executes the plan."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from conformance.exits import UsageError
from conformance.records import CheckResult
from conformance.running.outfile import sweep
from conformance.running.pairs import RunConfig, _Pair, _placements, _timing_warning, _units, check_backend_names
from conformance.running.pool import Placement
from conformance.running.schedule import schedule_units
from conformance.running.selection import Selection, json_case_ids, parse_features, parse_models

if TYPE_CHECKING:
    from conformance.cases.case import AttentionCase

__all__ = ["Plan", "Selected", "plan_pairs", "select_run"]


@dataclass(frozen=True)
class Selected:
    """What a run selected (:func:`select_run`), before any worker starts."""

    #: what decides the pairs: the header's ``selection``
    selection: Selection
    #: the selected cases, in run order
    cases: list[AttentionCase]
    #: the tolerance overrides, resolved (:func:`conformance.running.worker.load_overrides`)
    overrides: tuple[Any, ...]
    #: one per worker the run may start (:func:`conformance.running.pool.plan_workers`)
    placements: list[Placement]
    #: the header's ``sweep`` (:func:`conformance.running.outfile.sweep`), which ``--resume`` checks
    identity: dict[str, Any]
    #: a warning for stderr (``--time`` with workers sharing a device), or None
    warning: str | None


def select_run(config: RunConfig) -> Selected:
    """The selection part of a run: ``config``'s cases (:meth:`Selection.cases`), its backend names checked
    (:func:`check_backend_names`), its tolerance overrides loaded, its workers placed and its sweep identity.
    Starts no worker and touches no output; :class:`UsageError` (one line) for a bad selection, no backend, an
    unknown backend name, tolerance overrides that do not load, or a placement this machine cannot give."""
    selection = config.selection
    cases = selection.cases()
    if not config.backends:
        raise UsageError("give at least one --backend")
    check_backend_names(config.backends)
    from conformance.running.worker import load_overrides

    try:
        overrides = load_overrides(list(config.tol), config.tol_file)  # the worker parses them again; fail fast
    except (OSError, ValueError, RuntimeError) as exc:
        raise UsageError(f"tolerance overrides: {exc}") from None
    placements = _placements(config)
    identity = sweep(
        suite=config.suite,
        cases=cases,
        json_ids=json_case_ids(config.case_json) if config.case_json else None,
        patterns=config.case_patterns,
        exclude=config.exclude,
        features=parse_features(config.features),
        exclude_features=parse_features(config.exclude_features, "--exclude-feature"),
        models=parse_models(config.models),
        shard=config.shard,
        limit=config.limit,
        seed=config.seed,
        device=config.device,
        tol=overrides,
        tol_args=config.tol,
        tol_file=config.tol_file,
    )
    return Selected(selection, cases, overrides, placements, identity, _timing_warning(config, placements))


@dataclass(frozen=True)
class Plan:
    """The (case, backend) pairs of a run and how they go to the workers (:func:`plan_pairs`)."""

    #: every selected (case, backend spec) pair, cases outer, backends inner
    pairs: list[tuple[AttentionCase, str]]
    #: the (case id, spec) pairs still to run: those the resumed file does not hold
    todo: set[tuple[str, str]]
    #: the pairs to run grouped by case (one worker request list per case), in the order they go to workers
    units: list[list[_Pair]]
    #: each case's expected cost (:func:`conformance.running.schedule.schedule_units`)
    unit_cost: dict[str, float]
    #: the resumed file's records of the selected pairs, in pair order
    recorded: list[CheckResult]
    #: how many records the resumed file holds (``env.run.already_recorded``)
    already_recorded: int
    #: workers the run uses: one per unit at most
    workers: int


def plan_pairs(
    config: RunConfig,
    selected: Selected,
    infos: dict[str, dict[str, str]],
    done: dict[tuple[str, str], CheckResult],
    measured: list[CheckResult],
) -> Plan:
    """The plan part of a run: every pair of ``selected.cases`` and ``config.backends``; those whose (case id,
    backend name) ``done`` (the resumed file's records) lacks grouped by case into worker requests
    (``available`` as ``infos``, the backends' description, says) and ordered by ``config.schedule`` with the
    ``measured`` times; the workers, at most one per unit and one per placement.  Pure: no worker, no file."""
    cases = selected.cases
    pairs = [(c, s) for c in cases for s in config.backends]
    todo = {(c.id, s) for c, s in pairs if (c.id, infos[s]["name"]) not in done}
    units = _units(config, cases, todo, frozenset(s for s in config.backends if infos[s].get("available") == "yes"))
    names = {s: infos[s]["name"] for s in config.backends}
    units, unit_cost = schedule_units(units, names, measured, config.schedule)
    recorded = [done[c.id, infos[s]["name"]] for c, s in pairs if (c.id, infos[s]["name"]) in done]
    workers = min(len(selected.placements), len(units))
    return Plan(pairs, todo, units, unit_cost, recorded, len(done), workers)
