"""Longest case first: the cost estimate, the order, the work feed's weights, and the makespan they buy."""

from __future__ import annotations

import heapq
import json
from pathlib import Path

import pytest

from conformance.cases.case import AttentionCase
from conformance.cli import main
from conformance.records import CheckResult, Status
from conformance.results_file import read_records
from conformance.running.pairs import _Pair
from conformance.running.pool import FAKE_GPUS_ENV, WorkFeed
from conformance.running.runner import RunConfig, run
from conformance.running.schedule import CostModel, case_size, order_units, schedule_units
from tests.conformance.fakes import SLEEP_RATE_ENV

SLEEPY = "tests.conformance.fakes:SleepBySizeBackend"


def case(q: int, k: int, heads: int = 2, d: int = 16) -> AttentionCase:
    return AttentionCase(requests=((q, k),), num_heads=heads, num_kv_heads=1, head_dim=d, dtype="fp16")


def unit(c: AttentionCase, *specs: str) -> list[_Pair]:
    return [_Pair(c, s, {}) for s in specs or ("a",)]


def test_case_size_counts_the_attentions_multiply_adds() -> None:
    c = AttentionCase(requests=((3, 5), (2, 7)), num_heads=4, num_kv_heads=2, head_dim=32, dtype="fp16")
    assert case_size(c) == (3 * 5 + 2 * 7) * 4 * (32 + 32)


def _measured(c: AttentionCase, backend: str, worker_s: float, context: float = 0.0) -> CheckResult:
    t = {"in": context / 2, "ref": context / 2} if context else {}
    return CheckResult(
        case_id=c.id, backend=backend, family="f", status=Status.PASS, case=c.to_json(),
        extra={"worker_s": worker_s, "t": t},
    )  # fmt: skip


def test_measured_costs_win_and_the_rest_follow_a_fitted_line() -> None:
    sizes = [case(q, q) for q in (4, 8, 16, 32)]
    # a measured run: context 1 ms per 1000 MACs, checks of "b" 2 ms per 1000 MACs
    records = [_measured(c, "b", 2e-6 * case_size(c) + 1e-6 * case_size(c), 1e-6 * case_size(c)) for c in sizes]
    model = CostModel.from_records(records)
    assert model.context_line == pytest.approx((0.0, 1e-6), abs=1e-9)
    assert model.pair_line["b"] == pytest.approx((0.0, 2e-6), abs=1e-9)
    big = sizes[-1]
    assert model.unit_cost(big, ["b"]) == pytest.approx(3e-6 * case_size(big))
    new = case(64, 64)  # never measured: from the lines
    assert model.unit_cost(new, ["b"]) == pytest.approx(3e-6 * case_size(new))
    # a small case measured slow goes by its measurement, not its size
    slow = [*records, _measured(sizes[0], "b", 50.0, 0.0)]
    assert CostModel.from_records(slow).unit_cost(sizes[0], ["b"]) >= 50.0
    # crashes and timeouts cost their round trip
    timeout = CheckResult(
        case_id=new.id, backend="b", family="f", status=Status.TIMEOUT, case=new.to_json(),
        extra={"roundtrip_s": 300.0},
    )  # fmt: skip
    assert CostModel.from_records([timeout]).unit_cost(new, ["b"]) >= 300.0


def test_units_go_longest_first_deterministically() -> None:
    units = [unit(case(q, k)) for q, k in ((2, 2), (9, 9), (3, 3), (3, 27), (1, 1))]
    ordered = order_units(units, {u[0].case.id: case_size(u[0].case) for u in units})
    assert [u[0].case.requests[0] for u in ordered] == [(9, 9), (3, 27), (3, 3), (2, 2), (1, 1)]  # ties: as given
    again, cost = schedule_units(units, {"a": "a"}, [], "cost")
    assert [u[0].case.id for u in again] == [u[0].case.id for u in ordered] and len(cost) == 5
    fifo, _ = schedule_units(units, {"a": "a"}, [], "fifo")
    assert fifo == units


def test_the_feed_weighs_groups_by_cost_and_lets_a_long_keyless_case_go_first() -> None:
    units = [["a1"], ["a2"], ["a3"], ["b1"], ["n1"], ["n2"]]
    cost = {"a1": 1, "a2": 1, "a3": 1, "b1": 5, "n1": 4, "n2": 9}
    keys = {"a": ("A",), "b": ("B",), "n": ()}
    ordered = sorted(units, key=lambda u: -cost[u[0]])
    feed = WorkFeed(ordered, keys=lambda u: keys[u[0][0]], cost=lambda u: cost[u[0]])
    assert feed.take(0) == ["n2"]  # 9 s without a key before B's 5 s group
    assert feed.take(1) == ["b1"]  # B (5 s) outweighs A (3 units of 1 s)
    assert feed.take(1) == ["n1"]  # 4 s beats A's next unit (1 s)
    assert feed.take(0) == ["a1"] and feed.take(0) == ["a2"] and feed.owner == {"B": 1, "A": 0}
    # without costs, as before: the largest group by count first, keyless last
    plain = WorkFeed(units, keys=lambda u: keys[u[0][0]])
    assert [plain.take(0) for _ in range(3)] == [["a1"], ["a2"], ["a3"]] and plain.take(1) == ["b1"]


