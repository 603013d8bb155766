"""The harness's detection power: every planted-bug fake (``tests/conformance/fakes.py``) through ``attnconf fuzz``
and through named suites; which bug each catches, after how many cases and how many seconds.

    python scripts/detection_power.py [--out reports/detection-power] [--device cpu] [--seed 0]
        [--fuzz-cases 100] [--max-tokens 256] [--suite smoke] [--suite default] [--suite-cap-s 120]
        [--fake WindowOffByOneBackend ...]

* fuzz: :func:`conformance.fuzz.campaign.run_fuzz` (crash-isolated worker, the fake as ``module:Class``), a fixed
  seed and case budget; "after" = the drawn cases run up to and including the first failure, seconds = the sum
  of those records' round trips (checking only: worker start and shrinking excluded); plus the groups the
  failures fall into, the minimal case of the largest group and the shrink evaluations spent.
* suites: the suite's cases in suite order, checked in-process (inputs, reference, baseline, fake, verdict:
  what a worker does, without its process), stopping at the first failure; seconds = the checks' wall time.
  ``--suite-cap-s`` stops a suite that has not caught the bug after that many seconds ("not caught in the first
  N of M cases"), so a suite too slow for the machine (``default`` on 2 CPU cores: about 1.6 s per case) is still
  measured as far as it got.
* controls: the bug-free fakes (``ExactBackend``, ``StoredExactBackend``) run the same way; any failure they show
  is a false alarm of the harness.

Writes ``detection-power.json`` (every measurement) and ``detection-power.md`` (the table) to ``--out``; the JSON
is rewritten after each fake, so an interrupted run keeps what it measured.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from conformance.suites.registry import get_suite  # noqa: E402
from conformance.fuzz.campaign import Budget, FuzzConfig, run_fuzz  # noqa: E402
from conformance.fuzz.draw import DrawLimits  # noqa: E402
from conformance.fuzz.group import fuzz_role  # noqa: E402
from conformance.records import Status  # noqa: E402
from conformance.running.env import git_commit  # noqa: E402
from conformance.verdict.check import check_backend, prepare_context  # noqa: E402
from tests.conformance import fakes  # noqa: E402

CONTROLS = (fakes.ExactBackend, fakes.StoredExactBackend)


def bug_fakes() -> dict[str, tuple[type, str]]:
    """name -> (class, the cases that expose its bug), controls first."""
    out: dict[str, tuple[type, str]] = {c.__name__: (c, "(bug-free control)") for c in CONTROLS}
    out.update({c.__name__: (c, f"feature {feature}") for c, feature in fakes.PLANTED_BUGS.items()})
    out.update({c.__name__: (c, cond) for c, cond in fakes.MODE_BUGS.items()})
    return out


def measure_fuzz(cls: type, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    spec = f"tests.conformance.fakes:{cls.__name__}"
    t0 = time.perf_counter()
    summary = run_fuzz(
        FuzzConfig(
            backends=(spec,),
            device=args.device,
            budget=Budget(cases=args.fuzz_cases),
            seed=args.seed,
            out=tmp / f"{cls.__name__}.jsonl",
            limits=DrawLimits(max_tokens=args.max_tokens),
            timeout=args.timeout,
            progress=False,
        )
    )
    wall = time.perf_counter() - t0
    originals = [r for r in summary.records if fuzz_role(r).get("role") == "original"]
    first = next((i for i, r in enumerate(originals) if r.status.is_problem), None)
    checked_s = sum(float(r.extra.get("roundtrip_s", r.elapsed_s)) for r in originals[: (first or 0) + 1])
    top = summary.groups[0] if summary.groups else None
    return {
        "caught": first is not None,
        "cases_run": len(originals),
        "failures": sum(r.status.is_problem for r in originals),
        "statuses": {s.value: sum(r.status is s for r in originals) for s in Status},
        "first_failure_after_cases": None if first is None else first + 1,
        "first_failure_after_s": None if first is None else round(checked_s, 2),
        "groups": [{"label": g.label, "kind": g.kind, "count": g.count} for g in summary.groups],
        "top_minimal": None if top is None else {"id": top.representative.case_id, "case": top.representative.case},
        "shrink_evaluations": summary.shrink_evaluations,
        "wall_s": round(wall, 1),
    }


def measure_suite(cls: type, suite: str, args: argparse.Namespace) -> dict[str, Any]:
    backend = cls()
    cases = get_suite(suite)
    spent = 0.0
    statuses = {s.value: 0 for s in Status}
    for n, case in enumerate(cases, start=1):
        t0 = time.perf_counter()
        try:
            result = check_backend(prepare_context(case, seed=args.seed, device=args.device), backend)
            status = result.status
        except Exception as exc:  # noqa: BLE001 - a harness error on a case: reported, the sweep goes on
            print(f"  {suite} {case.id}: harness error {type(exc).__name__}: {exc}", file=sys.stderr)
            status = Status.ERROR
        spent += time.perf_counter() - t0
        statuses[status.value] += 1
        if status.is_problem:
            return {"caught": True, "after_cases": n, "after_s": round(spent, 2), "of": len(cases)}
        if args.suite_cap_s and spent > args.suite_cap_s:
            break
    return {
        "caught": False,
        "checked": sum(statuses.values()),
        "checked_s": round(spent, 1),
        "of": len(cases),
        "complete": sum(statuses.values()) == len(cases),
        "statuses": statuses,
    }


def _fuzz_cell(m: dict[str, Any], control: bool) -> str:
    if not m["caught"]:
        return f"no failure in {m['cases_run']} cases" if control else f"**not caught** in {m['cases_run']} cases"
    groups = "; ".join(f"{g['label']} ({g['count']})" for g in m["groups"][:2])
    more = f" +{len(m['groups']) - 2} groups" if len(m["groups"]) > 2 else ""
    return (
        f"after {m['first_failure_after_cases']} cases, {m['first_failure_after_s']} s; "
        f"{m['failures']}/{m['cases_run']} fail; groups: {groups}{more}"
    )


def _suite_cell(m: dict[str, Any], control: bool) -> str:
    if m["caught"]:
        return f"after {m['after_cases']} of {m['of']} cases, {m['after_s']} s"
    nothing = "no failure" if control else "**not caught**"
    if m["complete"]:
        return f"{nothing} ({m['of']} cases, {m['checked_s']} s)"
    return f"{nothing} in the first {m['checked']} of {m['of']} cases ({m['checked_s']} s cap)"


def render(doc: dict[str, Any]) -> str:
    suites = doc["config"]["suites"]
    lines = [
        "# Detection power: planted bugs through `attnconf fuzz` and through suites",
        "",
        f"Generated {doc['generated']} by `python scripts/detection_power.py {' '.join(doc['config']['argv'])}` "
        f"(commit `{doc['git_commit']}`, {doc['machine']}). Fuzz: seed {doc['config']['seed']}, "
        f"{doc['config']['fuzz_cases']} cases, `--max-tokens {doc['config']['max_tokens']}`, device "
        f"`{doc['config']['device']}`; a case = one drawn case checked; seconds = checking time up to the first "
        "failure (worker start and shrinking excluded). Suites: in suite order, stopped at the first failure"
        + (f" or after {doc['config']['suite_cap_s']} s." if doc["config"]["suite_cap_s"] else "."),
        "",
        "| fake | exposed by | fuzz | minimal case of the largest group | "
        + " | ".join(f"`{s}`" for s in suites)
        + " |",
        "|---|---|---|---|" + "---|" * len(suites),
    ]
    for name, row in doc["fakes"].items():
        fz = row.get("fuzz")
        minimal = f"`{fz['top_minimal']['id']}`" if fz and fz.get("top_minimal") else ""
        control = row["exposed_by"].startswith("(")
        cells = [_suite_cell(row["suites"][s], control) if s in row.get("suites", {}) else "n/a" for s in suites]
        fuzz = _fuzz_cell(fz, control) if fz else "n/a"
        lines.append(f"| `{name}` | {row['exposed_by']} | {fuzz} | {minimal} | " + " | ".join(cells) + " |")
    bugs = {n: r for n, r in doc["fakes"].items() if not r["exposed_by"].startswith("(")}
    controls = {n: r for n, r in doc["fakes"].items() if r["exposed_by"].startswith("(")}

    def caught(r: dict[str, Any], where: str) -> bool:
        m = r.get("fuzz") if where == "fuzz" else r.get("suites", {}).get(where)
        return bool(m and m.get("caught"))

    totals = ", ".join(f"{w} {sum(caught(r, w) for r in bugs.values())}" for w in ["fuzz", *suites])
    false = [n for n, r in controls.items() if any(caught(r, w) for w in ["fuzz", *suites])]
    lines += ["", f"Caught (of {len(bugs)} planted bugs): {totals}."]
    lines.append("False alarms on the bug-free controls: " + (", ".join(false) if false else "none") + ".")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=REPO / "reports" / "detection-power")
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fuzz-cases", type=int, default=100)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--suite", action="append", default=None, help="suite(s) to compare with (default: smoke)")
    p.add_argument("--suite-cap-s", type=float, default=120.0, help="seconds per (fake, suite), then stop; 0: none")
    p.add_argument("--fake", action="append", default=None, help="only these fakes (class names)")
    p.add_argument("--no-fuzz", action="store_true", help="measure the suites only")
    args = p.parse_args(argv)
    args.suite = args.suite or ["smoke"]
    chosen = bug_fakes()
    if args.fake:
        unknown = set(args.fake) - set(chosen)
        if unknown:
            p.error(f"unknown fake(s) {sorted(unknown)}; choose from {sorted(chosen)}")
        chosen = {n: chosen[n] for n in args.fake}
    args.out.mkdir(parents=True, exist_ok=True)
    json_path = args.out / "detection-power.json"
    doc: dict[str, Any] = json.loads(json_path.read_text()) if json_path.exists() else {"fakes": {}}
    doc.update(
        generated=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        git_commit=git_commit(),
        machine=f"{platform.node()}, {platform.processor() or platform.machine()}",
        config={
            "argv": list(argv if argv is not None else sys.argv[1:]),
            "device": args.device,
            "seed": args.seed,
            "fuzz_cases": args.fuzz_cases,
            "max_tokens": args.max_tokens,
            "suites": args.suite,
            "suite_cap_s": args.suite_cap_s,
        },
    )
    with tempfile.TemporaryDirectory() as tmp:
        for name, (cls, exposed) in chosen.items():
            row = doc["fakes"].setdefault(name, {})
            row["exposed_by"] = exposed
            row.setdefault("suites", {})
            if not args.no_fuzz:
                print(f"{name}: fuzz", file=sys.stderr)
                row["fuzz"] = measure_fuzz(cls, args, Path(tmp))
            for suite in args.suite:
                print(f"{name}: {suite}", file=sys.stderr)
                row["suites"][suite] = measure_suite(cls, suite, args)
            json_path.write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n")
            (args.out / "detection-power.md").write_text(render(doc))
    print(f"wrote {json_path} and {args.out / 'detection-power.md'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
