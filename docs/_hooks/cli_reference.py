"""mkdocs hook: the CLI reference page, generated at build time from the parser the ``attnconf`` command runs.

``reference/cli.md`` is not a file in ``docs/``: ``on_files`` adds it to the build with the ``--help`` text of
``attnconf`` and of every subcommand, nested ones included (``attnconf ledger audit``), read from
:func:`conformance.cli.build_parser`, so the reference cannot drift from the command line and is never written
twice.  A page of that name in ``docs/`` is an error (it would be silently replaced).
"""

from __future__ import annotations

import argparse
import os
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
            "the `--help` of every command. Exit status 2 is always a usage error (one line, no traceback); "
            "the other statuses are in each command's description.",
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
