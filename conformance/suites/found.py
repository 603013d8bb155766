"""Minimal cases the fuzzer found on a GPU, kept in the ``default`` and ``full`` suites as regressions.

Each :class:`Found` is the minimal case of one failure group of an ``attnconf fuzz`` campaign (after shrinking),
with the backends it failed on, what was wrong, and the campaign that found it.  Its batch name starts with
``fz`` and names the finding, so ledger patterns and readers can tell these cases apart (the id's hash ignores
the batch name: the case is the one the fuzzer printed).  A finding that was the adapter's fault (a missing
refusal, a translation bug) is fixed in the adapter; its case stays here so that the fix stays tested on the GPU.

Where a new finding goes: one :class:`Found` below, and a ledger entry (``conformance/ledgers/<backend>.toml``)
when the kernel is at fault.
"""

from __future__ import annotations

from dataclasses import dataclass

from conformance.cases.case import AttentionCase

__all__ = ["FOUND", "Found", "found_cases"]

#: The campaigns (H100, vLLM 0.24.0 kernels, flash-attn 2.8.3, FA4 from gpu-kit part2; torch 2.11.0+cu130):
#: ``attnconf fuzz --backend B --device cuda --budget 300s --seed 11 --max-tokens 4096``, then, after the fixes,
#: ``--budget 200s --seed 12`` (``seed12/``).
_CAMPAIGN = "reports/fuzz-h100-2026-11-24/fuzz-{}.jsonl.gz"
_CAMPAIGN12 = "reports/fuzz-h100-2026-11-24/seed12/fuzz-{}.jsonl.gz"


@dataclass(frozen=True)
class Found:
    """One minimal failing case: the backends it failed on, the finding, the campaign's results file."""

    case: AttentionCase
    backends: tuple[str, ...]
    finding: str
    evidence: str


def _c(name: str, requests, **kw) -> AttentionCase:
    kw.setdefault("num_heads", 1)
    kw.setdefault("num_kv_heads", 1)
    return AttentionCase(requests=tuple(requests), batch_name=f"fz{name}", **kw)


FOUND: tuple[Found, ...] = (
    Found(
        _c("895l", [(3, 1)], head_dim=8, window=(0, None)),
        ("fa2", "torch-flash"),
        "left window with sq > sk: FA2 sets the unbounded right side to seqlen_k, ignoring the offset sk - sq, so "
        "rows above the diagonal see the key (flash-attention issue 895)",
        _CAMPAIGN.format("fa2"),
    ),
    Found(
        _c("895r", [(3, 1)], head_dim=8, window=(None, 1)),
        ("fa2", "torch-flash"),
        "right window >= seqlen_k with sq > sk: FA2 turns it into unbounded, ignoring the offset sk - sq "
        "(flash-attention issue 895); the fuzzer's minimal case had d1, which torch-flash refuses",
        _CAMPAIGN.format("fa2"),
    ),
    Found(
        _c("pgempty", [(1, 0), (24, 1)], num_heads=2, head_dim=1, kv_layout="NHD", block_size=256),
        ("fa2",),
        "FA2's varlen call with a block table leaves the LSE of a request with no key unwritten (garbage; output 0)",
        _CAMPAIGN.format("fa2"),
    ),
    Found(
        _c("pgemptyc", [(0, 0), (65, 1)], head_dim=8, kv_layout="NHD", block_size=256, causal=True),
        ("fa2",),
        "the same with a causal mask and an empty request first",
        _CAMPAIGN.format("fa2"),
    ),
    Found(
        _c("appvpad", [(3, 10)], head_dim=16, head_dim_v=8, append=True, v_padded=True),
        ("fa2",),
        "adapter: append with V padded passed the new tokens' V unpadded (RuntimeError: shape '[1, 3, 1, 16]' is "
        "invalid for input of size 24); fixed in attnfast/_fa_common.py prepare_padded_v",
        _CAMPAIGN.format("fa2"),
    ),
    Found(
        _c(
            "sdpaal",
            [(15, 63)],
            num_heads=8,
            num_kv_heads=2,
            head_dim=39,
            kv_layout="HND",
            block_size=16,
            sinks=True,
            window=(172, None),
        ),
        ("sdpa-cuda",),
        "adapter: a bias with head dim 39 has no SDPA kernel ('No available kernel'); now refused by the "
        "alignment limits of attnfast/sdpa.py",
        _CAMPAIGN.format("sdpa-cuda"),
    ),
    Found(
        _c("fa4pg80", [(1, 26)], head_dim=80, kv_layout="NHD", block_size=1),
        ("fa4",),
        "FA4 on sm_90, paged KV through the non-TMA loader with d80 (key tile 144): wrong output and LSE",
        _CAMPAIGN.format("fa4"),
    ),
    Found(
        _c("fa4pg160", [(2, 255)], head_dim=160, dtype="fp16", kv_layout="NHD", block_size=1),
        ("fa4",),
        "FA4 on sm_90, paged KV through the non-TMA loader with d160 (key tile 112): illegal memory access",
        _CAMPAIGN.format("fa4"),
    ),
    Found(
        _c("qvscale", [(1, 1)], head_dim=8, head_dim_v=256, qv=True),
        ("fa3-vllm",),
        "the fork's default softmax scale with q_v is 1/sqrt(d), not 1/sqrt(d + dv) (see its ledger)",
        _CAMPAIGN.format("fa3-vllm"),
    ),
    Found(
        _c("sinkempty", [(1, 0)], head_dim=8, sinks=True),
        ("fa3-vllm",),
        "with s_aux a row that sees no key gets LSE -inf, not the sink (see its ledger)",
        _CAMPAIGN.format("fa3-vllm"),
    ),
    Found(
        _c("sinkdv", [(0, 0)], head_dim=8, head_dim_v=16, sinks=True),
        ("fa3-vllm",),
        "adapter: 'We don't support S aux with hdim != hdim_v'; now refused by attnfast/fa3_vllm.py",
        _CAMPAIGN.format("fa3-vllm"),
    ),
)


