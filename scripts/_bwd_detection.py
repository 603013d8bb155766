"""The frame of the backward detection-power scripts (``alibi_bwd_detection.py``, ``softcap_bwd_detection.py``):
planted-bug simulations judged on a list of cases with the baseline before a fix and after it.

:func:`main` parses ``--out`` and ``--render-only`` (plus a script's own options), runs every (case, backend) through
the script's ``judge`` in the two modes (``before``, ``after``), printing a line per pair, and writes
``<stem>.json`` (every verdict) and ``<stem>.md`` (the script's page); ``--render-only`` rewrites the ``.md`` from the
``.json`` and runs nothing.  :func:`page` is the Markdown page: a title, an intro, the table of :func:`table` (cases
failed and the range of a ratio per backend and mode) and the planted bugs the verdict misses after the change.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from conformance.cases.case import AttentionCase  # noqa: E402
from conformance.running.env import git_commit  # noqa: E402
from conformance.verdict.check import CaseContext, prepare_context  # noqa: E402

#: (simulated backend class, its kind: control, bug or below rounding), in table order
Backends = Sequence[tuple[type, str]]
MODES = ("before", "after")


def table(
    rows: list[dict[str, Any]], backends: Backends, metric: str, ratio: Callable[[dict], float | None]
) -> list[str]:
    """Per backend and mode: the cases failed and the range of ``ratio`` (of a mode's verdict) over them."""
    out = [
        f"| backend | kind | before: cases failed | {metric} | after: cases failed | {metric} |",
        "|---|---|---|---|---|---|",
    ]
    for cls, kind in backends:
        mine = [r for r in rows if r["backend"] == cls.name]  # type: ignore[attr-defined]
        cells = []
        for mode in MODES:
            failed = sum(1 for r in mine if r[mode]["status"] != "pass")
            ratios = [x for x in (ratio(r[mode]) for r in mine) if x is not None]
            span = f"{min(ratios):.2f} to {max(ratios):.2f}" if ratios else "-"
            cells += [f"{failed} of {len(mine)}", span]
        out.append(f"| `{cls.__name__}` | {kind} | " + " | ".join(cells) + " |")
    return out


def missed(rows: list[dict[str, Any]], bugs: dict[type, bool], backends: Backends) -> list[dict[str, Any]]:
    """The rows of a bug the verdict must catch that pass after the change."""
    by_name = {cls.__name__: cls for cls, _ in backends}
    return [r for r in rows if bugs.get(by_name[r["fake"]], False) and r["after"]["status"] == "pass"]


def page(title: str, intro: str, table_lines: list[str], missed_lines: list[str]) -> str:
    return "\n".join(
        [
            title,
            "",
            intro,
            "",
            *table_lines,
            "",
            "Planted bugs the verdict does not catch after the change:",
            "",
            *(missed_lines or ["- none"]),
            "",
        ]
    )


def main(
    doc: str,
    stem: str,
    render: Callable[[dict[str, Any], argparse.Namespace], str],
    cases: Callable[[argparse.Namespace], list[tuple[AttentionCase, int]]],
    backends: Backends,
    judge: Callable[[CaseContext, str, type], dict[str, Any]],
    *,
    options: Callable[[argparse.ArgumentParser], None] = lambda ap: None,
    skip: Callable[[AttentionCase, type], bool] = lambda case, cls: False,
    record_seed: bool = False,
) -> int:
    """A script's command line (module docstring); ``record_seed``: each row carries its case's seed."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--out", default=str(REPO / "reports" / "detection-power"))
    options(ap)
    ap.add_argument("--render-only", action="store_true", help="rewrite the .md from the .json in --out, run nothing")
    args = ap.parse_args()
    out = Path(args.out)
    if args.render_only:
        data = json.loads((out / f"{stem}.json").read_text(encoding="utf-8"))
        (out / f"{stem}.md").write_text(render(data, args), encoding="utf-8")
        return 0
    t0 = time.time()
    rows: list[dict[str, Any]] = []
    todo = cases(args)
    for case, seed in todo:
        ctx = prepare_context(case, seed, "cpu")
        for cls, _ in backends:
            if skip(case, cls):
                continue
            row: dict[str, Any] = {"case_id": case.id, **({"seed": seed} if record_seed else {})}
            row.update({"backend": cls.name, "fake": cls.__name__})  # type: ignore[attr-defined]
            row.update({mode: judge(ctx, mode, cls) for mode in MODES})
            rows.append(row)
            print(json.dumps({k: row[k] for k in ("case_id", "fake")}), row["before"]["status"],
                  row["after"]["status"], flush=True)  # fmt: skip
    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    data = {"generated": now, "commit": git_commit(), "seconds": round(time.time() - t0, 1), "cases": len(todo)}
    data["rows"] = rows
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    (out / f"{stem}.md").write_text(render(data, args), encoding="utf-8")
    return 0
