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
_BY_NAME: dict[str, type[SoftcapKernelSim]] = {cls.__name__: cls for cls, _ in BACKENDS}


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


def table(rows: list[dict[str, Any]]) -> list[str]:
    out = [
        "| backend | kind | before: cases failed | dK mean / its bound | after: cases failed | dK mean / its bound |",
        "|---|---|---|---|---|---|",
    ]
    for cls, kind in BACKENDS:
        mine = [r for r in rows if r["backend"] == cls.name]
        cells = []
        for mode in ("before", "after"):
            failed = sum(1 for r in mine if r[mode]["status"] != "pass")
            ratios = [r[mode]["dk"]["mean"] / r[mode]["dk"]["mean_bound"] for r in mine if "dk" in r[mode]]
            span = f"{min(ratios):.2f} to {max(ratios):.2f}" if ratios else "-"
            cells += [f"{failed} of {len(mine)}", span]
        out.append(f"| `{cls.__name__}` | {kind} | " + " | ".join(cells) + " |")
    return out


def render(data: dict[str, Any], sample: int) -> str:
    rows = data["rows"]
    missed = [
        f"- `{r['fake']}` on `{r['case_id']}` (before: {r['before']['status']}, after: {r['after']['status']})"
        for r in rows
        if SOFTCAP_BUGS.get(_BY_NAME[r["fake"]], False) and r["after"]["status"] == "pass"
    ]
    return "\n".join(
        [
            "# Detection power: soft-capped 16-bit backward, before and after the soft-capped baseline",
            "",
            f"Generated {data['generated']} by `python scripts/softcap_bwd_detection.py --sample {sample}` (commit "
            f"`{data['commit']}`, CPU, {data['seconds']} s). Cases: {data['cases']} (the triage grid's 5 soft-capped "
            f"cases and {data['cases'] - 5} of `default`'s 27 soft-capped backward cases, evenly spaced), seed 0. A "
            "backend fails a case on any failed check (forward or backward); before = the baseline with the tanh's "
            "argument in fp32, after = formed in fp16 for fp16 cases (`conformance/backward/gradients.py`). "
            "dK mean / its bound: the range over the cases of the dK mean error over the mean rule's bound.",
            "",
            *table(rows),
            "",
            "Planted bugs the verdict does not catch after the change:",
            "",
            *(missed or ["- none"]),
            "",
        ]
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(REPO / "reports" / "detection-power"))
    ap.add_argument("--sample", type=int, default=9, help="how many of default's soft-capped backward cases")
    ap.add_argument("--render-only", action="store_true", help="rewrite the .md from the .json in --out, run nothing")
    args = ap.parse_args()
    if args.render_only:
        data = json.loads((Path(args.out) / "softcap-backward.json").read_text(encoding="utf-8"))
        (Path(args.out) / "softcap-backward.md").write_text(render(data, args.sample), encoding="utf-8")
        return 0
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
    data = {"generated": now, "commit": git_commit(), "seconds": round(time.time() - t0, 1), "cases": len(todo)}
    data["rows"] = rows
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "softcap-backward.json").write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    (out / "softcap-backward.md").write_text(render(data, args.sample), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
