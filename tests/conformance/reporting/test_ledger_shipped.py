"""Each shipped ledger entry recognises a case of its cause that no suite holds, and not the neighbour that differs
in the one field the cause needs (the test fails if a predicate is widened or narrowed past its evidence)."""

from __future__ import annotations

import dataclasses

import pytest

from conformance.cases.case import AttentionCase
from conformance.records import CheckResult, Status
from conformance.reporting.ledger import load_ledger


def c(**kw) -> AttentionCase:
    base = dict(requests=((3, 300), (1, 77)), num_heads=4, num_kv_heads=2, head_dim=64)
    return AttentionCase(**{**base, **kw})


P16 = dict(kv_layout="NHD", block_size=16)

# (backend, version, the entry's reason starts with, a case of the cause, its neighbour)
CASES = [
    # FA4 sm_90 non-TMA loader, d80/d96: page 16 matches; page 144 (TMA) or causal (tile 128) does not
    (
        "fa4",
        "4.0.0b36",
        "sm_90, paged KV through the non-TMA loader (page size != key tile 144)",
        c(head_dim=80, **P16),
        c(head_dim=80, kv_layout="NHD", block_size=144),
    ),
    (
        "fa4",
        "4.0.0b36",
        "sm_90, paged KV through the non-TMA loader (page size != key tile 144)",
        c(head_dim=96, **P16),
        c(head_dim=96, causal=True, **P16),
    ),
    (
        "fa4",
        "4.0.0b36",
        "sm_90, paged KV through the non-TMA loader (page size != key tile 144)",
        c(head_dim=80, head_dim_v=8, v_padded=True, **P16),
        c(head_dim=80, head_dim_v=8, v_padded=True),
    ),
    # d160: any page but 112, causal too; a window (tile 96) is right
    (
        "fa4",
        "4.0.0b36",
        "sm_90, paged KV through the non-TMA loader (page size != key tile 112)",
        c(head_dim=160, causal=True, **P16),
        c(head_dim=160, window=(32, 0), **P16),
    ),
    (
        "fa4",
        "4.0.0b36",
        "sm_90, paged KV through the non-TMA loader (page size != key tile 112)",
        c(head_dim=160, **P16),
        c(head_dim=192, **P16),
    ),
    # at most one key tile: the flaky entry, not the steady one
    (
        "fa4",
        "4.0.0b36",
        "sm_90 non-TMA paged loader, d80/d96 (tile 144) and d160 (tile 112), at most one key tile",
        c(requests=((37, 37),), head_dim=96, **P16),
        c(requests=((37, 37),), head_dim=64, **P16),
    ),
    (
        "fa4",
        "4.0.0b36",
        "sm_90, paged KV through the non-TMA loader (page size != key tile 80), head dim 208",
        c(head_dim=208, **P16),
        c(head_dim=256, **P16),
    ),
    # the fork's default q_v scale: any dims, unless a scale is given
    (
        "fa3-vllm",
        "0.24.0",
        "vLLM's FA3 wrapper defaults to softmax_scale 1/sqrt(d) even with q_v",
        c(head_dim=32, head_dim_v=128, qv=True, **P16),
        c(head_dim=32, head_dim_v=128, qv=True, scale=0.08),
    ),
    # sinks with a keyless query tile: a kv_len-0 request; the neighbour's keyless rows share a tile with keyed ones
    (
        "fa3-vllm",
        "0.24.0",
        "with s_aux, rows that see no key get LSE -inf",
        c(requests=((7, 0), (2, 9)), sinks=True),
        c(requests=((270, 257),), causal=True, sinks=True),
    ),
    (
        "fa3-vllm",
        "0.24.0",
        "sliding window (w, 0) (causal or not) on FA3's head-dim templates 96/192/256",
        c(requests=((39, 231),), num_heads=3, num_kv_heads=1, head_dim=136, window=(154, 0), batch_name="fzwin136"),
        # partial: the envelope's rule is unknown, so the neighbour is outside it (template 128 is right)
        c(requests=((39, 231),), num_heads=3, num_kv_heads=1, head_dim=128, window=(154, 0)),
    ),
    (
        "fa3-vllm",
        "0.24.0",
        "paged KV with head_dim < head_dim_v <= 64",
        c(head_dim=16, head_dim_v=40, **P16),
        c(head_dim=16, head_dim_v=96, **P16),
    ),
    # FA2's issue 895, through either entry point; the neighbour has sq < sk
    (
        "fa2",
        "2.8.3",
        "FA2 turns a window side >= max_seqlen_k into unbounded",
        c(requests=((50, 10), (4, 4)), window=(20, 20)),
        c(requests=((10, 50), (4, 4)), window=(20, 20)),
    ),
    (
        "fa2",
        "2.8.3",
        "varlen with a block table leaves the LSE of rows that see no key unwritten",
        c(requests=((3, 0), (70, 300)), kv_layout="NHD", block_size=256),
        c(requests=((3, 0), (70, 300)), kv_layout="NHD", block_size=256, num_splits=2, append=False),
    ),
    (
        "fa2",
        "2.8.3",
        "varlen with a block table leaves the LSE of rows that see no key unwritten",
        c(requests=((100, 0), (64, 1)), kv_layout="NHD", block_size=256, causal=True),
        c(requests=((100, 0), (64, 0)), kv_layout="NHD", block_size=256, causal=True),
    ),  # no key at all: FA2 fills it
    (
        "torch-flash",
        "2.11.0+cu130",
        "vendored FA2 turns a window side >= max_seqlen_k into unbounded",
        c(requests=((5, 2),), window=(0, None)),
        c(requests=((5, 2),), window=(0, 0)),
    ),
]


