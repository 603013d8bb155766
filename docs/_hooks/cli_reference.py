"""mkdocs hook: the CLI reference page, generated at build time from the parser the ``attnconf`` command runs.

``reference/cli.md`` is not a file in ``docs/``: ``on_files`` adds it to the build with the ``--help`` text of
``attnconf`` and of every subcommand, nested ones included (``attnconf ledger audit``), read from
:func:`conformance.cli.build_parser`, so the reference cannot drift from the command line and is never written
twice.  The page opens with the exit statuses every subcommand shares, the table of
:mod:`conformance.exits`'s docstring as Markdown (:func:`exit_table`), so they are listed once.  A page of that
name in ``docs/`` is an error (it would be silently replaced).
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Iterator

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

PAGE = "reference/cli.md"
#: the width the help text is wrapped to (argparse reads $COLUMNS)
WIDTH = 100


def subcommands(
    parser: argparse.ArgumentParser, path: tuple[str, ...]
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """``(path, parser)`` for the parser and every subparser below it, depth first, in the parser's order."""
    yield path, parser
    for action in parser._actions:  # argparse keeps subparsers only here (sphinx-argparse reads them so too)
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from subcommands(sub, (*path, name))


def exit_table() -> list[str]:
    """The exit-status table of :mod:`conformance.exits` (an RST simple table in its docstring, one row per
    :class:`~conformance.exits.Exit` member) as Markdown lines; a ``PluginError`` when the two disagree."""
    from conformance import exits

    lines = (exits.__doc__ or "").splitlines()
    rulers = [i for i, line in enumerate(lines) if line.startswith("====")]
    if len(rulers) < 3:
        raise PluginError("conformance.exits: its docstring has no exit-status table")
    ruler = lines[rulers[0]]
    starts = [m.start() for m in re.finditer(r"=+", ruler)]
    rows: list[list[str]] = []
    for line in lines[rulers[1] + 1 : rulers[2]]:
        cells = [line[a:b].strip() for a, b in zip(starts, [*starts[1:], None])]
        if cells[0]:
            rows.append(cells)
        elif rows:  # a continuation line of the last row's cells
            rows[-1] = [f"{old} {new}".strip() for old, new in zip(rows[-1], cells)]
    codes = [int(row[0]) for row in rows]
    if codes != [int(e) for e in exits.Exit]:
        members = [int(e) for e in exits.Exit]
        raise PluginError(f"conformance.exits: the docstring's table lists {codes}, Exit has {members}")
    return ["| status | name | meaning |", "|---|---|---|"] + [f"| {' | '.join(map(_md, row))} |" for row in rows]


def _md(rst: str) -> str:
    """An RST table cell as a Markdown one: ``:class:`X``` and ````x```` as code, ``|`` escaped."""
    return re.sub(r":\w+:`([^`]+)`", r"`\1`", rst).replace("``", "`").replace("|", r"\|")


def render() -> str:
    from conformance.cli import build_parser

    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(WIDTH)
    try:
        parsers = list(subcommands(build_parser(), ("attnconf",)))
        lines = [
            "# CLI reference",
            "",
            "Generated when the site is built, from `conformance.cli.build_parser()` (the parser `attnconf` runs):",
            "the `--help` of every command.",
            "",
            "## Exit status",
            "",
            "Every subcommand ends with one of these (`conformance.exits`); an error is one line on stderr, never a "
            "traceback. Each command's description says which it uses and when.",
            "",
            *exit_table(),
            "",
            "No command writes over a file it did not create: every output is checked before any work (one of the "
            "command's inputs, a directory, a device node or a FIFO: 2; an unwritable directory or read-only "
            "file: 3), written whole or not at all, and whatever else was at the path (a results file, a file of "
            "yours) is kept as a numbered backup, `NAME.1.EXT`, said on stderr "
            "([Running sweeps](../concepts/running.md#outputs)).",
            "",
        ]
        for path, parser in parsers:
            lines += [f"## `{' '.join(path)}`", "", "```text", parser.format_help().rstrip(), "```", ""]
        return "\n".join(lines)
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old


def on_files(files: Files, config) -> Files:
    if files.get_file_from_path(PAGE) is not None:
        raise PluginError(f"docs/{PAGE} exists, but that page is generated from the parser: delete the file")
    files.append(File.generated(config, PAGE, content=render()))
    return files
