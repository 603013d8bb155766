"""Detection power of the backward verdict on ALiBi cases of a backend that hands ALiBi to its kernel as a rounded
bias (sdpa-cuda), before and after the ALiBi-bias baseline (issue 31 item 5): planted ALiBi bugs on a simulated
fused SDPA kernel, judged with each baseline.

    python scripts/alibi_bwd_detection.py [--out reports/detection-power]

Cases: four of ``scripts/investigate_bwd_triage.py``'s ``sdpa-cuda-wide`` grid (sdpa-cuda's failing class on the
H100: d224, ALiBi, ``outliers``; 16/2 and 8/1 heads, bf16 and fp16, 1031 and 2048 keys) and ``default``'s ALiBi
backward cases without a soft-cap (SDPA has none).
Backends (``tests/conformance/backward/alibi_sim.py``): the bug-free simulation (a fused SDPA kernel fed the
adapter's rounded bias) and each planted bug on top of it.  Each (case, backend) is judged by ``check_backend``
twice: with the baseline before the fix (exact ALiBi: the backend's ``alibi_bias_dtype`` None) and after it.

Writes ``alibi-backward.json`` (every verdict: status, failed sub-checks, the worst max-rule ratio) and
``alibi-backward.md`` (the table) to ``--out``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import conformance.backward.gradients as grad_mod  # noqa: E402
from conformance.cases.case import AttentionCase  # noqa: E402
from conformance.suites.registry import get_suite  # noqa: E402
from conformance.verdict.check import check_backend  # noqa: E402
from tests.conformance.backward.alibi_sim import ALIBI_BUGS, AlibiOneSidedBackend, SdpaBiasKernelSim  # noqa: E402

sys.path.insert(0, str(REPO / "scripts"))
import _bwd_detection as frame  # type: ignore[import-not-found]  # noqa: E402
from investigate_bwd_triage import GRID, grid_case  # type: ignore[import-not-found]  # noqa: E402

BACKENDS: list[tuple[type[SdpaBiasKernelSim], str]] = [
    (SdpaBiasKernelSim, "control: fused SDPA kernel fed the adapter's rounded bias"),
] + [(cls, "bug" if must else "below rounding") for cls, must in ALIBI_BUGS.items()]
#: the wide grid's entries: (dtype, causal, heads, requests index, seed) of runs that failed on the H100
_PICK = [("bf16", False, 16, 1, 0), ("fp16", False, 16, 2, 0), ("bf16", True, 8, 2, 1), ("fp16", True, 16, 1, 1)]


def cases(args: object = None) -> list[tuple[AttentionCase, int]]:
    """(case, seed): the H100's failing runs picked from the wide grid, then ``default``'s (seed 0)."""
    wide = [grid_case(f) for f in GRID["sdpa-cuda-wide"]]
    picked = []
    for dtype, causal, heads, r, seed in _PICK:
        same = [c for c in wide if c.dtype == dtype and c.causal == causal and c.num_heads == heads]
        picked.append((same[r], seed))
    default = [c for c in get_suite("default") if c.backward and c.alibi and c.softcap is None]
    return picked + [(c, 0) for c in default]


def judge(ctx, mode: str, cls: type[SdpaBiasKernelSim]) -> dict[str, Any]:
    grad_mod._CACHE.clear()
    backend = cls()
    if mode == "before":  # the baseline with exact ALiBi
        backend.alibi_bias_dtype = lambda case: None  # type: ignore[method-assign]
    r = check_backend(ctx, backend)
    grad_mod._CACHE.clear()
    bw = r.extra.get("backward") or {}
    failed = {n: t["failed"] for n, t in (bw.get("tensors") or {}).items() if t.get("failed")}
    return {"status": r.status.value, "reason": r.reason[:300], "worst_ratio": bw.get("worst_ratio"), "failed": failed}


def render(data: dict[str, Any], args: object = None) -> str:
    rows = data["rows"]
    missed = [
        f"- `{r['fake']}` on `{r['case_id']}` seed {r['seed']} "
        f"(before: {r['before']['status']}, after: {r['after']['status']})"
        for r in frame.missed(rows, ALIBI_BUGS, BACKENDS)
    ]
    return frame.page(
        "# Detection power: ALiBi backward of a rounded-bias kernel, before and after the ALiBi-bias baseline",
        f"Generated {data['generated']} by `python scripts/alibi_bwd_detection.py` (commit `{data['commit']}`, "
        f"CPU, {data['seconds']} s). Cases: {data['cases']} (4 of the H100's failing class from "
        "`investigate_bwd_triage.py`'s `sdpa-cuda-wide` grid and `default`'s ALiBi backward cases without a "
        "soft-cap; the first 4 at the seed they failed with there, the others at seed 0). A backend fails a case "
        "on any failed check (forward or backward); before = the "
        "baseline with exact ALiBi, after = ALiBi rounded as sdpa-cuda hands it to the kernel "
        "(`conformance/backward/gradients.py`, `alibi_dtype`). Worst ratio: the range over the cases of the "
        "largest gradient error ratio (max rule). `AlibiOneSidedBackend` runs on the non-causal cases only "
        "(causal: the one-sided penalty is the right one).",
        frame.table(rows, BACKENDS, "worst ratio", lambda m: m["worst_ratio"]),
        missed,
    )


def main() -> int:
    return frame.main(
        __doc__,
        "alibi-backward",
        render,
        cases,
        BACKENDS,
        judge,
        skip=lambda case, cls: cls is AlibiOneSidedBackend and (case.causal or case.sinks),
        record_seed=True,
    )


if __name__ == "__main__":
    sys.exit(main())
