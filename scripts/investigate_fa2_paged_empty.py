"""Investigate fa2's LSE for requests with no key on the paged path (default suite on the H100: ``*_ps256nhd`` cases
of the ``emptykv`` and ``cross`` batches fail the masked-rows check with LSE 0.0, nan, 1.0, 0.11, ...).

    python scripts/investigate_fa2_paged_empty.py [--out F.json]

FA2's ``flash_attn_varlen_func`` is called directly (no adapter) on a batch whose first and last requests
have no key (requests (q, kv) = (5, 0), (3, 3), (1, 0); GQA 8/2, d64, bf16), three ways: contiguous K/V
(``cu_seqlens_k``), a paged cache of 256-key pages with ``block_table``, and ``flash_attn_with_kvcache``
on the same pages (``cache_seqlens`` 0).  Before each call the CUDA caching allocator is filled with a
sentinel (a large tensor of that value allocated and freed), so memory the kernel never writes reads
back as the sentinel.  Rows of the keyless requests should have LSE -inf (+inf in FA2's own
convention, which the adapter maps to -inf) and output 0; the output and LSE are also compared with an
fp64 softmax (written here) for the request that has keys.
"""

from __future__ import annotations

import argparse
import json

import torch

REQUESTS = ((5, 0), (3, 3), (1, 0))
H, HK, D, PAGE = 8, 2, 64, 256


def fill_allocator(value: float) -> None:
    x = torch.full((256 << 20,), value, dtype=torch.float32, device="cuda")  # 1 GiB
    del x


def main() -> None:
    from flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="investigate-fa2-paged-empty.json")
    args = ap.parse_args()
    torch.manual_seed(0)
    sqs, sks = [r[0] for r in REQUESTS], [r[1] for r in REQUESTS]
    q = torch.randn(sum(sqs), H, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(sum(sks), HK, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(sum(sks), HK, D, device="cuda", dtype=torch.bfloat16)
    cu_q = torch.tensor([0, 5, 8, 9], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 0, 3, 3], dtype=torch.int32, device="cuda")
    kc = torch.zeros(4, PAGE, HK, D, dtype=torch.bfloat16, device="cuda")
    vc = torch.zeros_like(kc)
    kc[2, :3], vc[2, :3] = k, v  # request 1's keys live in page 2; requests 0 and 2 own a page each, unused
    table = torch.tensor([[0], [2], [3]], dtype=torch.int32, device="cuda")
    # fp64 reference of request 1 (3 queries, 3 keys, no mask)
    qd = q[5:8].double()
    kd, vd = k.double().repeat_interleave(H // HK, 1), v.double().repeat_interleave(H // HK, 1)
    s = torch.einsum("ihd,jhd->hij", qd, kd) * D**-0.5
    ref_lse = torch.logsumexp(s, -1)
    ref_out = torch.einsum("hij,jhd->ihd", torch.softmax(s, -1), vd)
    empty_rows = [0, 1, 2, 3, 4, 8]
    results = []
    for sentinel in (7.0, -3.0):
        for path in ("varlen_contig", "varlen_paged", "kvcache_paged"):
            fill_allocator(sentinel)
            if path == "varlen_contig":
                out, lse, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 5, 3, return_attn_probs=True)
            elif path == "varlen_paged":
                out, lse, _ = flash_attn_varlen_func(q, kc, vc, cu_q, cu_k, 5, 3, block_table=table,
                                                     return_attn_probs=True)  # fmt: skip
            else:
                # kvcache takes one q_len per batch: the decode rows only (request 1's last query, and the
                # keyless request 2), each as (b, 1, h, d)
                qq = torch.stack([q[7], q[8]])[:, None]
                out2, lse2 = flash_attn_with_kvcache(
                    qq, kc, vc, cache_seqlens=torch.tensor([3, 0], dtype=torch.int32, device="cuda"),
                    block_table=table[1:], return_softmax_lse=True,
                )  # fmt: skip
                torch.cuda.synchronize()
                results.append(
                    {
                        "sentinel": sentinel,
                        "path": path,
                        "keyless_lse": lse2[1].flatten().tolist(),
                        "keyless_out_max_abs": float(out2[1].float().abs().max()),
                        "with_keys_lse_err": float((lse2[0, :, 0].double() - ref_lse[:, 2]).abs().max()),
                    }
                )
                print(json.dumps(results[-1]), flush=True)
                continue
            torch.cuda.synchronize()
            results.append(
                {
                    "sentinel": sentinel,
                    "path": path,
                    "keyless_lse_first_rows": lse[0, empty_rows].tolist(),
                    "keyless_lse_values": sorted({round(float(x), 6) for x in lse[:, empty_rows].flatten()})[:12],
                    "keyless_rows_equal_sentinel": int((lse[:, empty_rows] == sentinel).sum()),
                    "keyless_rows": len(empty_rows) * H,
                    "keyless_out_max_abs": float(out[empty_rows].float().abs().max()),
                    "with_keys_lse_err": float((lse[:, 5:8].double() - ref_lse).abs().max()),
                    "with_keys_out_err": float((out[5:8].double() - ref_out).abs().max()),
                }
            )
            print(json.dumps(results[-1]), flush=True)
    with open(args.out, "w") as fh:
        json.dump({"what": __doc__.strip().splitlines()[0], "requests": REQUESTS, "results": results}, fh, indent=1)


if __name__ == "__main__":
    main()
