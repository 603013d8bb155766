"""What reusing FlashMLA's scheduler metadata across batches does (issue 18's "scheduler metadata of the capture
batch reused", on the real kernel).

FlashMLA's interface: a ``FlashMLASchedMeta`` may be reused "only when the tensor shapes and the values of
cache_seqlens ... remain the same".  This script runs one batch shape with two sets of key counts: each with a
fresh sched_meta, and the second with the first's sched_meta reused; prints one JSON line with the largest
difference of the reused call from the fresh one and from an fp64 computation.
Usage on a GPU machine with vLLM 0.24's FlashMLA: ``python scripts/investigate_flashmla_sched_meta.py``.
"""

from __future__ import annotations

import json

import torch

from attnfast.flashmla import FlashMLABackend
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import make_inputs
from conformance.verdict.reference import reference

MLA = dict(num_heads=16, num_kv_heads=1, head_dim=64, head_dim_v=512, qv=True, causal=True)


def main() -> None:
    import vllm.third_party.flashmla.flash_mla_interface as mod

    first = AttentionCase(((1, 300), (1, 1000)), kv_layout="NHD", block_size=64, **MLA)
    second = first.replace(requests=((1, 1290), (1, 3)))
    a, b = make_inputs(first, 0, "cuda"), make_inputs(second, 0, "cuda")
    backend = FlashMLABackend()
    backend.prepare(first, a)()  # fresh sched_meta, first batch
    fresh = backend.prepare(second, b)()  # fresh sched_meta, second batch
    meta, _ = mod.get_mla_metadata()
    from attnfast.flashmla import flashmla_plan
    from attnfast._fa_common import PreparedKernel

    PreparedKernel(mod.flash_mla_with_kvcache, flashmla_plan(first, a, meta))()  # plans for the first batch
    reused = PreparedKernel(mod.flash_mla_with_kvcache, flashmla_plan(second, b, meta))()  # ... reused
    ref = reference(second, b)
    torch.cuda.synchronize()
    row = {
        "device": torch.cuda.get_device_name(),
        "first_kv_lens": first.kv_lens,
        "second_kv_lens": second.kv_lens,
        "fresh_vs_fp64_max": float((fresh.out.double() - ref.out.double()).abs().max()),
        "reused_vs_fp64_max": float((reused.out.double() - ref.out.double()).abs().max()),
        "reused_vs_fresh_max": float((reused.out.double() - fresh.out.double()).abs().max()),
    }
    print(json.dumps(row))


if __name__ == "__main__":
    main()
