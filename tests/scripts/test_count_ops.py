"""scripts/count_ops.py: what one check costs in torch ops and device waits, phase by phase (issue 30), and the guard
on today's figures: every host read and launch of a worker waits behind the other 14 processes sharing a GPU, so a
change that adds one to every check must be seen.  Counts are deterministic (times are not): the same case, seed and
code give the same numbers on any machine.  The figures below are those of this tree; lower them when a change cuts
more, never raise them without saying why in docs/concepts/performance.md."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from conformance.cases.case import AttentionCase

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "count_ops.py"

#: a small paged decode-and-append case of the kind peer-fa2-kvcache holds: GQA, causal, two requests
CASE = AttentionCase(
    requests=((1, 40), (3, 70)),
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    dtype="fp16",
    causal=True,
    append=True,
    kv_layout="NHD",
    block_size=16,
)

#: the harness's device waits (host reads + host-to-device copies + synchronisations) of one check of CASE, per
#: phase, as a GPU run makes them, today (before issue 30's cuts, 39: inputs 12 copies, reference 10, baseline 2,
#: guard 2, compare 9 reads, and the same 4 synchronisations that time the phases: 3 of the context, 1 of the kernel;
#: 10 before the lengths known on the host, conformance.cases.inputs.host_ints: reference 2 and baseline 1 reads)
WAITS = {"inputs": 1, "reference": 0, "baseline": 0, "context": 3, "check": 1, "guard": 0, "compare": 0, "read": 2}
#: launches (ops that run a kernel on a device) of the harness's part of that check, today (before: 620)
LAUNCHES = 344


def _load():
    spec = importlib.util.spec_from_file_location("count_ops", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def count_ops():
    return _load()


@pytest.fixture(scope="module")
def row(count_ops):
    count_ops.count_checks([CASE], ["sdpa-cpu"], "cpu")  # a process's first check also fills its caches
    rows = count_ops.count_checks([CASE], ["sdpa-cpu"], "cpu")
    assert len(rows) == 1 and rows[0]["status"] == "pass"
    return rows[0]


def test_a_checks_device_waits_stay_at_todays_figures(row, count_ops) -> None:
    phases = row["phases"]
    waits = {p: phases[p].waits for p in WAITS if p in phases}
    assert waits == {p: n for p, n in WAITS.items() if n or p in phases}, waits
    harness = sum(c.waits for p, c in phases.items() if p in count_ops.HARNESS)
    assert harness == sum(WAITS.values())


def test_a_checks_launches_stay_at_todays_figure(row, count_ops) -> None:
    launches = sum(c.launches for p, c in row["phases"].items() if p in count_ops.HARNESS)
    assert launches <= LAUNCHES, f"{launches} launches in the harness's part of one check (today {LAUNCHES})"


def test_the_counts_are_deterministic(row, count_ops) -> None:
    again = count_ops.count_checks([CASE], ["sdpa-cpu"], "cpu")[0]["phases"]
    assert {p: (c.ops, c.launches, c.reads, c.h2d) for p, c in again.items()} == {
        p: (c.ops, c.launches, c.reads, c.h2d) for p, c in row["phases"].items()
    }


def test_reads_of_device_tensors_count_and_host_ones_do_not(count_ops) -> None:
    """A tensor made with a device (the run's, here the CPU) is a device tensor: its reads are waits; one made
    without a device is on the host on every run, and so is what is computed from host tensors alone."""
    tally = count_ops.Tally()
    with count_ops.instrumented(tally), count_ops._Counting(tally):
        with tally.phase("compare"):
            dev = torch.zeros(4, device="cpu")
            float(dev.sum())  # a device read
            dev.tolist()  # another
            host = torch.arange(4)
            (host + 1).tolist()  # a host read
            int(host.max())  # another
            torch.nonzero(dev)  # a device read (its size depends on the values)
    counts = tally.take()["compare"]
    assert (counts.reads, counts.host_reads) == (3, 2)
    assert counts.launches == 3  # zeros (fill), sum, nonzero's: the host ops launch nothing


def test_the_inputs_move_to_the_device_waits_once_for_the_pinned_copies(count_ops, monkeypatch) -> None:
    """As on a GPU: the small tensors' copies from pinned memory end in one wait, a large one waits on its own."""
    from conformance.cases import inputs as inputs_mod

    def moved() -> tuple[int, int]:
        tally = count_ops.Tally()
        with count_ops.instrumented(tally):
            with tally.phase("inputs"):
                inputs = inputs_mod.make_inputs(CASE, 0, "cpu")
        return tally.take()["inputs"].h2d, sum(isinstance(v, torch.Tensor) for v in vars(inputs).values())

    waits, tensors = moved()
    assert waits == 1 == WAITS["inputs"] and tensors == 12
    monkeypatch.setattr(inputs_mod, "PINNED_MAX_BYTES", 200)  # the caches and q/k/v are larger: blocking copies
    waits, _ = moved()
    tensors_over = [v for v in vars(inputs_mod.make_inputs(CASE, 0, "cpu")).values() if isinstance(v, torch.Tensor)]
    assert waits == 1 + sum(1 for v in tensors_over if v.nbytes > 200)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_inputs_moved_through_pinned_memory_are_the_host_ones() -> None:
    from conformance.cases.inputs import make_inputs

    host, dev = make_inputs(CASE, 3, "cpu"), make_inputs(CASE, 3, "cuda")
    for name, value in vars(host).items():
        if isinstance(value, torch.Tensor):
            assert getattr(dev, name).device.type == "cuda" and torch.equal(getattr(dev, name).cpu(), value), name
