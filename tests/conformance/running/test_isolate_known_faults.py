"""Pairs the known-failure ledger expects to end their worker run after every other pair (issue 30: on one H100 a
six-kernel ``default`` run restarted workers 91 times after FA4's known faults, and each fresh worker paid every
backend's first call again for the next case it was given)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from conformance.cases.case import AttentionCase
from conformance.reporting.ledger import load_ledger, load_ledger_dir
from conformance.running.pairs import RunConfig, _Pair
from conformance.running.runner import _isolate_known_faults
from conformance.running.schedule import split_last


def case(**kw) -> AttentionCase:
    base = dict(requests=((3, 300),), num_heads=4, num_kv_heads=2, head_dim=64)
    return AttentionCase(**{**base, **kw})


def unit(c: AttentionCase, *specs: str) -> list[_Pair]:
    return [_Pair(c, s, {}) for s in specs]


def test_split_last_moves_the_picked_pairs_into_units_of_their_own_in_order() -> None:
    a, b, c = case(head_dim=64), case(head_dim=80), case(head_dim=96)
    units = [unit(a, "x", "k"), unit(b, "k"), unit(c, "x", "y")]
    kept, moved = split_last(units, lambda p: p.spec == "k")
    assert [[(p.case.head_dim, p.spec) for p in u] for u in kept] == [[(64, "x")], [(96, "x"), (96, "y")]]
    assert [[(p.case.head_dim, p.spec) for p in u] for u in moved] == [[(64, "k")], [(80, "k")]]
    assert split_last(units, lambda p: False) == (units, [])


LEDGER = """
[[failure]]
reason = "faults"
statuses = ["fail", "error"]
messages = { error = ["an illegal memory access was encountered"] }
versions = ">=2.0"
[failure.when]
head_dim = 80

[[failure]]
reason = "wrong numbers, an error of its own"
statuses = ["fail", "error"]
messages = { error = ["RuntimeError: no kernel"] }
[failure.when]
head_dim = 96

[[failure]]
reason = "hangs"
statuses = ["timeout"]
[failure.when]
head_dim = 112
"""


@pytest.fixture
def ledgers(tmp_path: Path) -> Path:
    (tmp_path / "kern.toml").write_text(LEDGER)
    return tmp_path


def test_an_entry_loses_the_worker_on_a_crash_a_timeout_or_a_context_poisoning_error(ledgers: Path) -> None:
    faults, other_error, hangs = load_ledger_dir(ledgers).entries
    assert faults.loses_worker and hangs.loses_worker and not other_error.loses_worker
    assert faults.expects_lost_worker(case(head_dim=80), "2.1")
    assert not faults.expects_lost_worker(case(head_dim=80), "1.9")  # before the range
    assert not faults.expects_lost_worker(case(head_dim=64), "2.1")  # not its case


INFOS = {"kern": {"name": "kern", "version": "2.1"}, "other": {"name": "other", "version": "1.0"}}


def config(ledgers: Path, **kw) -> RunConfig:
    return RunConfig(backends=("other", "kern"), device="cuda", ledger_dir=ledgers, **kw)


def test_the_run_moves_the_pairs_its_ledger_expects_to_end_a_worker_on_cuda_only(ledgers: Path) -> None:
    units = [unit(case(head_dim=d), "other", "kern") for d in (64, 80, 96, 112)]
    kept, moved = _isolate_known_faults(config(ledgers), units, INFOS)
    assert [[(p.case.head_dim, p.spec) for p in u] for u in moved] == [[(80, "kern")], [(112, "kern")]]
    assert sum(len(u) for u in kept) == 6 and all(len(u) == 2 or u[0].spec == "other" for u in kept)
    assert _isolate_known_faults(config(ledgers, isolate_known_faults=False), units, INFOS) == (units, [])
    cpu = dataclasses.replace(config(ledgers), device="cpu")
    assert _isolate_known_faults(cpu, units, INFOS) == (units, [])
    old = {**INFOS, "kern": {"name": "kern", "version": "1.0"}}  # the faulting entry's range starts at 2.0
    assert [[p.case.head_dim for p in u] for u in _isolate_known_faults(config(ledgers), units, old)[1]] == [[112]]
    broken = ledgers / "broken"
    broken.mkdir()
    (broken / "kern.toml").write_text("[[failure]]\nreason = 1\n")
    assert _isolate_known_faults(config(broken), units, INFOS) == (units, [])  # the run reports the ledger later


def test_the_shipped_fa4_loader_fault_is_run_last() -> None:
    """fa4.toml's non-TMA paged loader entry (illegal memory access at d160 beyond one key tile) loses the worker; its
    wrong-output sibling at d80 does not."""
    fa4 = load_ledger().for_backend("fa4")
    paged = dict(kv_layout="NHD", block_size=16, requests=((64, 700),))
    assert any(e.expects_lost_worker(case(head_dim=160, **paged), "4.0.0b36") for e in fa4)
    assert not any(e.expects_lost_worker(case(head_dim=80, **paged), "4.0.0b36") for e in fa4)
