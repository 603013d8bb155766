"""Each shipped ledger entry recognises a case of its cause that no suite holds, and not the neighbour that differs
in the one field the cause needs (the test fails if a predicate is widened or narrowed past its evidence)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from conformance.cases.case import AttentionCase
from conformance.records import CheckResult, Status
from conformance.ledger.entries import load_ledger


def c(**kw) -> AttentionCase:
    base = dict(requests=((3, 300), (1, 77)), num_heads=4, num_kv_heads=2, head_dim=64)
    return AttentionCase(**{**base, **kw})


P16 = dict(kv_layout="NHD", block_size=16)
#: the d64 minimal case of the H100 window run (2 query heads over 1, causal window 370, one split)
D64_WINDOW = dict(requests=((400, 400),), num_heads=2, num_kv_heads=1, causal=True, window=(370, 0), num_splits=1)
#: how fa3-vllm.toml[2] (the fork's window schedule) states its cause
WINDOW = "sliding window: once the window moves a query tile's key pointer (block.h n_offset > 0)"
#: the d64 neighbour probe of fa3-vllm.toml[5] (vLLM #51902): 14 query / 2 KV heads, causal, one split, pages of 16
D64_NEIGHBOUR = dict(
    num_heads=14, num_kv_heads=2, head_dim=64, causal=True, num_splits=1, invariance="neighbour", **P16
)

#: the H100 fuzz campaign's sink case of 2026-11-27 (seed 28): eight 1-token decodes, every row sees its one key
SINK_DECODES = dict(
    requests=((1, 1),) * 8, num_heads=50, num_kv_heads=50, head_dim=32, window=(None, 1), softcap=42.5, sinks=True
)

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
    # at most one key tile: the flaky entry, not the steady one; d208 (tile 80) too, d256 (the same tile) not
    (
        "fa4",
        "4.0.0b36",
        "sm_90 non-TMA paged loader, at most one key tile of keys",
        c(requests=((37, 37),), head_dim=96, **P16),
        c(requests=((37, 37),), head_dim=64, **P16),
    ),
    (
        "fa4",
        "4.0.0b36",
        "sm_90 non-TMA paged loader, at most one key tile of keys",
        c(requests=((257, 65),), head_dim=208, **P16),
        c(requests=((257, 65),), head_dim=256, **P16),
    ),
    (
        "fa4",
        "4.0.0b36",
        "sm_90 non-TMA paged loader, at most one key tile of keys",
        c(requests=((1, 70),), head_dim=144, causal=True, **P16),
        c(requests=((1, 70),), head_dim=192, causal=True, **P16),
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
    # the fork's window schedule: key tiles the overlap mainloop leaves unmasked once the window moves the key pointer
    # (fa3_window_unmasked_rows); each neighbour changes one field and the schedule has no such row (the last two
    # measured on the H100: reports/h100-2026-11-27-windows)
    (
        "fa3-vllm",
        "0.24.0",
        WINDOW,
        c(requests=((39, 231),), num_heads=3, num_kv_heads=1, head_dim=136, window=(154, 0), batch_name="fzwin136"),
        c(requests=((39, 231),), num_heads=3, num_kv_heads=1, head_dim=128, window=(154, 0)),  # 128 x 128: none
    ),
    (
        "fa3-vllm",
        "0.24.0",
        WINDOW,
        c(requests=((520, 520),), num_heads=2, num_kv_heads=1, head_dim=96, window=(256, 37), num_splits=1),
        c(requests=((520, 520),), num_heads=2, num_kv_heads=1, head_dim=96, window=(251, 37), num_splits=1),
    ),
    (
        "fa3-vllm",
        "0.24.0",
        WINDOW,
        c(**D64_WINDOW, quant="fp8_e4m3", descale="head"),  # 192 x 128 with overlap
        c(**D64_WINDOW),  # bf16: 192 x 160 without overlap
    ),
    (
        "fa3-vllm",
        "0.24.0",
        "paged KV with head_dim < head_dim_v <= 64",
        c(head_dim=16, head_dim_v=40, **P16),
        c(head_dim=16, head_dim_v=96, **P16),
    ),
    # FA3's batch invariance with num_splits 1: the one-warpgroup rule on contiguous d128 (its paged twin keeps the
    # invariance), and the partial envelope of d64/d128 batches whose request 0 is shorter than the longest query
    (
        "fa3-vllm",
        "0.24.0",
        "with num_splits = 1 at head dim 128 (contiguous K/V)",
        c(requests=((1, 500), (65, 65)), num_heads=32, num_kv_heads=8, head_dim=128, num_splits=1, invariance="batch"),
        c(
            requests=((1, 500), (65, 65)),
            num_heads=32,
            num_kv_heads=8,
            head_dim=128,
            num_splits=1,
            invariance="batch",
            **P16,
        ),  # fmt: skip
    ),
    (
        "fa3-vllm",
        "0.24.0",
        "with num_splits = 1 at head dims 64 and 128",
        c(requests=((1, 500), (65, 65)), head_dim=64, num_splits=1, invariance="batch", **P16),  # not causal
        c(requests=((1, 500), (65, 65)), head_dim=256, causal=True, num_splits=1, invariance="batch"),
    ),
    # the d64 rule the growing neighbour found (issue 31): the calls on both sides of max_seqlen_q x group <= 64
    (
        "fa3-vllm",
        "0.24.0",
        "with num_splits = 1 at head dim 64 (causal; paged or contiguous)",
        c(requests=((1, 3000), (129, 1100)), **D64_NEIGHBOUR),
        c(requests=((64, 3000), (129, 1100)), **D64_NEIGHBOUR),
    ),
    # A batch invariance's "beside shorter requests" call cuts the neighbours' keys, here to none: their rows are
    # keyless with sinks in that call only (the H100 fuzz campaign of 2026-11-27, seed 28: kernel LSE -inf there);
    # the same case without the invariance makes no keyless call
    (
        "fa3-vllm",
        "0.24.0",
        "with s_aux, rows that see no key get LSE -inf instead of the sink value",
        c(invariance="batch", **SINK_DECODES),
        c(**SINK_DECODES),
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


IMA = "AcceleratorError: CUDA error: an illegal memory access was encountered"

# (backend, version, the entry's reason starts with, a case of the cause, its reason, a neighbour); the neighbour
# and the cause with another message are explained by no entry
ERRORS = [
    # d144-176 (tile 112) and d208-240 (tile 80) with more keys than one tile fault; d192 (tile 112) and d256 (tile
    # 80) are right
    (
        "fa4",
        "4.0.0b36",
        "sm_90, paged KV through the non-TMA loader, head dims 144/160/176",
        c(head_dim=144, **P16),
        IMA,
        c(head_dim=192, **P16),
    ),
    (
        "fa4",
        "4.0.0b36",
        "sm_90, paged KV through the non-TMA loader, head dims 144/160/176",
        c(head_dim=224, causal=True, **P16),
        IMA,
        c(head_dim=256, causal=True, **P16),
    ),
    # FA2's keyless paged tiles fault now and then; its contiguous twin does not
    ("fa2", "2.8.3", "varlen with a block table leaves the LSE", c(requests=((3, 0), (70, 300)), kv_layout="NHD",
     block_size=256), IMA, c(requests=((3, 0), (70, 300)))),
    ("fa4", "4.0.0b36", "sm_90 backward, head dims 104 and 112: the backward kernel fails to compile",
     c(head_dim=112, backward=True), "MLIRError: Operation creation failed", c(head_dim=120, backward=True)),
]  # fmt: skip


@pytest.mark.parametrize("backend, version, reason, cause, message, neighbour", ERRORS)
def test_shipped_error_entries_explain_their_message_only(backend, version, reason, cause, message, neighbour) -> None:
    """An error of the cause's case with the kernel's message is the entry's; the same case erroring with another
    message (an adapter's, say), failing where the entry lists no fail, or a neighbour's error are not."""
    ledger = load_ledger()
    error = dataclasses.replace(result(backend, cause, version), status=Status.ERROR, reason=message)
    entry = ledger.explain(error)
    assert entry is not None and entry.reason.startswith(reason), (cause.id, entry and entry.reason)
    other = dataclasses.replace(error, reason="RuntimeError: shape '[1, 3, 1, 16]' is invalid")
    assert ledger.explain(other) is None
    moved = dataclasses.replace(error, case_id=neighbour.id, case=neighbour.to_json())
    assert ledger.explain(moved) is None
    if "fail" not in entry.statuses:  # a fail of the case: another entry's (d112's wrong gradients), or unlisted here
        verdict = ledger.classify([dataclasses.replace(error, status=Status.FAIL)])
        assert verdict.known or [e.reason for _, e in verdict.unlisted] == [entry.reason]


def test_shipped_entries_name_the_message_of_every_status_but_fail() -> None:
    """The ledger docs' rule: an entry lists every status its cause showed, each but fail with the message its records
    carry, so an adapter's or the harness's error on the entry's cases is never taken for the kernel's."""
    for e in load_ledger().entries:
        named = dict(e.messages)
        assert all(s in named for s in e.statuses if s != "fail"), (e.source, e.statuses, named)


def test_shipped_entries_do_not_explain_other_backends_or_older_versions() -> None:
    ledger = load_ledger()
    cause = c(head_dim=80, **P16)
    assert ledger.explain(result("fa4", cause, "4.0.0b36")) is not None
    assert ledger.explain(result("fa3-vllm", cause, "0.24.0")) is None
    assert ledger.explain(result("fa4", cause, "4.0.0b30")) is None  # the range starts where it was seen


def test_the_shipped_ledger_over_the_committed_fuzz_campaigns() -> None:
    """The committed fuzz campaigns (random cases, none of them a suite case): every failure of a cause the ledger
    describes is recognised and no pass is claimed; the 10 adapter defects fixed since (the FA2 append calls and the
    two ALiBi-bias records of sdpa-cuda) are their ``fixed`` entries', and 28 errors are refusals declared since."""

    from conformance.ledger.audit import audit

    files = sorted((Path(__file__).resolve().parents[3] / "reports" / "fuzz-h100-2026-11-24").rglob("*.jsonl.gz"))
    if not files:
        pytest.skip("the committed fuzz campaigns are not in this checkout")
    result = audit(load_ledger(), files, suites=False)
    assert (result.problems, result.explained, result.passes_claimed) == (320, 292, 0)
    # 28 are errors of calls the adapters refuse since (torch-flash's head dims, fa3-vllm's sinks with hdim != hdim_v,
    # sdpa-cuda's shapes no SDPA backend takes: the audit's refused now), two of them cases of fa3-vllm entries
    assert len(result.refused_now) == 28 and {r.status.value for _, r, _ in result.refused_now} == {"error"}
    assert result.unexplained_count == 0 and [r for a in result.entries for _, r in a.unlisted] == []
    fixed = {a.entry.source: a.explained for a in result.entries if a.entry.fixed is not None and a.explained}
    # FA2's appends (the narrow GQA cache 4, the unpadded V 4) and sdpa-cuda's ALiBi as a bf16 bias (2)
    assert fixed == {"ledgers/fa2.toml[2]": 4, "ledgers/fa2.toml[3]": 4, "ledgers/sdpa-cuda.toml[2]": 2}


def test_partial_entry_recognises_new_cases_of_its_envelope_and_claims_no_pass():
    """A partial entry is an envelope: the fa3-vllm batch-invariance one (d64/d128 batches whose request 0 is shorter
    than the longest query) recognises a failing case no suite holds, and a pass inside it is no unexpected pass."""
    ledger = load_ledger()
    new = c(requests=((1, 700), (90, 90)), head_dim=64, num_splits=1, invariance="batch", **P16)
    entry = ledger.explain(result("fa3-vllm", new, "0.24.0"))
    assert entry is not None and entry.partial and not entry.claims_passes
    passed = dataclasses.replace(result("fa3-vllm", new, "0.24.0"), status=Status.PASS)
    verdict = ledger.classify([passed])
    assert verdict.unexpected_passes == [] and verdict.fixed == []


def test_the_window_entry_is_steady_and_recognises_the_models_prefill():
    """The fork's window schedule is the cause, not an envelope: the models suite's d96 window-2046 prefill (which
    failed on the H100, 2026-11-25, and which the former envelope was widened for) is recognised, and a pass of it
    would be an unexpected pass."""
    ledger = load_ledger()
    new = c(
        requests=((2546, 2546), (1000, 1000)), num_heads=32, num_kv_heads=32, head_dim=96, causal=True, window=(2046, 0)
    )
    failed = dataclasses.replace(result("fa3-vllm", new, "0.24.0"), reason="max_error: |out-ref| 2.0e-01 | lse: ...")
    entry = ledger.explain(failed)
    assert entry is not None and entry.reason.startswith(WINDOW) and entry.claims_passes
    passed = dataclasses.replace(failed, status=Status.PASS, reason="")
    assert [e.reason for _, e in ledger.classify([passed]).unexpected_passes] == [entry.reason]


WINDOWS_H100 = Path(__file__).resolve().parents[3] / "reports" / "h100-2026-11-27-windows"


@pytest.mark.skipif(
    not (WINDOWS_H100 / "investigate-fa3-peer-windows-h100.json.gz").exists(),
    reason="the 2026-11-27 H100 window run is not in this checkout",
)
def test_the_window_entry_against_the_h100_window_run() -> None:
    """The 120 cases of scripts/investigate_fa3_peer_windows.py on the H100: the field is the schedule the run
    recorded (``model.wrong_rows``, the same code), the window entry explains every case it marks as its harness
    failed, and no case it marks passed; the one failure it leaves (the claimed pass's d128 twin, 128 keyless rows
    with sinks) is the sink entry's."""
    import gzip
    import json

    from conformance.ledger.fields import case_view

    ledger = load_ledger()
    with gzip.open(WINDOWS_H100 / "investigate-fa3-peer-windows-h100.json.gz", "rt") as fh:
        rows = [json.loads(line) for line in fh]
    assert len(rows) == 120
    seen = {"window": 0, "sink": 0, "pass": 0}
    for row in rows:
        case = AttentionCase.from_json(row["case"])
        unmasked = case_view(case).value("fa3_window_unmasked_rows")
        assert unmasked == row["model"]["wrong_rows"], row["case_id"]
        status = row["harness"]["status"]
        record = dataclasses.replace(result("fa3-vllm", case, "0.24.0"), status=Status(status),
                                     reason=row["harness"]["reason"])  # fmt: skip
        if status == "pass":
            assert unmasked == 0 and ledger.classify([record]).unexpected_passes == [], row["case_id"]
            seen["pass"] += 1
            continue
        entry = ledger.explain(record)
        assert entry is not None, row["case_id"]
        kind = "window" if entry.reason.startswith(WINDOW) else "sink"
        assert (kind == "window") == (unmasked > 0), (row["case_id"], entry.reason)
        if kind == "sink":
            assert entry.reason.startswith("with s_aux, rows that see no key get LSE -inf")
        seen[kind] += 1
    assert seen == {"window": 76, "sink": 1, "pass": 43}


#: every problem of the committed GPU runs and fuzz campaigns the shipped ledger does not explain, by backend, status
#: and how its reason starts (reports/README.md, "The ledger against the committed runs", says what each is)
#: error records of calls the adapter refuses since (the audit's *refused now*), by backend: torch-flash's head dims
#: that are not multiples of 8, fa3-vllm's sinks with hdim != hdim_v (finding 11) and with more than 64 query heads
#: (suite limits), sdpa-cuda's shapes no allowed SDPA backend takes (finding 6)
REFUSED_NOW = {"torch-flash": 16, "fa3-vllm": 12, "sdpa-cuda": 6}

NAMED = {
    # old5 of reports/h200-2026-11-28-speed (the tree of 66617e6): an illegal instruction in fa3-vllm's step of a case
    # that passes in every other run; its worker's last problem, 20 s before, was no fault (a q_v fail of
    # fa3-vllm.toml[0]), and the pair it ran just before is not in the problems file: not explained
    ("fa3-vllm", "error", "AcceleratorError: CUDA error: an illegal instruction"): 1,
}


@pytest.mark.slow
def test_the_shipped_ledger_over_every_committed_run() -> None:
    """Issue 31: over every committed GPU run and fuzz campaign (25 s on 2 cores) no entry claims a pass, the
    problems no entry explains are exactly the named ones, the error records of calls the adapters refuse since are
    exactly the refused-now ones, and the harness's own fixed defects (``fixed`` entries) explain 19 records."""
    from conformance.ledger.audit import audit
    from conformance.records import is_lost_device

    files = sorted((Path(__file__).resolve().parents[3] / "reports").rglob("*.jsonl.gz"))
    if len(files) < 56:
        pytest.skip("the committed GPU runs are not in this checkout")
    result = audit(load_ledger(), files)
    assert result.passes_claimed == 0 and result.stale == []
    # the collateral of known faults (the entries' `faults`): 102 pairs a lost device left unjudged (70 in the FA4
    # probe's rerun, reports/h100-2026-11-26-speed-4; 32 in reports/h100-2026-11-27-isolate, which ran the pairs the
    # ledger expects to fault back to back), and 11 CUDA errors on a context FA2's keyless paged calls (fa2.toml[1])
    # or FA4's loader faults (fa4.toml[1]) had broken: 10 in the harness, and fa3-vllm's illegal instruction of
    # reports/h100-2026-11-26-verdict-reads k4-before, in the kernel's step 1.5 s after its worker's FA2 keyless call
    lost = sum(1 for a in result.entries for _, r, _ in a.collateral if is_lost_device(r))
    assert (lost, result.collateral_count - lost) == (102, 11)
    harness = {a.entry.source: a.explained for a in result.entries if a.entry.fixed is not None}
    assert sum(harness.values()) == 19 and all(harness.values()), harness
    left = [r for g in result.unexplained for _, r in g.records] + [r for a in result.entries for _, r in a.unlisted]
    counts: dict[tuple[str, str, str], int] = {}
    for r in left:
        key = next(
            (k for k in NAMED if (k[0], k[1]) == (r.backend, r.status.value) and r.reason.startswith(k[2])), None
        )
        assert key is not None, (r.backend, r.status.value, r.case_id, r.reason[:100])
        counts[key] = counts.get(key, 0) + 1
    assert counts == NAMED
    refused: dict[str, int] = {}
    for _, r, _ in result.refused_now:
        refused[r.backend] = refused.get(r.backend, 0) + 1
    assert refused == REFUSED_NOW
