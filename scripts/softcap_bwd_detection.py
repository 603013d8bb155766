"""Detection power of the backward verdict on soft-capped 16-bit cases, before and after the soft-capped baseline
(issue 31 item 5): planted soft-cap bugs on a simulated FA2-like kernel, judged with each baseline.

    python scripts/softcap_bwd_detection.py [--out reports/detection-power] [--sample N]

Cases: the four fp16 and the bf16 soft-capped cases of ``scripts/investigate_bwd_triage.py``'s grid (FA2 2.8.3's
failing class on the H100) and ``default``'s soft-capped backward cases (``--sample N``: N of them, evenly spaced
in suite order).
Backends (``tests/conformance/backward/softcap_sim.py``): the bug-free FA2-like simulation (its soft-cap tanh
carrying an error calibrated on FA2's measured dK error), the same without that error (P and dS rounded only), and
each planted bug on top of the simulation.  Each (case, backend) is judged by ``check_backend`` twice: with the
baseline before the fix (``softcap_arg_dtype`` patched to None: the tanh argument in fp32) and after it.

Writes ``softcap-backward.json`` (every verdict: status, failed sub-checks, dK/dQ/dV mean and its bound) and
``softcap-backward.md`` (the table) to ``--out``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import conformance.backward.gradients as grad_mod  # noqa: E402
from conformance.cases.case import AttentionCase  # noqa: E402
from conformance.suites.registry import get_suite  # noqa: E402
from conformance.verdict.check import check_backend  # noqa: E402
from tests.conformance.backward.softcap_sim import SOFTCAP_BUGS, SoftcapKernelSim  # noqa: E402

sys.path.insert(0, str(REPO / "scripts"))
import _bwd_detection as frame  # type: ignore[import-not-found]  # noqa: E402
from investigate_bwd_triage import GRID, HEADS, REQUESTS  # type: ignore[import-not-found]  # noqa: E402


class RoundingOnlySim(SoftcapKernelSim):
    """The simulation without the tanh error: P and dS rounded to the case dtype, as the old baseline models."""

    name = "fake-bwd-softcap-sim-exact-tanh"
    noise = 0.0


BACKENDS: list[tuple[type[SoftcapKernelSim], str]] = [
    (SoftcapKernelSim, "control: FA2-like (tanh error calibrated on the H100)"),
    (RoundingOnlySim, "control: P and dS rounded, exact tanh"),
] + [(cls, "bug" if must else "below rounding") for cls, must in SOFTCAP_BUGS.items()]


def cases(sample: int) -> list[AttentionCase]:
    grid = [AttentionCase(REQUESTS, **HEADS, **f) for f in GRID["fa2"] if f.get("softcap")]
    default = [c for c in get_suite("default") if c.backward and c.softcap is not None]
    step = max(1, len(default) // max(sample, 1))
    return grid + default[::step][:sample]


def judge(ctx, mode: str, cls: type[SoftcapKernelSim]) -> dict[str, Any]:
    grad_mod._CACHE.clear()
    saved = grad_mod.softcap_arg_dtype
    if mode == "before":
        grad_mod.softcap_arg_dtype = lambda case: None
    try:
        r = check_backend(ctx, cls())
    finally:
        grad_mod.softcap_arg_dtype = saved
        grad_mod._CACHE.clear()
    tensors = (r.extra.get("backward") or {}).get("tensors", {})
    out: dict[str, Any] = {"status": r.status.value, "reason": r.reason[:300]}
    for n in ("dq", "dk", "dv"):
        t = tensors.get(n)
        if t and "mean_abs" in t:
            tol = r.extra["backward"]["tolerance"]
            bound = tol["mean_factor"] * t["baseline_mean_abs"] + tol["mean_atol"]
            out[n] = {
                "mean": t["mean_abs"],
                "mean_bound": bound,
                "error_ratio": t["error_ratio"],
                "failed": t["failed"],
            }
    return out


def render(data: dict[str, Any], sample: int) -> str:
    rows = data["rows"]
    missed = [
        f"- `{r['fake']}` on `{r['case_id']}` (before: {r['before']['status']}, after: {r['after']['status']})"
        for r in frame.missed(rows, SOFTCAP_BUGS, BACKENDS)
    ]
    return frame.page(
        "# Detection power: soft-capped 16-bit backward, before and after the soft-capped baseline",
        f"Generated {data['generated']} by `python scripts/softcap_bwd_detection.py --sample {sample}` (commit "
        f"`{data['commit']}`, CPU, {data['seconds']} s). Cases: {data['cases']} (the triage grid's 5 soft-capped "
        f"cases and {data['cases'] - 5} of `default`'s 27 soft-capped backward cases, evenly spaced), seed 0. A "
        "backend fails a case on any failed check (forward or backward); before = the baseline with the tanh's "
        "argument in fp32, after = formed in fp16 for fp16 cases (`conformance/backward/gradients.py`). "
        "dK mean / its bound: the range over the cases of the dK mean error over the mean rule's bound.",
        frame.table(
            rows,
            BACKENDS,
            "dK mean / its bound",
            lambda m: m["dk"]["mean"] / m["dk"]["mean_bound"] if "dk" in m else None,
        ),
        missed,
    )


def _options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--sample", type=int, default=9, help="how many of default's soft-capped backward cases")


def main() -> int:
    return frame.main(
        __doc__,
        "softcap-backward",
        lambda data, args: render(data, args.sample),
        lambda args: [(case, 0) for case in cases(args.sample)],
        BACKENDS,
        judge,
        options=_options,
    )


if __name__ == "__main__":
    sys.exit(main())
