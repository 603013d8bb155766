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
import datetime as _dt
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import conformance.backward.gradients as grad_mod  # noqa: E402
from conformance.cases.case import AttentionCase  # noqa: E402
from conformance.running.env import git_commit  # noqa: E402
from conformance.suites.registry import get_suite  # noqa: E402
from conformance.verdict.check import check_backend, prepare_context  # noqa: E402
from tests.conformance.backward.softcap_sim import SOFTCAP_BUGS, SoftcapKernelSim  # noqa: E402

sys.path.insert(0, str(REPO / "scripts"))
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


def judge(case: AttentionCase, mode: str, ctx, cls: type[SoftcapKernelSim]) -> dict[str, Any]:
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


def table(rows: list[dict[str, Any]], names: list[str]) -> list[str]:
    out = [
        "| backend | kind | " + " | ".join(["before: cases failed", "after: cases failed"]) + " |",
        "|---|---|---|---|",
    ]
    for cls, kind in BACKENDS:
        cells = []
        for mode in ("before", "after"):
            failed = [r for r in rows if r["backend"] == cls.name and r[mode]["status"] != "pass"]
            n = sum(1 for r in rows if r["backend"] == cls.name)
            worst = max((r[mode]["dk"]["mean"] / r[mode]["dk"]["mean_bound"] for r in rows
                         if r["backend"] == cls.name and "dk" in r[mode]), default=float("nan"))  # fmt: skip
            cells.append(f"{len(failed)} of {n} (dK mean / bound up to {worst:.2f})")
        out.append(f"| `{cls.__name__}` | {kind} | " + " | ".join(cells) + " |")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(REPO / "reports" / "detection-power"))
    ap.add_argument("--sample", type=int, default=9, help="how many of default's soft-capped backward cases")
    args = ap.parse_args()
    t0 = time.time()
    rows: list[dict[str, Any]] = []
    todo = cases(args.sample)
    for case in todo:
        ctx = prepare_context(case, 0, "cpu")
        for cls, _ in BACKENDS:
            row: dict[str, Any] = {"case_id": case.id, "backend": cls.name, "fake": cls.__name__}
            row.update({mode: judge(case, mode, ctx, cls) for mode in ("before", "after")})
            rows.append(row)
            print(json.dumps({k: row[k] for k in ("case_id", "fake")}), row["before"]["status"],
                  row["after"]["status"], flush=True)  # fmt: skip
    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    head = {"generated": now, "commit": git_commit(), "seconds": round(time.time() - t0, 1), "cases": len(todo)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "softcap-backward.json").write_text(json.dumps({**head, "rows": rows}, indent=1) + "\n", encoding="utf-8")
    names = [c.id for c in todo]
    md = [
        "# Detection power: soft-capped 16-bit backward, before and after the soft-capped baseline",
        "",
        f"Generated {now} by `python scripts/softcap_bwd_detection.py --sample {args.sample}` (commit "
        f"`{head['commit']}`, CPU, {head['seconds']} s). Cases: {len(names)} (the triage grid's 5 soft-capped "
        f"cases and {len(names) - 5} of `default`'s 27 soft-capped backward cases, evenly spaced), seed 0. A backend "
        "fails a case on any failed check (forward or backward); before = the baseline with the tanh argument in "
        "fp32, after = formed at fp16 precision (`conformance/backward/gradients.py`).",
        "",
        *table(rows, names),
        "",
    ]
    (out / "softcap-backward.md").write_text("\n".join(md), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
