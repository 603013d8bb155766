"""Measure what happens when an adapter without a graph mode is captured anyway (issue 18: "what a kernel cannot
capture is unsupported with the measured message").

For each backend named on the command line, prepare an ordinary paged decode call and try to capture it into a
``torch.cuda.CUDAGraph``; print one JSON line per backend with the exception (type and first line) or "captured".
Usage on a GPU machine: ``python scripts/probe_graph_capture.py sdpa-cuda torch-flash > probe.jsonl``.
"""

from __future__ import annotations

import json
import sys

import torch

from attnfast.registry import get_backend
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import make_inputs


def probe(name: str) -> dict:
    backend = get_backend(name)
    paged = dict(kv_layout="NHD", block_size=16) if name != "torch-flash" else {}
    case = AttentionCase(((1, 300), (1, 41)), num_heads=32, num_kv_heads=8, head_dim=128, causal=True, **paged)
    support = backend.supports(case, "cuda")
    if not support:
        return {"backend": name, "case": case.id, "result": "refused before capture", "reason": support.reason}
    inputs = make_inputs(case, 0, "cuda")
    fn = backend.prepare(case, inputs)
    fn()  # warm-up
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            fn = backend.prepare(case, inputs)
            fn()
    except Exception as exc:  # the measurement
        line = (str(exc).strip().splitlines() or [""])[0]
        return {"backend": name, "case": case.id, "result": "capture failed", "error": f"{type(exc).__name__}: {line}"}
    return {"backend": name, "case": case.id, "result": "captured"}


if __name__ == "__main__":
    for name in sys.argv[1:]:
        print(json.dumps(probe(name)), flush=True)