def result(backend: str, case: AttentionCase, version: str) -> CheckResult:
    return CheckResult(case.id, backend, "fam", Status.FAIL, case.to_json(), version=version)


@pytest.mark.parametrize("backend, version, reason, cause, neighbour", CASES)
def test_shipped_entry_matches_its_cause_and_not_the_neighbour(backend, version, reason, cause, neighbour) -> None:
    ledger = load_ledger()
    entry = ledger.explain(result(backend, cause, version))
    assert entry is not None and entry.reason.startswith(reason), (cause.id, entry and entry.reason)
    other = ledger.explain(result(backend, neighbour, version))
    assert other is None or not other.reason.startswith(reason), (neighbour.id, other.reason)


def test_shipped_entries_do_not_explain_other_backends_or_older_versions() -> None:
    ledger = load_ledger()
    cause = c(head_dim=80, **P16)
    assert ledger.explain(result("fa4", cause, "4.0.0b36")) is not None
    assert ledger.explain(result("fa3-vllm", cause, "0.24.0")) is None
    assert ledger.explain(result("fa4", cause, "4.0.0b30")) is None  # the range starts where it was seen


def test_the_shipped_ledger_over_the_committed_fuzz_campaigns() -> None:
    """The committed fuzz campaigns (random cases, none of them a suite case): every failure of a cause the ledger
    describes is recognised and no pass is claimed; the 38 left are the adapter defects fixed since
    (reports/README.md, the ledger section), all errors but the two ALiBi-bias records of sdpa-cuda."""
    from pathlib import Path

    from conformance.reporting.ledger_audit import audit

    files = sorted((Path(__file__).resolve().parents[3] / "reports" / "fuzz-h100-2026-11-24").rglob("*.jsonl.gz"))
    if not files:
        pytest.skip("the committed fuzz campaigns are not in this checkout")
    result = audit(load_ledger(), files, suites=False)
    assert (result.problems, result.explained, result.passes_claimed) == (320, 282, 0)
    left = [r for g in result.unexplained for _, r in g.records]
    assert len(left) == 38
    assert {(r.backend, r.status.value) for r in left if r.status.value != "error"} == {("sdpa-cuda", "fail")}
    assert all("alibi" in r.case_id for r in left if r.status.value == "fail")


def test_partial_entry_recognises_new_cases_of_its_envelope_and_claims_no_pass():
    """The fa3-vllm window entry is an envelope (``partial``): a failing case no suite holds (the models suite's
    d96 window 2046 prefill) is recognised; a pass inside the envelope is not an unexpected pass."""
    ledger = load_ledger()
    new = c(
        requests=((2546, 2546), (1000, 1000)), num_heads=32, num_kv_heads=32, head_dim=96, causal=True, window=(2046, 0)
    )
    entry = ledger.explain(result("fa3-vllm", new, "0.24.0"))
    assert entry is not None and entry.partial and not entry.claims_passes
    passed = dataclasses.replace(result("fa3-vllm", new, "0.24.0"), status=Status.PASS)
    verdict = ledger.classify([passed])
    assert verdict.unexpected_passes == [] and verdict.fixed == []
