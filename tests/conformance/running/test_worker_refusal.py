"""A backend that refuses a case is answered from the case alone: no inputs, reference or baseline are built for it
(issue 30 item 3: a single-backend run of ``default`` on fa2 refuses 3,362 of 5,399 cases, each of which paid the
whole case context before)."""

from __future__ import annotations

import pytest

from conformance.cases.case import AttentionCase
from conformance.records import Status
from conformance.running import worker as worker_mod
from conformance.verdict import check as check_mod

FAKES = "tests.conformance.fakes"


def _case(**fields) -> AttentionCase:
    base = dict(num_heads=2, num_kv_heads=2, head_dim=16, dtype="fp32", requests=((3, 5), (1, 4)))
    return AttentionCase(**{**base, **fields})


def _request(case: AttentionCase, backend: str) -> dict:
    return {"op": "check", "case": case.to_json(), "backend": backend, "seed": 0, "device": "cpu"}


def test_a_refused_case_builds_no_context(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[str] = []
    real = check_mod.prepare_context

    def counting(case, seed=0, device="cpu"):
        built.append(case.id)
        return real(case, seed, device)

    monkeypatch.setattr(check_mod, "prepare_context", counting)
    w = worker_mod._Worker()
    sinks = _case(sinks=True)
    reply = w.check(_request(sinks, f"{FAKES}:RefusesSinksBackend"))
    record = reply["result"]
    assert record["status"] == Status.UNSUPPORTED.value
    assert "planted refusal" in record["reason"]
    assert built == []  # the refusal needed no tensor
    assert "context_s" not in reply["phases"]
    # the same case on a backend that runs it builds the context once, then a refusal of it reuses nothing
    reply = w.check(_request(sinks, f"{FAKES}:ExactBackend"))
    assert reply["result"]["status"] == Status.PASS.value
    assert built == [sinks.id]
    reply = w.check(_request(sinks, f"{FAKES}:RefusesSinksBackend"))
    assert reply["result"]["status"] == Status.UNSUPPORTED.value
    assert built == [sinks.id]


def test_the_refusal_record_is_the_one_check_backend_writes() -> None:
    from attnfast.registry import get_backend  # noqa: F401 - the registry resolves module:Class names too
    from conformance.running.env import resolve_backend

    case = _case(sinks=True)
    backend = resolve_backend(f"{FAKES}:RefusesSinksBackend")
    direct = check_mod.refusal(case, backend, "cpu", 0)
    via_check = check_mod.check_backend(check_mod.prepare_context(case, 0, "cpu"), backend)
    keep = ("case_id", "backend", "family", "status", "case", "reason", "version", "device", "seed", "repro")
    assert direct is not None
    assert {k: getattr(direct, k) for k in keep} == {k: getattr(via_check, k) for k in keep}
    assert check_mod.refusal(_case(), backend, "cpu", 0) is None
