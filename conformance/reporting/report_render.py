"""Rendering and writing a report: the Markdown and HTML templates over the context of
:func:`conformance.reporting.report.build_context`, the report directory's files checked before any work and written
all or nothing (:mod:`conformance.outputs`).

Text written as Markdown (the notes under the tables, ``attnconf compare``'s summary of a baseline) is rendered
into the HTML by markdown-it-py (CommonMark with tables, raw HTML escaped, never passed through: the ``inline_md``
and ``md_block`` filters); the Markdown report carries it as written."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from conformance.exits import OutputError, UsageError
from conformance.outputs import Output, check_outputs, marker, same_file, write_many
from conformance.ledger.entries import load_ledger
from conformance.reporting.plots import PLOT_KIND
from conformance.reporting.report import (
    HTML_KIND,
    MD_KIND,
    RunSet,
    _TEMPLATES,
    baseline_context,
    build_context,
    load_runs,
)

__all__ = [
    "REPORT_FILES",
    "REPORT_MODULES",
    "check_report_dir",
    "check_report_libraries",
    "report_outputs",
    "write_report",
]


def _md_cell(text: Any) -> str:
    """Text safe inside one Markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ")


#: The modules a report needs (the ``report`` extra): the templates, the plots, the Markdown in the HTML.
REPORT_MODULES = ("jinja2", "matplotlib", "markdown_it")


def check_report_libraries(flag: str = "--out") -> None:
    """:class:`UsageError` (exit 2) naming the modules of :data:`REPORT_MODULES` that are not installed: a report
    cannot be written here, said before any work (before a run's workers start, for ``run --report``)."""
    import importlib.util

    missing = [m for m in REPORT_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        raise UsageError(
            f"{flag}: a report needs {', '.join(missing)}, not installed here: pip install 'attnconf[report]'"
        )


def _environment(html: bool):
    check_report_libraries()
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(_TEMPLATES)),
        autoescape=html,
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )
    env.filters["md"] = _md_cell
    if html:
        env.filters["inline_md"] = _inline_md
        env.filters["md_block"] = _md_block
    return env


def _markdown():
    """CommonMark with tables, a line break where the source breaks a line (``attnconf compare``'s summary writes
    a statement a line); HTML in the source is escaped, not passed through (records carry any text)."""
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark", {"html": False, "breaks": True}).enable("table")


def _inline_md(text: Any):
    """One line of Markdown (a note: code spans, emphasis) as HTML, without a paragraph around it."""
    from markupsafe import Markup

    return Markup(_markdown().renderInline(str(text)))


def _md_block(text: Any):
    """Markdown (headings, tables, paragraphs) as HTML."""
    from markupsafe import Markup

    return Markup(_markdown().render(str(text)))


#: The files of a report directory, and their output kinds (:mod:`conformance.outputs`).
REPORT_FILES = {
    "report.md": MD_KIND,
    "report.html": HTML_KIND,
    "error_ratio.png": PLOT_KIND,
    "throughput.png": PLOT_KIND,
}


def check_report_dir(
    out_dir: Path | str,
    inputs: Sequence[Path | str] = (),
    flag: str = "--out",
    others: Sequence[tuple[Path | str | None, str]] = (),
) -> list[Path]:
    """Refuse ``out_dir`` as the report directory before any work: a path that exists and is not a directory
    (a file, a device node, a FIFO): :class:`UsageError`, exit 2; then every file of :data:`REPORT_FILES` in it,
    with the command's ``others`` outputs (``(path, flag)``, such as ``--json``), as
    :func:`conformance.outputs.check_outputs` checks them (none one of ``inputs`` or another, not a directory or
    device, writable), after :func:`check_report_libraries`.  Returns the paths of ``REPORT_FILES``, in order."""
    check_report_libraries(flag)
    out_dir = Path(out_dir)
    for other, other_flag in others:
        if other is not None and str(other) != "-" and same_file(other, out_dir):
            raise UsageError(f"{other_flag} {other}: is also {flag} (the report directory); give it a file path")
    try:
        elsewhere = out_dir.exists() and not out_dir.is_dir()  # Python < 3.12 raises for a name too long
    except OSError as exc:
        raise OutputError(f"{flag} {out_dir}: cannot be examined: {exc.strerror or exc}") from None
    if elsewhere:
        raise UsageError(f"{flag} {out_dir}: exists and is not a directory (the report is written into a directory)")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise UsageError(f"{flag} {out_dir}: exists and is not a directory") from None
    except NotADirectoryError:
        raise UsageError(f"{flag} {out_dir}: cannot create it: a part of the path is a file") from None
    except OSError as exc:
        raise OutputError(f"{flag} {out_dir}: cannot create it: {exc.strerror or exc}") from None
    paths = check_outputs([*((out_dir / name, flag) for name in REPORT_FILES), *others], inputs)
    return [p for p in paths[: len(REPORT_FILES)] if p is not None]


def report_outputs(
    runs: RunSet, out_dir: Path | str, ledger_dir: Path | str | None = None, baseline: Any = None
) -> tuple[list[Output], dict]:
    """The report's files (``report.md``, ``report.html`` and the PNGs there are), each with its output kind, and
    the :func:`build_context` data; nothing written.  ``baseline``: a
    :class:`~conformance.reporting.compare.Comparison` of a baseline with these results, shown after the
    unexpected problems."""
    out_dir = Path(out_dir)
    ctx = build_context(runs, load_ledger(ledger_dir))
    if baseline is not None:
        ctx["baseline"] = baseline_context(baseline)
    outs = [Output(out_dir / name, png, PLOT_KIND) for name, png in ctx.pop("_pngs").items() if png]
    md = _environment(False).get_template("report.md.j2").render(**ctx, output_marker=marker(MD_KIND, "html"))
    html = _environment(True).get_template("report.html.j2").render(**ctx, output_marker=marker(HTML_KIND, "html"))
    outs += [
        Output(out_dir / "report.md", md.encode(), MD_KIND),
        Output(out_dir / "report.html", html.encode(), HTML_KIND),
    ]
    return outs, ctx


def write_report(
    paths: Sequence[Path | str] | RunSet,
    out_dir: Path | str,
    ledger_dir: Path | str | None = None,
    *,
    with_context: bool = False,
    baseline: Any = None,
    flag: str = "--out",
):
    """Write ``report.md`` (with its PNGs beside it) and ``report.html`` to ``out_dir``, as
    :func:`conformance.outputs.write_many` writes (checked first, all or nothing, a file the report did not write
    kept as a numbered backup); returns their paths (and, ``with_context``, the :func:`build_context` data too).
    ``baseline``: as :func:`report_outputs`; ``flag``: the option that named ``out_dir``, for messages."""
    out_dir = Path(out_dir)
    runs = paths if isinstance(paths, RunSet) else load_runs(paths)
    check_report_dir(out_dir, runs.sources, flag)
    outs, ctx = report_outputs(runs, out_dir, ledger_dir, baseline)
    outs = [Output(o.path, o.data, o.kind, flag) for o in outs]
    write_many(outs)
    md, html = out_dir / "report.md", out_dir / "report.html"
    return (md, html, ctx) if with_context else (md, html)