def test_a_kernel_compiled_in_the_compile_phase_stays_with_its_worker() -> None:
    units = [["a1"], ["b1"], ["a2"], ["b2"]]
    feed = WorkFeed(units, keys=lambda u: (u[0][0],))
    feed.hold(1, "a")
    feed.hold(0, "a")  # held already: stays with worker 1
    feed.hold(0, "zzz")  # no unit has it: ignored
    assert feed.take(1) == ["a1"] and feed.take(0) == ["b1"] and feed.take(1) == ["a2"]
    assert feed.owner == {"a": 1, "b": 0}


def makespan(costs: list[float], workers: int, feed: WorkFeed) -> float:
    """List scheduling: each worker takes the feed's next unit when it is free; the time the last one ends."""
    free = [(0.0, w) for w in range(workers)]
    end = 0.0
    while True:
        t, w = heapq.heappop(free)
        got = feed.take(w)
        if got is None:
            return max(end, t)
        end = max(end, t + costs[got[0]])
        heapq.heappush(free, (t + costs[got[0]], w))


@pytest.mark.parametrize("workers", [2, 3, 12])
def test_longest_first_removes_the_tail_of_large_cases_selected_last(workers: int) -> None:
    costs = [0.1] * 120 + [3.0] * (workers - 1) + [6.0]  # many small cases, then a few large ones
    units = [[i] for i in range(len(costs))]
    fifo = makespan(costs, workers, WorkFeed(units))
    ordered = sorted(units, key=lambda u: -costs[u[0]])
    lpt = makespan(costs, workers, WorkFeed(ordered, cost=lambda u: costs[u[0]]))
    bound = sum(costs) / workers + max(costs)
    assert lpt <= bound and lpt < fifo
    assert fifo >= 12 / workers + 6.0 - 1e-9  # FIFO starts the 6 s case only after every small one
    assert lpt == pytest.approx(max(6.0, sum(costs) / workers), abs=0.2)


def _sweep(tmp_path: Path, name: str, cases: list[AttentionCase], schedule: str) -> tuple[float, list[CheckResult]]:
    path = tmp_path / "cases.json"
    path.write_text(json.dumps([c.to_json() for c in cases]))
    config = RunConfig(
        backends=(SLEEPY,), case_json="@" + str(path), out=tmp_path / name, progress=False, jobs=2, gpus="all",
        schedule=schedule,
    )  # fmt: skip
    summary = run(config)
    assert summary.exit_code == 0
    headers, records = read_records(tmp_path / name)
    span = max(r.extra["t"]["at"] for r in records) - headers[0].env["run"]["checks_at_s"]
    return span, records


@pytest.mark.slow
def test_two_workers_finish_sooner_with_the_large_case_first(tmp_path: Path, monkeypatch) -> None:
    """16 small cases (2.4 s in all), then one as long as all of them: in the selection's order the two
    workers share the small ones (1.2 s each) and one of them then runs the large one alone (3.6 s); longest
    first, one runs the large case while the other runs every small one (2.4 s)."""
    monkeypatch.setenv(FAKE_GPUS_ENV, "2")
    small = [case(q, 4) for q in range(1, 17)]
    large = case(16, 34)
    assert case_size(large) == sum(map(case_size, small))
    monkeypatch.setenv(SLEEP_RATE_ENV, str(2.4 / case_size(large)))
    fifo, fifo_records = _sweep(tmp_path, "fifo.jsonl", [*small, large], "fifo")
    lpt, lpt_records = _sweep(tmp_path, "cost.jsonl", [*small, large], "cost")
    print(f"check phase: fifo {fifo:.2f} s, longest first {lpt:.2f} s")
    assert lpt < 0.85 * fifo
    assert {r.extra["gpu"] for r in lpt_records} == {"0", "1"}  # placed on both (pretend) GPUs
    strip = lambda rs: sorted((r.case_id, r.status, r.stats) for r in rs)  # noqa: E731
    assert strip(fifo_records) == strip(lpt_records)


def test_costs_file_must_be_a_results_file(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "junk.jsonl").write_text("not json\n")
    base = ["run", "--backend", "sdpa-cpu", "--device", "cpu", "--suite", "smoke", "--limit", "1", "--no-progress"]
    assert main([*base, "--costs", "missing.jsonl"]) == 2
    assert "--costs missing.jsonl: no such file" in capsys.readouterr().err
    assert main([*base, "--costs", "junk.jsonl"]) == 2
    assert "--costs junk.jsonl" in capsys.readouterr().err
    assert main([*base, "--schedule", "random"]) == 2
    assert not (tmp_path / "results.jsonl").exists()
