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


def test_a_worker_over_its_share_of_the_gpu_empties_its_cache_between_cases(monkeypatch: pytest.MonkeyPatch) -> None:
    """12 workers on one H100 held the cached blocks of their largest case (34 CUDA OOMs, retried alone at the end of
    ``default``): between cases a worker over 90 % / sharing of the GPU's memory gives its unused blocks back."""
    import torch

    from conformance.running.pool import GPU_SHARING_ENV

    class Props:
        total_memory = 80 * 2**30

    state = {"reserved": 0, "emptied": 0}
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: Props())
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: state["reserved"])
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: state.__setitem__("emptied", state["emptied"] + 1))
    monkeypatch.setenv(GPU_SHARING_ENV, "12")
    w = worker_mod._Worker()
    assert not w.trim_cuda_cache("cpu")
    share = int(80 * 2**30 * 0.9 / 12)
    state["reserved"] = share
    assert not w.trim_cuda_cache("cuda") and state["emptied"] == 0
    assert w.cuda_cap == share
    state["reserved"] = share + 1
    assert w.trim_cuda_cache("cuda") and state["emptied"] == 1
    monkeypatch.setenv(GPU_SHARING_ENV, "junk")
    w = worker_mod._Worker()
    state["reserved"] = int(80 * 2**30 * 0.9) - 1  # alone on the GPU (a bad value counts as 1)
    assert not w.trim_cuda_cache("cuda:0")


def test_a_backend_lost_after_the_run_began_is_an_error_not_a_refusal(tmp_path) -> None:
    """Before: a GPU that faulted and refused new workers turned every remaining pair into 'unsupported: not
    available here' (1,054 pairs of an H100 probe, issue 31's ledger work): the run then judged less and said so
    nowhere.  The run's describe step found the backend available, so a worker that does not is an error."""
    from conformance.cli import main
    from conformance.results_file import read_records
    from tests.conformance.fakes import LostDeviceBackend

    case = _case()
    w = worker_mod._Worker()
    LostDeviceBackend.asked = 1  # the describe step has asked already
    plain = w.check(_request(case, f"{FAKES}:LostDeviceBackend"))["result"]
    assert plain["status"] == Status.UNSUPPORTED.value  # not known to have been available: a refusal
    w = worker_mod._Worker()
    lost = w.check({**_request(case, f"{FAKES}:LostDeviceBackend"), "available": True})["result"]
    assert lost["status"] == Status.ERROR.value
    assert "not available in this worker, though it was when the run began" in lost["reason"]
    assert "planted: the device was lost" in lost["reason"]
    out = tmp_path / "r.jsonl"
    args = ["run", "--backend", f"{FAKES}:LostDeviceBackend", "--device", "cpu", "--jobs", "1", "--no-progress"]
    assert (
        main(
            [
                *args,
                "--case-json",
                '{"requests": [[1, 4]], "head_dim": 16, "num_heads": 1, "num_kv_heads": 1}',
                "--out",
                str(out),
            ]
        )
        == 1
    )
    _, (record,) = read_records(out)
    assert record.status == Status.ERROR and "though it was when the run began" in record.reason
