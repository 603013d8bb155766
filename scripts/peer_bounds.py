"""Is this verdict as strict as flash-attention's own test rule on long bf16 decode?  (issue 31 item 8)

    python scripts/peer_bounds.py [--out reports/detection-power] [--seed 0] [--quick]

flash-attention v2.8.3, ``tests/test_flash_attn.py``, ``test_flash_attn_kvcache`` asserts

    (out - out_ref).abs().max() <= mult * (out_pt - out_ref).abs().max() + 1e-5      (mult 3, 5 with ALiBi)

with ``out_ref = attention_ref(...)`` (computed in fp32, returned rounded to the input dtype) and ``out_pt =
attention_ref(..., upcast=False, reorder_ops=True)`` (the same-precision PyTorch attention, ``k / sqrt(d)`` in the
input dtype); ``test_flash_attn_splitkv`` and ``test_flash_attn_causal`` of the same file use ``mult`` 2.  Both are
evaluated here on the kernel's output, ``out_pt`` recomputed as that function computes it (:func:`peer_baseline`).

Each planted-bug fake (``tests/conformance/fakes.py``: ``ROUNDING_BUGS`` on the flash-style control, and the
exact-arithmetic ``SinksIgnoredBackend``) and each bug-free control runs on a grid of long decode cases
(:func:`grid`) through this harness's own verdict (:func:`conformance.verdict.check.check_backend`, as a worker
checks a case), and again under the verdict as it was before issue 31 item 8 (``atol_rel = inf``: the fixed
``atol`` of every element), and its output is judged by the two peer rules.  Writes ``peer-bounds.json`` (every
measurement) and ``peer-bounds.md`` (the tables) to ``--out``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from attnref import row_bounds  # noqa: E402
from conformance.cases.case import AttentionCase  # noqa: E402
from conformance.cases.inputs import CaseInputs  # noqa: E402
from conformance.running.env import git_commit  # noqa: E402
from conformance.verdict.check import check_backend, prepare_context  # noqa: E402
from conformance.verdict.compare import compare_details  # noqa: E402
from conformance.verdict.reference import case_options  # noqa: E402
from conformance.verdict.tolerance import resolve  # noqa: E402
from tests.conformance import fakes  # noqa: E402

PEER_SOURCE = "Dao-AILab/flash-attention v2.8.3, tests/test_flash_attn.py"
#: (name, mult, where): the peer rules evaluated, ``max|out - out_ref| <= mult * max|out_pt - out_ref| + 1e-5``.
PEER_RULES = (
    ("kvcache", 3.0, "test_flash_attn_kvcache (without ALiBi)"),
    ("splitkv", 2.0, "test_flash_attn_splitkv, test_flash_attn_causal"),
)
PEER_ATOL = 1e-5
#: Quantiles of the committed GPU passes' ``max_abs / (factor * B)`` that the report gives.
QUANTILES = (("median", 0.5), ("p99", 0.99), ("max", 1.0))
#: The verdict before issue 31 item 8: the fixed atol of every element.
BEFORE = ({"atol_rel": math.inf},)

CONTROLS = (fakes.ExactBackend, *fakes.ROUNDING_CONTROLS)
BUGS = (*fakes.ROUNDING_BUGS, fakes.SinksIgnoredBackend)


def grid(quick: bool = False) -> list[AttentionCase]:
    """Long bf16 decode: kv 2k / 8k / 16k, head dim 64 / 128, GQA 8:1 and MHA 8:8, batch 1 (and 4 for GQA at 16k),
    one request of 16k keys read through pages of 256, and sinks at 2k and 16k.  ``quick``: the 16k cases of
    batch 1."""
    out = []
    lengths = (16384,) if quick else (2048, 8192, 16384)
    for kv in lengths:
        for d in (64, 128):
            for h, hk in ((8, 1), (8, 8)):
                batches = (1, 4) if kv == 16384 and hk == 1 and not quick else (1,)
                for b in batches:
                    out.append(AttentionCase(((1, kv),) * b, num_heads=h, num_kv_heads=hk, head_dim=d, causal=True))
    if not quick:
        out.append(
            AttentionCase(((1, 16384),), num_heads=8, num_kv_heads=1, head_dim=128, causal=True, kv_layout="NHD",
                          block_size=256)
        )  # fmt: skip
        for kv in (2048, 16384):
            out.append(AttentionCase(((1, kv),), num_heads=8, num_kv_heads=1, head_dim=128, causal=True, sinks=True))
    return out


@torch.no_grad()
def peer_baseline(case: AttentionCase, inputs: CaseInputs) -> torch.Tensor:
    """``attention_ref(q, k, v, upcast=False, reorder_ops=True)`` of flash-attention's tests, per request: scores
    ``q @ (k / sqrt(d))`` in the case dtype, masked, softmax in the case dtype (a sink as one more logit, dropped
    before P @ V), P @ V in the case dtype.  ``(total_q, h, dv)`` in the case dtype."""
    dt = case.torch_dtype
    group = case.num_heads // case.num_kv_heads
    scale = case.scale if case.scale is not None else case.head_dim**-0.5
    options = case_options(case)
    cu_q, cu_k = inputs.cu_seqlens_q.tolist(), inputs.cu_seqlens_k.tolist()
    out = torch.zeros(case.total_q, case.num_heads, case.dv, dtype=dt)
    for b, (sq, sk) in enumerate(case.requests):
        q = inputs.q[cu_q[b] : cu_q[b + 1]].to(dt).permute(1, 0, 2)
        k = inputs.k[cu_k[b] : cu_k[b + 1]].to(dt).repeat_interleave(group, dim=1).permute(1, 0, 2)
        v = inputs.v[cu_k[b] : cu_k[b + 1]].to(dt).repeat_interleave(group, dim=1).permute(1, 0, 2)
        s = torch.matmul(q, (k * scale).transpose(-1, -2))  # reorder_ops: k scaled, in the case dtype
        lo, hi = row_bounds(torch.arange(sq), sq, sk, options)
        cols = torch.arange(sk)
        s = s.masked_fill(~((cols[None, :] >= lo[:, None]) & (cols[None, :] < hi[:, None])), -math.inf)
        if inputs.sinks is not None:
            sink = inputs.sinks.to(dt).reshape(-1, 1, 1).expand(-1, sq, 1)
            p = torch.softmax(torch.cat([s, sink], dim=-1), dim=-1)[..., :sk]
        else:
            p = torch.softmax(s, dim=-1)
        out[cu_q[b] : cu_q[b + 1]] = torch.matmul(p.to(dt), v).permute(1, 0, 2)
    return out


def capturing(cls: type) -> type:
    """``cls`` whose kernel call keeps its output in ``self.last`` (the same name, so the same tolerance)."""

    class Capturing(cls):  # type: ignore[misc, valid-type]
        def prepare(self, case, inputs):
            run = super().prepare(case, inputs)

            def kernel():
                self.last = run()
                return self.last

            return kernel

    Capturing.__name__ = cls.__name__
    return Capturing


def measure_case(case: AttentionCase, seed: int) -> list[dict[str, Any]]:
    t0 = time.perf_counter()
    ctx = prepare_context(case, seed=seed)
    dt = case.torch_dtype
    ref_rounded = ctx.ref.out.to(dt).float()  # attention_ref(upcast=True) returns the fp32 result in the input dtype
    pt_err = float((peer_baseline(case, ctx.inputs).float() - ref_rounded).abs().max())
    rows = []
    for cls in (*CONTROLS, *BUGS):
        backend = capturing(cls)()
        result = check_backend(ctx, backend)
        row: dict[str, Any] = {"case": case.id, "fake": cls.__name__, "control": cls in CONTROLS}
        if result.stats is None:
            row.update(status=result.status.value, reason=result.reason)
            rows.append(row)
            continue
        s = result.stats
        kernel_out = backend.last
        before, _, _ = compare_details(ctx.ref, ctx.base, kernel_out, resolve(case, cls.__name__, BEFORE))
        err = float((kernel_out.out.float() - ref_rounded).abs().max())
        output_checks = [c for c in s.failed_checks if c != "lse"]
        row.update(
            status=result.status.value,
            failed_checks=list(s.failed_checks),
            output_verdict="fail" if output_checks else "pass",
            error=s.max_abs,
            baseline_error=s.baseline_max_abs,
            allowed=s.allowed_max_abs,
            error_ratio=s.error_ratio,
            mean_error=s.mean_abs,
            lse_error=s.lse_max_abs,
            lse_allowed=s.lse_allowed,
            before={
                "allowed": before.allowed_max_abs,
                "error_ratio": before.error_ratio,
                "failed_checks": list(before.failed_checks),
                "output_verdict": "fail" if [c for c in before.failed_checks if c != "lse"] else "pass",
            },
            peer={"error": err, "pt_error": pt_err},
        )
        for name, mult, _ in PEER_RULES:
            bound = mult * pt_err + PEER_ATOL
            row["peer"][name] = {"bound": bound, "ratio": err / bound, "verdict": "fail" if err > bound else "pass"}
        rows.append(row)
    print(f"{case.id}: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return rows


def controls_on_suite(suite: str, every: int, seed: int) -> dict[str, Any]:
    """The CPU backends and the bug-free fakes on every ``every``-th case of ``suite`` under this verdict and under
    the fixed atol: the statuses, every pair whose status changed, the largest error ratio of each."""
    from attnfast.registry import get_backend
    from conformance.suites.registry import get_suite

    backends = [get_backend("sdpa-cpu"), get_backend("flex-cpu"), *(c() for c in (*CONTROLS, fakes.StoredExactBackend))]
    cases = get_suite(suite)[::every]
    counts: dict[str, dict[str, int]] = {b.name: {} for b in backends}
    worst: dict[str, dict[str, Any]] = {}
    changed = []
    for i, case in enumerate(cases, start=1):
        print(f"{suite} {i}/{len(cases)} {case.id}", file=sys.stderr)
        ctx = prepare_context(case, seed=seed)
        for b in backends:
            now, before = check_backend(ctx, b), check_backend(ctx, b, overrides=BEFORE)
            key = f"{before.status.value} -> {now.status.value}"
            counts[b.name][key] = counts[b.name].get(key, 0) + 1
            if now.status is not before.status:
                changed.append({"backend": b.name, "case": case.id, "before": before.status.value, "now": now.reason})
                print(f"changed: {b.name} {case.id}: {before.status.value} -> {now.reason}", file=sys.stderr)
            if now.stats is not None and now.stats.error_ratio > worst.get(b.name, {}).get("error_ratio", -1):
                worst[b.name] = {"error_ratio": now.stats.error_ratio, "case": case.id}
    return {"suite": suite, "every": every, "cases": len(cases), "counts": counts, "changed": changed, "worst": worst}


def render_controls(doc: dict[str, Any]) -> str:
    c = doc["controls"]
    lines = [
        f"# Peer bounds: the bug-free backends on `{c['suite']}` under this verdict and under the fixed atol",
        "",
        f"Generated {doc['generated']} by `{' '.join(['python scripts/peer_bounds.py', *doc['argv']])}` "
        f"(commit `{doc['git_commit']}`, {doc['machine']}, {doc['seconds']:.0f} s, seed {doc['seed']}): "
        + ("every" if c["every"] == 1 else f"every {c['every']}-th")
        + f" case of `{c['suite']}` ({c['cases']} cases), each backend judged by this verdict and by "
        "the verdict with `atol_rel = inf` (the fixed atol, before issue 31 item 8).",
        "",
        "| backend | before -> now: records | largest error ratio now (case) |",
        "|---|---|---|",
    ]
    for name, counts in c["counts"].items():
        w = c["worst"].get(name)
        cell = "; ".join(f"{k}: {v}" for k, v in sorted(counts.items()))
        lines.append(f"| `{name}` | {cell} | " + (f"{w['error_ratio']:.2f} (`{w['case']}`)" if w else "") + " |")
    lines += ["", f"Status changed: {len(c['changed'])}."]
    lines += [f"- `{x['backend']}` `{x['case']}`: {x['before']} -> {x['now']}" for x in c["changed"]]
    return "\n".join(lines) + "\n"


def scan_records(paths: list[Path]) -> dict[str, Any]:
    """Every committed pass of a bf16/fp16 case (``reports/**/*.jsonl.gz``): whether its max error is within
    ``factor x`` its baseline's, so that it passes under any constant term (the elementwise atol included); those
    that are not need the tensors to say, and are listed."""
    import gzip

    out: dict[str, Any] = {"files": len(paths), "passes": 0, "within_factor_x_baseline": 0, "over": []}
    bounds: list[float] = []  # max_abs / (factor * B): at least the error ratio under any constant term
    for path in paths:
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            for line in fh:
                rec = json.loads(line)
                stats = rec.get("stats") or {}
                if rec.get("type") != "result" or rec.get("status") != "pass" or "max_abs" not in stats:
                    continue
                if rec.get("case", {}).get("dtype", "bf16") not in ("bf16", "fp16"):
                    continue
                factor = (rec.get("extra") or {}).get("tolerance", {}).get("factor", 2.0)
                out["passes"] += 1
                b = factor * stats["baseline_max_abs"]
                bounds.append(stats["max_abs"] / b if b else (0.0 if stats["max_abs"] == 0 else math.inf))
                if stats["max_abs"] <= factor * stats["baseline_max_abs"]:
                    out["within_factor_x_baseline"] += 1
                else:
                    out["over"].append(
                        {
                            "file": str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path),
                            "backend": rec.get("backend"),
                            "case": rec.get("case_id"),
                            "error": stats["max_abs"],
                            "baseline_error": stats["baseline_max_abs"],
                            "factor": factor,
                        }
                    )
    bounds.sort()
    if bounds:
        out["ratio_bound"] = {q: bounds[min(len(bounds) - 1, int(f * len(bounds)))] for q, f in QUANTILES}
    return out


def _g(x: float | None) -> str:
    return "" if x is None else f"{x:.2e}"


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per fake: cases judged, and how many each rule fails; the cases a peer rule fails and this verdict passes."""
    out: dict[str, Any] = {}
    for r in rows:
        if "error" not in r:
            continue
        f = out.setdefault(
            r["fake"],
            {"control": r["control"], "cases": 0, "verdict": 0, "output_checks": 0, "before": 0, "before_output": 0}
            | {f"peer_{n}": 0 for n, _, _ in PEER_RULES}
            | {"peer_only": [], "max_ratio": 0.0, "max_peer_ratio": 0.0},
        )
        f["cases"] += 1
        f["verdict"] += r["status"] != "pass"
        f["output_checks"] += r["output_verdict"] == "fail"
        f["before"] += bool(r["before"]["failed_checks"])
        f["before_output"] += r["before"]["output_verdict"] == "fail"
        f["max_ratio"] = max(f["max_ratio"], r["error_ratio"])
        f["max_peer_ratio"] = max(f["max_peer_ratio"], r["peer"]["kvcache"]["ratio"])
        for n, _, _ in PEER_RULES:
            f[f"peer_{n}"] += r["peer"][n]["verdict"] == "fail"
            if r["peer"][n]["verdict"] == "fail" and r["output_verdict"] == "pass":
                f["peer_only"].append(f"{r['case']} ({n})")
    return out


