"""Case grids that decide how narrow two ledger entries must be (issue 31): written as ``--case-json`` lists.

    python scripts/probe_ledger_causes.py fa4-loader > fa4-loader.json
    python scripts/probe_ledger_causes.py fa3-invbatch > fa3-invbatch.json
    attnconf run --backend fa4 --device cuda --case-json @fa4-loader.json --out fa4-loader.jsonl.gz
    attnconf run --backend fa3-vllm --device cuda --case-json @fa3-invbatch.json --out fa3-invbatch.jsonl.gz

``fa4-loader``: FA4's sm_90 non-TMA paged loader (ledgers/fa4.toml) at every head dim of its key tiles 80 and 112
(144, 160, 176, 208, 224, 240; 192 and 256, which the ledger says are right, as controls), with and without a
causal mask, on pages of 1, 16, 48, 80 and 256 (80 is the TMA page of the tile-80 dims), GQA 8/2 bf16, one request
per case: prefills (s, s) and decodes (1, s) with s on both sides of each key tile (1, 3, 20, 37, 70, 80, 81, 112,
113, 200, 300; decodes from 3 up to 1000), and the mixed batch of scripts/investigate_fa4_paged.py.  What it decides:
which key counts give wrong output, which an illegal memory access, which pass, per head dim and tile.  On an H100
(reports/h100-2026-11-26-ledger/) the GPU refused new workers after about 25 illegal memory accesses, so the rest of
the grid was recorded unsupported: run the cases of at most one key tile (``max_kv_len <= tile``) on their own.

``fa3-invbatch``: vLLM's FA3 with ``num_splits = 1``, batch invariance (ledgers/fa3-vllm.toml: request 0 alone
against its batch), head dims 64, 128 and 256, GQA groups 1, 4 and 8, causal or not, contiguous or pages of 16, over
batches that put request 0 and the batch's longest query on the same or on different sides of FA3's
one-MMA-warpgroup rule (head dim 128 and max_seqlen_q x group <= 64): whether exactly the cases of
``fa3_one_mma_wg_switch`` lose the invariance.
"""

from __future__ import annotations

import json
import sys

from conformance.cases.case import AttentionCase

FA4_HEAD_DIMS = (144, 160, 176, 192, 208, 224, 240, 256)
FA4_PAGES = (1, 16, 48, 80, 256)
FA4_PREFILLS = (1, 3, 20, 37, 70, 80, 81, 112, 113, 200, 300)
FA4_DECODES = (3, 37, 70, 81, 113, 300, 1000)
FA4_MIXED = ((128, 300), (1, 77), (4, 1024))

FA3_BATCHES = {
    # request 0 first: what it tests -> requests
    "dec_pf": ((1, 2000), (200, 200), (64, 600)),  # decode beside prefills: switches where 1 x g <= 64 < 200 x g
    "pf_dec": ((200, 200), (1, 2000), (1, 90)),  # request 0 the longest: both variants the same kernel
    "dec_small": ((1, 300), (8, 8), (16, 40)),  # the longest query 16: switches only where 16 x g > 64
    "q16": ((16, 100), (1, 50), (1, 70)),  # request 0 the longest
    "q17": ((17, 100), (1, 50), (4, 30)),  # request 0 the longest
    "dec_only": ((1, 3000), (1, 17), (1, 800)),  # one query each: never switches
    "dec_q65": ((1, 500), (65, 65), (3, 40)),  # 65 x g > 64 for every group
}


def fa4_loader() -> list[AttentionCase]:
    out = []
    for d in FA4_HEAD_DIMS:
        for causal in (False, True):
            for page in FA4_PAGES:
                batches = [((s, s),) for s in FA4_PREFILLS] + [((1, s),) for s in FA4_DECODES] + [FA4_MIXED]
                for reqs in batches:
                    out.append(
                        AttentionCase(
                            requests=reqs,
                            num_heads=8,
                            num_kv_heads=2,
                            head_dim=d,
                            kv_layout="NHD",
                            block_size=page,
                            causal=causal,
                            batch_name="probe",
                        )
                    )
    return out


def fa3_invbatch() -> list[AttentionCase]:
    out = []
    for d in (64, 128, 256):
        for g in (1, 4, 8):
            for reqs in FA3_BATCHES.values():
                for causal in (False, True):
                    for page in (None, 16):
                        out.append(
                            AttentionCase(
                                requests=reqs,
                                num_heads=8 * g,
                                num_kv_heads=8,
                                head_dim=d,
                                kv_layout="NHD" if page else "contiguous",
                                block_size=page,
                                causal=causal,
                                num_splits=1,
                                invariance="batch",
                                batch_name="probe",
                            )
                        )
    return out


GRIDS = {"fa4-loader": fa4_loader, "fa3-invbatch": fa3_invbatch}


def main() -> None:
    if len(sys.argv) != 2 or sys.argv[1] not in GRIDS:
        sys.exit(f"usage: {sys.argv[0]} {{{','.join(GRIDS)}}}")
    json.dump([c.to_json() for c in GRIDS[sys.argv[1]]()], sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
