"""The verdict's numbers read to the host together (:mod:`conformance.verdict.hostread`) and the fingerprints made
in few launches (:mod:`conformance.verdict.fingerprint`): both must give exactly what one read per value, and the
digest as it was first written (one chunk loop per tensor, kept below as the oracle), gave."""

from __future__ import annotations

import math

import pytest
import torch

from conformance.verdict import fingerprint
from conformance.verdict.hostread import Pending, read_host


def test_read_host_is_exact_and_keeps_the_order() -> None:
    floats = [
        torch.tensor(1.0 / 3.0, dtype=torch.float32),
        torch.tensor(math.pi, dtype=torch.float64),
        torch.tensor(2**53 - 1, dtype=torch.int64),
        torch.tensor(True),
        torch.tensor(-0.0, dtype=torch.float64),
        torch.tensor(float("nan")),
        torch.tensor(-float("inf"), dtype=torch.float64),
        torch.tensor(0.1, dtype=torch.float16),
        torch.tensor(7, dtype=torch.int32),
    ]
    ints = [torch.tensor([2**62 + 1, -(2**63)], dtype=torch.int64), torch.tensor(5, dtype=torch.int32)]
    got_f, got_i = read_host(floats, ints)
    want = [float(f.to(torch.float64)) for f in floats]
    assert [repr(x) for x in got_f] == [repr(x) for x in want]  # -0.0, nan and the digits all kept
    assert got_i == [2**62 + 1, -(2**63), 5]
    assert read_host([], []) == ([], [])
    assert read_host([], [torch.zeros(0, dtype=torch.int64)]) == ([], [])


@pytest.mark.parametrize(
    "ints, want",
    [
        ([torch.tensor([[True, False], [False, True]])], [1, 0, 0, 1]),  # alone on its device: still ints
        ([torch.tensor([[3, -4, 5]], dtype=torch.int32)], [3, -4, 5]),
        ([torch.tensor([7], dtype=torch.int8), torch.tensor([[True]]), torch.tensor([[-9, 2**40]])], [7, 1, -9, 2**40]),
    ],
)
def test_read_host_gives_python_ints_of_every_integer_dtype(ints: list[torch.Tensor], want: list[int]) -> None:
    for floats in ([], [torch.tensor(0.5, dtype=torch.float16)]):
        got_f, got_i = read_host(floats, ints)
        assert got_i == want and all(type(x) is int for x in got_i)
        assert got_f == [0.5] * len(floats)


def test_read_host_reads_once(monkeypatch) -> None:
    reads = []
    tolist = torch.Tensor.tolist

    def counted(self):
        reads.append(self.numel())
        return tolist(self)

    monkeypatch.setattr(torch.Tensor, "tolist", counted)
    read_host([torch.tensor(1.0), torch.tensor(2, dtype=torch.int64)], [torch.arange(3)])
    assert reads == [5]


def test_pending_reads_floats_or_ints() -> None:
    assert Pending([torch.tensor(0.5), torch.tensor(3)], lambda v: v).read() == [0.5, 3.0]
    assert Pending([torch.tensor([2**60, 1])], lambda v: v, ints=True).read() == [2**60, 1]


def _oracle(t: torch.Tensor) -> str:
    """The digest as first written: chunks of ``_DIGEST_CHUNK`` words, each weighted by its own arange."""
    flat = t.detach().contiguous().view(-1)
    words = flat.view(torch.int16) if flat.element_size() % 2 == 0 else flat
    total = weighted = 0
    for start in range(0, words.numel(), fingerprint._DIGEST_CHUNK):
        v = words[start : start + fingerprint._DIGEST_CHUNK].to(torch.int64)
        w = torch.arange(start, start + v.numel(), dtype=torch.int64) % fingerprint._DIGEST_PERIOD + 1
        total, weighted = total + int(v.sum()), weighted + int((v * w).sum())
    return f"{total & (2**64 - 1):x}.{weighted & (2**64 - 1):x}.{words.numel()}"


def _tensors() -> dict[str, torch.Tensor | None]:
    g = torch.Generator().manual_seed(0)
    return {
        "fp32": torch.randn(33, 5, 7, generator=g),
        "empty": torch.zeros(0),
        "fp16": torch.randn(3, generator=g).half(),
        "none": None,
        "fp8": torch.randn(7, 3, generator=g).to(torch.float8_e4m3fn),
        "bool": torch.tensor([True, False, True]),
        "int32": torch.randint(-5, 5, (1000,), dtype=torch.int32, generator=g),
        "strided": torch.randn(5, 100, generator=g).t(),
        "int8": (torch.randn(400, generator=g) * 100).to(torch.int8),
        "int64": torch.randint(-(2**62), 2**62, (77,), generator=g),
        "scalar": torch.tensor(5.0),
        "large": (torch.ones(4000) * 60000).half(),  # every word's weighted term near the top of its range
        "bf16": torch.randn(2500, generator=g).bfloat16(),
    }


@pytest.mark.parametrize(
    ("period", "chunk", "small"),
    [(1_000_003, 1 << 24, 1 << 16), (7, 10, 4), (10, 7, 100), (13, 13, 13), (5, 1000, 3), (101, 1 << 24, 50)],
)
def test_fingerprints_are_the_digest_as_first_written(monkeypatch, period: int, chunk: int, small: int) -> None:
    """Pieces of whole periods, stretches within one, and the small tensors digested together: the same texts as the
    plain chunk loop, for every dtype, a non-contiguous tensor, an empty one and None, whatever the period, the
    chunk and the small tensors' bound (small ones here, so that every path runs on small tensors)."""
    monkeypatch.setattr(fingerprint, "_DIGEST_PERIOD", period)
    monkeypatch.setattr(fingerprint, "_DIGEST_CHUNK", chunk)
    monkeypatch.setattr(fingerprint, "_SMALL", small)
    tensors = _tensors()
    got = fingerprint.fingerprints(tensors)
    assert list(got) == list(tensors)
    assert got == {k: "-" if t is None else _oracle(t) for k, t in tensors.items()}


def test_a_change_of_one_word_changes_its_tensors_fingerprint_only() -> None:
    tensors = _tensors()
    before = fingerprint.fingerprints(tensors)
    t = tensors["fp32"]
    assert t is not None
    changed = t.clone()
    changed.view(-1)[100] += 1
    after = fingerprint.fingerprints({**tensors, "fp32": changed})
    assert {k for k in before if before[k] != after[k]} == {"fp32"}
