"""One run API: the :class:`~conformance.running.selection.Selection` value (parsed once by ``attnconf run``, written
into the results file's header, read back by ``attnconf merge``), and the four parts of the runner
(:func:`~conformance.running.runner.select_run`, :func:`~conformance.running.runner.plan_pairs`,
:func:`~conformance.running.runner.execute`, :func:`~conformance.running.runner.summarize`), each alone.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from conformance.cases.case import AttentionCase
from conformance.cli import main
from conformance.records import CheckResult, Header, Status
from conformance.reporting.shards import merge_shards
from conformance.results_file import read_records
from conformance.results_writer import append_record
from conformance.running.outcome import RunSummary
from conformance.running.profile import RunClock
from conformance.running.run_args import parse_run_argv, selection_from_argv
from conformance.running.runner import (
    RunConfig,
    RunState,
    UsageError,
    describe_backends,
    execute,
    plan_pairs,
    run_header,
    select_run,
    summarize,
)
from conformance.running.selection import Selection, SelectionError, select_cases
from conformance.running.worker import WorkerClient

REPO = Path(__file__).resolve().parents[3]
EXACT = "tests.conformance.fakes:ExactBackend"
LSE = "tests.conformance.fakes:LseSignBackend"
#: a header as runs before ``Header.selection`` wrote it (argv, no selection): committed with its records
COMMITTED = REPO / "reports/h100-2026-11-27-peers/default-append.jsonl.gz"


def tiny_cases(n: int) -> list[AttentionCase]:
    return [
        AttentionCase(requests=((q, q),), num_heads=2, num_kv_heads=1, head_dim=16, dtype="fp16")
        for q in range(1, n + 1)
    ]


def case_file(tmp_path: Path, cases: list[AttentionCase]) -> str:
    path = tmp_path / "cases.json"
    path.write_text(json.dumps([c.to_json() for c in cases]))
    return "@" + str(path)


# ------------------------------------------------------------------------------------------- the selection value

texts = st.text(max_size=12)
lists = st.lists(texts, max_size=3).map(tuple)


@st.composite
def selections(draw: st.DrawFn) -> Selection:
    n = draw(st.integers(1, 64))
    return Selection(
        backends=draw(lists),
        suite=draw(st.none() | texts),
        case_patterns=draw(lists),
        case_json=draw(st.none() | st.text(max_size=40)),
        exclude=draw(lists),
        features=draw(lists),
        exclude_features=draw(lists),
        models=draw(lists),
        shard=draw(st.none() | st.integers(0, n - 1).map(lambda i: (i, n))),
        limit=draw(st.none() | st.integers(1, 2**40)),
        device=draw(texts),
        seed=draw(st.integers(0, 2**32 - 1)),
    )


@settings(max_examples=60)
@given(selection=selections())
def test_the_selection_round_trips_through_a_results_file_header(selection: Selection) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("r.jsonl", "r.jsonl.gz"):
            path = Path(tmp) / name
            append_record(path, Header(suite="s", backends={}, env={}, selection=selection.to_json()))
            [header], _ = read_records(path)
            assert Selection.from_json(header.selection) == selection


@settings(max_examples=30)
@given(selection=selections())
def test_a_run_config_carries_its_selection(selection: Selection) -> None:
    config = RunConfig.from_selection(selection, out=Path("x.jsonl"), jobs=2)
    assert config.selection == selection and config.out == Path("x.jsonl") and config.jobs == 2


GOOD = Selection(backends=("sdpa-cpu",), suite="smoke", shard=(1, 3), limit=2).to_json()


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ([GOOD], "selection must be a JSON object"),
        ({k: v for k, v in GOOD.items() if k != "schema"}, "selection.schema"),
        ({**GOOD, "schema": 2}, "selection.schema"),  # a newer format
        ({**GOOD, "schema": True}, "selection.schema"),
        ({**GOOD, "dtype": ["bf16"]}, "selection.dtype: a field this version does not know"),
        ({k: v for k, v in GOOD.items() if k != "limit"}, "selection.limit is missing"),
        ({**GOOD, "shard": [3, 3]}, "selection.shard"),
        ({**GOOD, "shard": [0]}, "selection.shard"),
        ({**GOOD, "shard": [0, True]}, "selection.shard"),
        ({**GOOD, "limit": 0}, "selection.limit"),
        ({**GOOD, "seed": -1}, "selection.seed"),
        ({**GOOD, "seed": 2**32}, "selection.seed"),
        ({**GOOD, "backends": "sdpa-cpu"}, "selection.backends"),
        ({**GOOD, "case": [1]}, "selection.case"),
        ({**GOOD, "suite": 3}, "selection.suite"),
        ({**GOOD, "device": None}, "selection.device"),
    ],
)
def test_a_selection_this_version_cannot_read_is_one_line_naming_the_field(data: Any, field: str) -> None:
    with pytest.raises(SelectionError) as info:
        Selection.from_json(data)
    assert field in str(info.value) and "\n" not in str(info.value)


def test_the_cli_parses_the_selection_once_from_its_options() -> None:
    args = parse_run_argv(
        ["--model", "llama-3.1-70b", "--case", "*a*", "--exclude", "*b*", "--feature", "paged,window", "--shard",
         "1/4", "--limit", "3", "--seed", "7", "--case-json", "@cases.json", "--exclude-feature", "softcap"]
    )  # fmt: skip
    chosen = Selection.from_args(args, device="cpu", backends=["sdpa-cpu"])
    assert chosen == Selection(
        backends=("sdpa-cpu",),
        suite="models",  # --model without --suite
        case_patterns=("*a*",),
        case_json="@cases.json",
        exclude=("*b*",),
        features=("paged,window",),
        exclude_features=("softcap",),
        models=("llama-3.1-70b",),
        shard=(1, 4),
        limit=3,
        device="cpu",
        seed=7,
    )
    argv = ["attnconf", "run", "--suite", "smoke", "--shard", "0/2", "--backend", "a", "--backend", "b"]
    assert selection_from_argv(argv) == Selection(backends=("a", "b"), suite="smoke", shard=(0, 2), device="auto")
    assert selection_from_argv(["attnconf", "fuzz", "--budget", "3"]) is None
    with pytest.raises(UsageError):
        selection_from_argv(["attnconf", "run", "--flag-of-a-later-version"])


# ------------------------------------------------------------------------------------------- headers, old and new


def test_a_future_header_field_does_not_break_reading_or_merging(tmp_path: Path) -> None:
    cases = select_cases("smoke", limit=3)
    selection = Selection(backends=("kern",), suite="smoke", limit=3)
    header = Header(
        suite="smoke", backends={"kern": {"name": "kern"}}, env={"run": {"cases": 3}}, selection=selection.to_json()
    )
    line = {**header.to_json(), "a_later_field": {"nested": [1, 2]}}
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(line) + "\n")
    append_record(path, CheckResult(cases[0].id, "kern", "kern", Status.PASS, cases[0].to_json()))
    [read], _ = read_records(path)
    assert read.selection == selection.to_json()
    merged = merge_shards([path])
    assert set(merged.missing_pairs) == {(c.id, "kern") for c in cases[1:]}  # rebuilt from the selection
    # a selection of a later format: read, not rebuilt: the missing pairs are counted from the header, not named
    later = {**line, "selection": {**selection.to_json(), "schema": 2, "dtype": ["fp8"]}}
    path.write_text(json.dumps(later) + "\n")
    append_record(path, CheckResult(cases[0].id, "kern", "kern", Status.PASS, cases[0].to_json()))
    merged = merge_shards([path])
    assert merged.missing_pairs == () and merged.missing_count == 2


def test_a_committed_header_without_selection_merges_by_its_argv(tmp_path: Path) -> None:
    with gzip.open(COMMITTED, "rt") as fh:
        lines = fh.read().splitlines(keepends=True)
    assert "selection" not in json.loads(lines[0]) and json.loads(lines[0])["argv"][1] == "run"
    cut = tmp_path / "cut.jsonl"
    cut.write_text("".join(lines[:-3]))  # the run killed 3 pairs short
    dropped = {(r["case_id"], r["backend"]) for r in map(json.loads, lines[-3:])}
    merged = merge_shards([cut])
    assert set(merged.missing_pairs) == dropped and merged.missing_count == 3
    assert merged.header.selection == {}  # nothing invented for an old header


# ------------------------------------------------------------------------------------------- the runner's parts


def test_select_run_selects_checks_and_starts_nothing(tmp_path: Path) -> None:
    config = RunConfig(backends=("sdpa-cpu",), suite="smoke", shard=(1, 3), limit=2, seed=5, tol=("factor=2",))
    selected = select_run(config)
    assert [c.id for c in selected.cases] == [c.id for c in select_cases("smoke", shard=(1, 3), limit=2)]
    assert selected.selection == config.selection and len(selected.placements) == 1 and selected.warning is None
    ident = selected.identity
    assert ident["suite"] == "smoke" and ident["cases"] == 2 and ident["seed"] == 5
    assert ident["selection"]["shard"] == [1, 3] and ident["tol_args"]["tol"] == ["factor=2"]
    assert len(selected.overrides) == 1 and ident["tol"] == [dict(selected.overrides[0])]
    assert not list(tmp_path.iterdir())
    for bad, message in [
        ({"backends": ()}, "give at least one --backend"),
        ({"backends": ("no-such-kernel",)}, "unknown backend 'no-such-kernel'"),
        ({"tol": ("not-a-key=1",)}, "tolerance overrides:"),
        ({"suite": "no-such-suite"}, "--suite must be one of"),
        ({"jobs": 2, "gpus": "0"}, "--gpus"),  # no GPU here
        ({"time": True, "jobs": 2}, None),  # a warning, not a refusal
    ]:
        if message is None:
            assert "--time with 2 workers" in (select_run(dataclasses.replace(config, **bad)).warning or "")
            continue
        with pytest.raises(UsageError, match=message):
            select_run(dataclasses.replace(config, **bad))


def test_plan_pairs_is_the_pairs_still_to_run_in_order(tmp_path: Path) -> None:
    cases = tiny_cases(3)
    config = RunConfig(backends=(EXACT, LSE), case_json=case_file(tmp_path, cases), schedule="fifo", seed=3)
    selected = select_run(config)
    infos = {EXACT: {"name": "fake-exact", "available": "yes"}, LSE: {"name": "fake-lse", "available": "no"}}
    kept = CheckResult(cases[1].id, "fake-exact", "fake", Status.PASS, cases[1].to_json())
    stray = CheckResult("another-case", "fake-exact", "fake", Status.PASS, {})
    plan = plan_pairs(config, selected, infos, {(kept.case_id, kept.backend): kept, ("another-case", "x"): stray}, [])
    assert plan.pairs == [(c, s) for c in cases for s in (EXACT, LSE)]
    assert plan.todo == {(c.id, s) for c, s in plan.pairs} - {(cases[1].id, EXACT)}
    assert [[(p.case.id, p.spec) for p in u] for u in plan.units] == [
        [(cases[0].id, EXACT), (cases[0].id, LSE)],
        [(cases[1].id, LSE)],
        [(cases[2].id, EXACT), (cases[2].id, LSE)],
    ]
    request = plan.units[0][1].request
    assert request["op"] == "check" and request["seed"] == 3 and request["backend"] == LSE and not request["available"]
    assert plan.units[0][0].request["available"]
    assert plan.recorded == [kept] and plan.already_recorded == 2 and plan.workers == 1
    everything = {(c.id, infos[s]["name"]): kept for c, s in plan.pairs}
    done = plan_pairs(config, selected, infos, everything, [])
    assert done.units == [] and done.todo == set() and done.workers == 0 and len(done.recorded) == 6


def test_run_header_holds_the_selection_and_the_run_options(tmp_path: Path) -> None:
    config = RunConfig(
        backends=(EXACT,), case_json=case_file(tmp_path, tiny_cases(2)), argv=("attnconf", "run", "--x"), seed=9
    )
    selected = select_run(config)
    infos = {EXACT: {"name": "fake-exact", "version": "1"}}
    plan = plan_pairs(config, selected, infos, {}, [])
    h = run_header(config, selected, plan, {"host": "h"}, infos, compile=None, checks_at=1.5, started="T")
    assert h.selection == config.selection.to_json() and Selection.from_json(h.selection) == config.selection
    assert h.sweep == selected.identity and h.suite == "custom" and h.argv == ["attnconf", "run", "--x"]
    assert h.backends == {"fake-exact": infos[EXACT]} and h.env["host"] == "h" and h.started == "T"
    run = h.env["run"]
    assert run["cases"] == 2 and run["seed"] == 9 and run["jobs"] == 1 and run["checks_at_s"] == 1.5
    assert run["already_recorded"] == 0 and run["compile"] is None and run["shard"] is None


def test_execute_writes_the_header_and_every_planned_record(tmp_path: Path) -> None:
    cases = tiny_cases(2)
    out = tmp_path / "r.jsonl"
    config = RunConfig(backends=(EXACT, LSE), case_json=case_file(tmp_path, cases), out=out, progress=False)
    selected = select_run(config)
    clients = [WorkerClient()]
    summary, state = RunSummary(out=out), RunState(RunClock(0.0))
    try:
        env, infos, jit = describe_backends(clients[0], config)
        plan = plan_pairs(config, selected, infos, {}, [])
        state.workers = plan.workers
        execute(config, selected, plan, clients, summary, state, env=env, infos=infos, jit=jit)
    finally:
        for client in clients:
            client.close()
    [header], results = read_records(out)
    assert Selection.from_json(header.selection) == config.selection
    verdicts = (("fake-exact", Status.PASS), ("fake-lse-sign", Status.FAIL))
    assert sorted((r.case_id, r.backend, r.status) for r in results) == sorted(
        (c.id, name, status) for c in cases for name, status in verdicts
    )
    assert summary.written == 4 and summary.workers == 1 and state.n_before == 0 and state.checks_at is not None


class _Client:
    """What :func:`summarize` asks of a worker client."""

    def __init__(self, starts: int) -> None:
        self.starts, self.start_s, self.calls = starts, [0.25] * starts, []
        self.wait_s, self.adopted = [0.5] * starts, starts - 1  # every restart took a spare

    def close_input(self) -> None:
        self.calls.append("close_input")

    def close(self) -> None:
        self.calls.append("close")


def test_summarize_closes_the_workers_and_profiles_this_runs_records_only() -> None:
    case = tiny_cases(1)[0]
    summary = RunSummary(out=Path("r.jsonl"))
    summary.keep_recorded([CheckResult(case.id, "old", "f", Status.PASS, case.to_json())])  # the resumed file's
    summary.add(CheckResult(case.id, "new", "f", Status.PASS, case.to_json()))
    clients = [_Client(2), _Client(1)]
    state = RunState(RunClock(0.0), workers=2, n_before=1, checks_at=0.5)
    assert summarize(summary, clients, state) is summary  # type: ignore[arg-type]  # duck-typed clients
    assert [c.calls for c in clients] == [["close_input", "close"]] * 2 and summary.worker_starts == 3
    assert summary.wall_s > 0 and summary.profile is not None
    assert set(summary.profile.backends) == {"new"} and summary.profile.workers == 2
    assert summary.profile.checks_at_s == 0.5 and summary.profile.compile is None
    live = summary.profile.live
    assert live["worker_starts_s"] == [0.25] * 3 and live["restarts"] == 1 and live["restarts_from_spare"] == 1
    assert live["worker_wait_s"] == 1.5 and live["restart_wait_s"] == 0.5


# ------------------------------------------------------------------------------------------- resume of an old file


def test_a_file_with_an_old_header_resumes_and_merges(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    args = ["run", "--case-json", case_file(tmp_path, tiny_cases(2)), "--backend", EXACT, "--device", "cpu"]
    args += ["--no-progress", "--jobs", "1", "--out", str(out)]
    assert main(args) == 0
    lines = out.read_text().splitlines(keepends=True)
    header = json.loads(lines[0])
    assert Selection.from_json(header.pop("selection")).case_json == args[2]
    with gzip.open(COMMITTED, "rt") as fh:
        assert set(header) == set(json.loads(fh.readline()))  # the format of a committed header, exactly
    out.write_text(json.dumps(header) + "\n" + lines[1])  # an old run, killed one pair short
    assert main([*args, "--resume"]) == 0
    headers, results = read_records(out)
    assert [h.selection == {} for h in headers] == [True, False] and len(results) == 2
    assert headers[1].env["run"]["already_recorded"] == 1
    merged = merge_shards([out])
    assert merged.complete and merged.missing_count == 0 and len(merged.results) == 2
