"""The engines' CUDA-graph paths on a GPU (issue 18 item 2): the planted graph bugs of the CPU tests, captured, and
what FA3's ``get_scheduler_metadata`` returns for the batches of ``vllm_v1_fa``'s ``graph_decode_aot``.

``planted BACKEND...``: one JSON line per (backend, planted bug, case) with the verdict (the planted runs of
``tests/conformance/engines/test_vllm_v1_graph.py`` and ``test_vllm_v0_graph.py``, on CUDA, where the graph is
captured); ``sched``: the metadata for a bucket of 4 with padded ``seq_lens`` 0 at num_splits 32, 1 and 0, one line
per batch (its size and entries: the seed's buffer of ``1 + round_up(4, 4) * 4`` = 17 holds it).
Usage on a GPU machine with vLLM 0.24's FA3 (and flash-attn 2 for fa2), from the repository root:
``PYTHONPATH=. python scripts/investigate_engine_graphs.py planted fa3-vllm fa2`` and ``... sched``.
"""

from __future__ import annotations

import json
import sys

import torch


def planted(backends: list[str]) -> None:
    import conformance.engines as engines
    from attnfast.registry import get_backend
    from conformance.engines.vllm_v0 import VllmV0FlashAttention
    from conformance.engines.vllm_v1 import VllmV1FlashAttention
    from conformance.verdict.check import check_backend, prepare_context
    from tests.conformance.engines.test_vllm_v0_graph import CASES as V0, _StaleRows
    from tests.conformance.engines.test_vllm_v1_graph import CASES as V1, _CaptureMetadataReused, _SplitsFromBatch

    runs = [
        (VllmV1FlashAttention, _CaptureMetadataReused, V1["graph_decode_aot"]),
        (VllmV1FlashAttention, _SplitsFromBatch, V1["graph_spec_decode_aot"]),
        (VllmV0FlashAttention, _StaleRows, V0["graph_decode"]),
        (VllmV0FlashAttention, _StaleRows, V0["graph_decode_bs256"]),
    ]
    for backend in backends:
        for cls, run, case in runs:
            engine = type("Planted", (cls,), {"graph_run": run})()
            engines.get_engine = lambda name, e=engine: e  # check.composition_of looks the engine up here
            r = check_backend(prepare_context(case, 0, "cuda"), get_backend(backend))
            graph = r.extra.get("graph", {})
            line = {"backend": backend, "bug": run.__name__, "case": case.id, "status": r.status.value}
            print(json.dumps(line | {"reason": r.reason, "captured": graph.get("captured")}))


def sched() -> None:
    from vllm.vllm_flash_attn import get_scheduler_metadata

    cu = torch.arange(0, 5, dtype=torch.int32, device="cuda")
    for lens in ([41, 8, 96, 17], [131, 0, 0, 0], [4, 62, 0, 0], [78, 2, 21, 0], [13, 141, 34, 65], [3000, 5, 0, 0]):
        for splits in (32, 1, 0):
            seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
            m = get_scheduler_metadata(
                4, 1, max(lens), 8, 2, 64, seqlens, qkv_dtype=torch.bfloat16, headdim_v=64, cu_seqlens_q=cu,
                page_size=16, causal=True, window_size=(-1, -1), num_splits=splits,
            )  # fmt: skip
            print(lens, splits, m.numel(), m.tolist())


if __name__ == "__main__":
    if sys.argv[1:2] == ["planted"]:
        planted(sys.argv[2:])
    elif sys.argv[1:2] == ["sched"]:
        sched()
    else:
        sys.exit("usage: investigate_engine_graphs.py planted BACKEND... | sched")
