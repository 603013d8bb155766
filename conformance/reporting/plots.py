"""Report figures as PNG bytes (matplotlib, Agg backend: no display needed).

The report embeds them in the HTML as base64 and writes them next to the Markdown file.  Each carries the PNG text
chunk ``Software`` = ``attnconf-output: report-plot`` (:data:`PLOT_KIND`), the marker by which
:mod:`conformance.outputs` knows a later report may replace it.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence

from conformance.outputs import marker

__all__ = ["PLOT_KIND", "RATIO_FLOOR", "error_ratio_histograms", "throughput_plot"]

#: The output kind of the report's figures (:mod:`conformance.outputs`).
PLOT_KIND = "report-plot"

#: Error ratios below this (an exact kernel has ratio 0) are drawn in the lowest bin.
RATIO_FLOOR = 1e-4
#: At most this many cases in the throughput figure.
MAX_BAR_CASES = 60


def _pyplot():
    try:
        import matplotlib
    except ModuleNotFoundError:
        raise RuntimeError("attnconf report's plots need matplotlib: pip install 'attnconf[report]'") from None

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight", metadata={"Software": marker(PLOT_KIND)})
    _pyplot().close(fig)
    return buf.getvalue()


def error_ratio_histograms(ratios: Mapping[str, Sequence[float]]) -> bytes | None:
    """One histogram per backend of ``stats.error_ratio`` on log-spaced bins, with the pass limit 1.

    ``ratios`` maps backend name to its finite ratios; None when there is nothing to draw.
    """
    ratios = {b: [r for r in rs if math.isfinite(r)] for b, rs in ratios.items()}
    ratios = {b: rs for b, rs in ratios.items() if rs}
    if not ratios:
        return None
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    top = max(max(rs) for rs in ratios.values())
    hi = max(10.0, 10 ** math.ceil(math.log10(max(top, RATIO_FLOOR))))
    lo = RATIO_FLOOR
    edges = [lo * (hi / lo) ** (i / 40) for i in range(41)]
    n = len(ratios)
    fig, axes = plt.subplots(n, 1, figsize=(7, 1.9 * n + 0.6), squeeze=False, sharex=True)
    for ax, (backend, rs) in zip(axes[:, 0], sorted(ratios.items())):
        clipped = [min(max(r, lo), hi) for r in rs]
        over = sum(r > 1 for r in rs)
        ax.hist(clipped, bins=edges, color="#4c72b0", edgecolor="white", linewidth=0.3)
        ax.axvline(1.0, color="#c44e52", linestyle="--", linewidth=1)
        ax.set_xscale("log")
        ax.set_ylabel("cases")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(f"{backend}: {len(rs)} checks, {over} above the limit (ratio > 1)", fontsize=9, loc="left")
    axes[-1, 0].set_xlabel(f"error ratio = max error / allowed (log; ratios < {lo:g} drawn at {lo:g})")
    fig.tight_layout()
    return _png(fig)


def throughput_plot(points: Mapping[str, Sequence[tuple[str, float | None]]], unit: str = "TFLOP/s") -> bytes | None:
    """Grouped horizontal bars: per case, one bar per backend (``points[backend] = [(case_id, value)]``)."""
    points = {b: [(c, v) for c, v in pts if v is not None and math.isfinite(v)] for b, pts in points.items()}
    points = {b: pts for b, pts in points.items() if pts}
    if not points:
        return None
    plt = _pyplot()
    every = sorted({c for pts in points.values() for c, _ in pts})
    cases = every[:MAX_BAR_CASES]  # a figure of thousands of bars is unreadable; the table has them all
    backends = sorted(points)
    height = 0.8 / len(backends)
    fig, ax = plt.subplots(figsize=(8, 0.25 * len(cases) * max(1.0, len(backends) / 2) + 1.2))
    for j, backend in enumerate(backends):
        values = dict(points[backend])
        ys = [i + j * height for i, c in enumerate(cases) if c in values]
        ax.barh(ys, [values[c] for c in cases if c in values], height=height, label=backend)
    ax.set_yticks([i + (len(backends) - 1) * height / 2 for i in range(len(cases))])
    ax.set_yticklabels([c if len(c) <= 60 else c[:57] + "..." for c in cases], fontsize=7)
    ax.set_ylim(len(cases) - 0.5 + (len(backends) - 1) * height / 2, -0.5)
    ax.set_xlabel(unit + (f" (first {len(cases)} of {len(every)} cases by id)" if len(every) > len(cases) else ""))
    ax.legend(fontsize=8)
    fig.tight_layout()
    return _png(fig)