def render(doc: dict[str, Any]) -> str:
    rules = ", ".join(f"`{n}` x{m:g} ({w})" for n, m, w in PEER_RULES)
    lines = [
        "# Peer bounds: this verdict against flash-attention's own test rule on long bf16 decode",
        "",
        f"Generated {doc['generated']} by `{' '.join(['python scripts/peer_bounds.py', *doc['argv']])}` "
        f"(commit `{doc['git_commit']}`, {doc['machine']}, {doc['seconds']:.0f} s, seed {doc['seed']}).",
        "",
        f"Peer rule ({PEER_SOURCE}): `max|out - out_ref| <= mult * max|out_pt - out_ref| + 1e-5`, out_ref the fp32 "
        f"reference rounded to bf16, out_pt `attention_ref(upcast=False, reorder_ops=True)`; {rules}. "
        "This verdict: `conformance/verdict` (`max|out - ref|` against the fp32 reference, bound `2 x max|base - ref| "
        "+ min(atol, atol_rel x |ref|)` elementwise, plus the mean, cosine and LSE checks); *before*: the same with "
        "`atol_rel = inf` (the fixed atol 2^-8 everywhere, the rule before issue 31 item 8). *out*: the verdict's "
        "output checks alone (without LSE: the peer rule judges the output only).",
        "",
        "## Per fake",
        "",
        "| fake | cases | fails: verdict | out checks | before | before, out | peer kvcache | peer splitkv "
        "| max error ratio | max peer ratio | peer fails, this verdict's output checks pass |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, f in doc["summary"].items():
        label = f"`{name}`" + (" (control)" if f["control"] else "")
        lines.append(
            f"| {label} | {f['cases']} | {f['verdict']} | {f['output_checks']} | {f['before']} | "
            f"{f['before_output']} | {f['peer_kvcache']} | {f['peer_splitkv']} | {f['max_ratio']:.2f} | "
            f"{f['max_peer_ratio']:.2f} | {'; '.join(f['peer_only']) or 'none'} |"
        )
    rec = doc.get("gpu_records")
    if rec:
        over = "; ".join(
            f"{o['backend']} `{o['case']}` ({o['file'].split('/')[-2]}): {o['error'] / o['baseline_error']:.2f} x"
            for o in rec["over"]
        )
        lines += [
            "",
            "## The committed GPU records",
            "",
            f"Of the {rec['passes']} passes of bf16/fp16 cases in the {rec['files']} results files under `reports/`, "
            f"{rec['within_factor_x_baseline']} have a max error within `factor x` their baseline's: they pass "
            "under any constant term, the elementwise one included. The other "
            f"{len(rec['over'])} (error / baseline error): {over or 'none'}. Their error ratio under this verdict "
            "is at most `max_abs / (factor x B)`: "
            + ", ".join(f"{q} {v:.2f}" for q, v in rec.get("ratio_bound", {}).items())
            + ".",
        ]
    lines += [
        "",
        "## Every measurement",
        "",
        "error: max |out - ref| (fp32 reference); allowed: this verdict's bound at the worst element (before: the "
        "fixed-atol bound); peer error: max |out - out_ref| (bf16-rounded reference), then each peer rule's bound "
        "and verdict.",
        "",
        "| case | fake | error | allowed | verdict (failed checks) | before: allowed, verdict | peer error | "
        "peer kvcache bound, verdict | peer splitkv bound, verdict |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["rows"]:
        if "error" not in r:
            lines.append(f"| `{r['case']}` | `{r['fake']}` | | | {r['status']}: {r['reason']} | | | | |")
            continue
        checks = f" ({', '.join(r['failed_checks'])})" if r["failed_checks"] else ""
        b = r["before"]
        bchecks = f" ({', '.join(b['failed_checks'])})" if b["failed_checks"] else ""
        p3, p2 = r["peer"]["kvcache"], r["peer"]["splitkv"]
        lines.append(
            f"| `{r['case']}` | `{r['fake']}` | {_g(r['error'])} | {_g(r['allowed'])} | {r['status']}{checks} | "
            f"{_g(b['allowed'])}, {'fail' if b['failed_checks'] else 'pass'}{bchecks} | {_g(r['peer']['error'])} | "
            f"{_g(p3['bound'])}, {p3['verdict']} | {_g(p2['bound'])}, {p2['verdict']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=REPO / "reports" / "detection-power")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="the 16k batch-1 cases only")
    p.add_argument("--no-records", action="store_true", help="skip the scan of the committed GPU records")
    p.add_argument(
        "--controls-suite",
        metavar="SUITE",
        help="instead of the grid: the CPU backends and bug-free fakes on SUITE, this verdict against the fixed atol "
        "(writes peer-bounds-controls-SUITE.json and .md)",
    )
    p.add_argument("--every", type=int, default=1, help="with --controls-suite: every N-th case (default 1)")
    args = p.parse_args(argv)
    if args.every < 1:
        p.error(f"--every must be >= 1, got {args.every}")
    torch.manual_seed(args.seed)
    t0 = time.perf_counter()
    if args.controls_suite:
        return _write_controls(args, argv, t0)
    rows = [row for case in grid(args.quick) for row in measure_case(case, args.seed)]
    records = None if args.no_records else scan_records(sorted((REPO / "reports").rglob("*.jsonl.gz")))
    doc = {
        **_header(argv, args.seed, t0),
        "peer_rules": [
            {"name": n, "mult": m, "atol": PEER_ATOL, "source": f"{PEER_SOURCE}, {w}"} for n, m, w in PEER_RULES
        ],
        "summary": summarize(rows),
        "gpu_records": records,
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "peer-bounds.json").write_text(json.dumps(doc, indent=1) + "\n")
    (args.out / "peer-bounds.md").write_text(render(doc))
    print(f"wrote {args.out / 'peer-bounds.json'} and {args.out / 'peer-bounds.md'}", file=sys.stderr)
    return 0


def _header(argv: list[str] | None, seed: int, t0: float) -> dict[str, Any]:
    return {
        "generated": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "argv": list(argv if argv is not None else sys.argv[1:]),
        "git_commit": git_commit(),
        "machine": f"{platform.node()}, {platform.processor() or platform.machine()}, "
        f"{torch.get_num_threads()} threads",
        "seed": seed,
        "seconds": time.perf_counter() - t0,
    }


def _write_controls(args: argparse.Namespace, argv: list[str] | None, t0: float) -> int:
    controls = controls_on_suite(args.controls_suite, args.every, args.seed)
    doc = {**_header(argv, args.seed, t0), "controls": controls}
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"peer-bounds-controls-{args.controls_suite}"
    stem.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
    stem.with_suffix(".md").write_text(render_controls(doc))
    print(f"wrote {stem}.json and {stem}.md", file=sys.stderr)
    return 1 if controls["changed"] else 0


if __name__ == "__main__":
    sys.exit(main())