FOUND += (
    Found(
        _c("appmqa", [(1, 1)], num_heads=2, num_kv_heads=1, head_dim=8, append=True),
        ("fa2",),
        "adapter: a one-token GQA append into a cache narrower than the GQA ratio ('If key is supplied, it must "
        "have seqlen <= the seqlen of the KV cache': FA2 swaps the query groups into rows); fixed in "
        "attnfast/fa2.py (the cache is made at least that wide)",
        _CAMPAIGN12.format("fa2"),
    ),
    Found(
        _c("pgdv", [(1, 1)], head_dim=8, head_dim_v=16, kv_layout="NHD", block_size=1),
        ("fa3-vllm",),
        "paged KV (page 1) with d 8 < dv 16: output dims 8..15 wrong (error ratio 576); the contiguous twin passes",
        _CAMPAIGN12.format("fa3-vllm"),
    ),
    Found(
        _c("win136", [(39, 231)], num_heads=3, head_dim=136, window=(154, 0)),
        ("fa3-vllm",),
        "a left window (154, 0) with head dim 136 (FA3's 192 template): rows take in keys right of the window, "
        "key tiles the fork's overlap mainloop leaves unmasked (error ratio 28; the fa3-vllm window entry)",
        _CAMPAIGN12.format("fa3-vllm"),
    ),
    Found(
        _c("win200", [(231, 166)], num_heads=5, head_dim=200, head_dim_v=8, v_padded=True, window=(102, 0)),
        ("fa3-vllm",),
        "the same through seed 004's padded-V call (d 200: the 256 template), window (102, 0), error ratio 15",
        _CAMPAIGN12.format("fa3-vllm"),
    ),
    Found(
        _c("fa4vpad", [(18, 33)], head_dim=80, head_dim_v=8, kv_layout="NHD", block_size=1, v_padded=True),
        ("fa4",),
        "FA4's non-TMA paged loader with d80 (key tile 144) reached through a padded-V call: wrong output",
        _CAMPAIGN12.format("fa4"),
    ),
)


FOUND += (
    Found(
        _c("alibibf16", [(27, 2)], num_heads=9, num_kv_heads=3, head_dim=8, alibi=True),
        ("sdpa-cuda",),
        "adapter: ALiBi with many more queries than keys passed as a bf16 bias rounded -slope * 25 to steps of "
        "0.0625 (error 4x the baseline's); fixed in attnfast/sdpa.py bias_for_kernel (each row shifted by its top)",
        "reports/fuzz-h100-2026-11-24/seed13/fuzz-sdpa-cuda.jsonl.gz",
    ),
)


FOUND += (
    Found(
        # Not the shrinker's end (it went on to d160, then d80: the other two loader entries), but its third step,
        # still failing at d208: request (257, 65) of the original, page 1, one head (the path of the minimal record).
        _c(
            "fa4pg208",
            [(257, 65)],
            head_dim=208,
            head_dim_v=152,
            dtype="fp16",
            kv_layout="NHD",
            block_size=1,
            v_padded=True,
        ),
        ("fa4",),
        "FA4's non-TMA paged loader with d208 (key tile 80) through a padded-V call: wrong output (error ratio 100.6 "
        "on the original; d256, the same tile, is right)",
        _CAMPAIGN12.format("fa4"),
    ),
)


FOUND += (
    Found(
        # The original draw of the campaign over the widened space (its shrinker went on to d80 at page 1, the
        # flaky d80 entry): d176 with a right-only window, key tile 96 through the non-TMA loader.
        _c(
            "fa4pg176",
            [(54, 53), (124, 82), (64, 64), (63, 63), (78, 51)],
            num_heads=34,
            num_kv_heads=2,
            head_dim=176,
            dtype="fp16",
            kv_layout="NHD",
            block_size=64,
            scale=0.0016,
            window=(None, 64),
        ),
        ("fa4",),
        "FA4's non-TMA paged loader at d176 (key tile 96, a right-only window): wrong output (error ratio 165)",
        "reports/fuzz-h100-2026-11-25/fuzz-widened-h100.jsonl.gz",
    ),
)


def found_cases() -> tuple[AttentionCase, ...]:
    """The cases of :data:`FOUND`, in order."""
    return tuple(f.case for f in FOUND)
