"""``attnconf``: the command line (also ``python -m conformance``).

Exit statuses are :class:`conformance.exits.Exit`, the same for every subcommand: 0 ok, 1 problems found
(unexpected failures, a regression, missing shards), 2 the command line or an input refused (one line, never a
traceback), 3 an output could not be written, 4 nothing judged where a verdict was asked for, 5 the harness is
broken on this machine, 130 Ctrl-C, 141 standard output closed.  Which of them each subcommand exits with, and
when, is in its ``--help`` (the site's CLI reference renders it), the one place that says it.  The subcommands:
``run`` (:mod:`conformance.running.runner`), ``warmup`` (``run --compile-only``,
:mod:`conformance.running.compile_phase`), ``report`` (:mod:`conformance.reporting.report`), ``compare``
(:mod:`conformance.reporting.compare`), ``merge`` (:mod:`conformance.reporting.shards`), ``backends`` (the
capability matrix; exits 0), ``fuzz`` (:mod:`conformance.fuzz`), ``cases`` (selected as ``run`` selects them,
:mod:`conformance.running.selection`), ``suites`` (:mod:`conformance.suites.descriptions`), the ledger's commands
(:mod:`conformance.ledger.cli`), and ``--version``.

``--help`` (of any subcommand) and ``--version`` import no torch: the parsers are built from torch-free modules
and every subcommand's work imports what it needs when it runs.

The subcommands live by group (:mod:`conformance.cli.run`, :mod:`conformance.cli.results` for report / compare /
merge, :mod:`conformance.cli.inventory` for backends / cases / suites, :mod:`conformance.fuzz.cli`,
:mod:`conformance.ledger.cli`); this module builds the parser from them and dispatches.
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from conformance.exits import Exit, UsageError

__all__ = ["build_parser", "main"]


class _Formatter(argparse.HelpFormatter):
    """argparse's formatter, but a text (a description or an epilog) with item lines, lines that start with two
    spaces (``  smoke    small cases ...``), keeps its lines: each wrapped on its own, an item's continuation
    indented under its text.  A text without them is wrapped as one paragraph, as argparse does."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        import re
        import textwrap

        lines = text.splitlines()
        if not any(line.startswith("  ") for line in lines):
            return super()._fill_text(text, width, indent)
        out = []
        for line in lines:
            item = re.match(r"(\s+\S+\s{2,})(\S.*)", line) if line.startswith("  ") else None
            head, body = (item.group(1), item.group(2)) if item else ("", line.strip())
            out.append(
                textwrap.fill(
                    re.sub(r"\s+", " ", body),
                    width,
                    initial_indent=indent + head,
                    subsequent_indent=indent + " " * len(head),
                )
                if body
                else ""
            )
        return "\n".join(out)


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (``attnconf run: argument --timeout: must be ...``), exit 2; help
    texts may hold item lines (:class:`_Formatter`)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")

    def _get_values(self, action, arg_strings):
        # `--timeout=--`: argparse before Python 3.12 strips the '--' and hands the option an empty list, past its
        # type check (a traceback later); the value is the text '--', checked by the option's type as any other.
        if action.nargs is None and arg_strings == ["--"]:
            value = self._get_value(action, "--")
            self._check_value(action, value)
            return value
        return super()._get_values(action, arg_strings)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("attnconf")
    except PackageNotFoundError:  # a checkout run without `pip install -e .`
        return "unknown (not installed)"


class _VersionAction(argparse.Action):
    """``--version``: ``attnconf VERSION`` on stdout, exit 0; the version is looked up only when the flag is given
    (importlib.metadata costs tens of milliseconds that every other command, ``--help`` included, would pay)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"attnconf {_version()}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    """The parser ``attnconf`` runs (the CLI reference of the docs is rendered from it)."""
    from conformance.cli import inventory, results
    from conformance.cli import run as run_cmd
    from conformance.fuzz.cli import add_parser as add_fuzz_parser
    from conformance.ledger.cli import add_parser as add_ledger_parser

    p = _Parser(prog="attnconf", description="Attention-kernel conformance harness.")
    p.add_argument("--version", action=_VersionAction, help="print the version and exit")
    sub = p.add_subparsers(dest="command", required=True)
    run_cmd.add_parser(sub)
    run_cmd.add_warmup_parser(sub)
    results.add_parsers(sub)
    inventory.add_backends_parser(sub)
    add_fuzz_parser(sub)
    add_ledger_parser(sub)
    inventory.add_cases_parser(sub)
    inventory.add_suites_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``attnconf``; returns the exit status (:class:`conformance.exits.Exit`, listed in the CLI
    reference).  Routine events end in one line on stderr, never a traceback: a refused command line or input
    (:class:`~conformance.exits.UsageError`, 2), an output that cannot be written
    (:class:`~conformance.exits.OutputError`, 3), Ctrl-C at any moment (130, with the resume command for ``run``),
    a closed standard output or error (``| head``: 141, silently; stdout is flushed here, so a reader that left
    before the last buffered lines is caught too, not by the interpreter's final flush)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), "")
    try:
        code = _dispatch(argv)
        sys.stdout.flush()
        return code
    except KeyboardInterrupt:  # a run's sweep handles its own (records kept, resume command); this is the rest
        return _interrupted(command, argv)
    except BrokenPipeError:
        _quiet_stdout()
        return Exit.PIPE_CLOSED


def _interrupted(command: str, argv: list[str]) -> int:
    """Say that Ctrl-C stopped ``command`` (with the resume command for ``run`` and ``fuzz``); a second Ctrl-C
    meanwhile is ignored, so the line is whole."""
    import signal
    import threading

    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main_thread else None
    try:
        hint = ""
        if command in ("run", "fuzz"):  # both continue a results file with --resume
            from conformance.running.outcome import resume_command

            hint = f"; records already written are kept: resume with: {resume_command(('attnconf', *argv))}"
        print(f"attnconf{' ' + command if command else ''}: interrupted (Ctrl-C){hint}", file=sys.stderr)
    except BrokenPipeError:
        _quiet_stdout()
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    return Exit.INTERRUPTED


def _quiet_stdout() -> None:
    """After the reader of stdout (or stderr) went away: point both at /dev/null, so the interpreter's final
    flush does not raise a second BrokenPipeError (the recipe of Python's signal documentation)."""
    import os

    for stream in (sys.stdout, sys.stderr):
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, stream.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):
            pass


def _dispatch(argv: list[str]) -> int:
    try:
        return _dispatch_command(argv)
    except Exception as exc:
        # a model file edited by hand (docs/guides/add-model.md), loaded when the case model is imported; the class is
        # read from sys.modules so that --help, --version and suites never import the registry (and torch)
        registry = sys.modules.get("conformance.models.registry")
        if registry is None or not isinstance(exc, registry.RegistryError):
            raise
        print(f"attnconf: the model registry is refused: {exc}", file=sys.stderr)
        return Exit.USAGE


def _dispatch_command(argv: list[str]) -> int:
    from conformance.cli import inventory, results
    from conformance.cli import run as run_cmd

    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on bad flags, 0 on --help
        return int(exc.code or 0)
    from conformance.running.worker_client import use_bytecode_cache

    use_bytecode_cache()  # before torch is imported: where torch has no .pyc, this process compiles it once too
    from conformance.running.worker import WorkerStartError  # after --help and --version: they need no worker

    try:
        if args.command == "run":
            return run_cmd.run(args, argv)
        if args.command == "warmup":
            return run_cmd.warmup(args, argv)
        if args.command == "report":
            return results.report(args)
        if args.command == "compare":
            return results.compare(args)
        if args.command == "merge":
            return results.merge(args)
        if args.command == "backends":
            return inventory.backends(args)
        if args.command == "fuzz":
            from conformance.fuzz.cli import main as fuzz_main

            return fuzz_main(args, argv)
        if args.command == "ledger":
            from conformance.ledger.cli import main as ledger_main

            return ledger_main(args)
        if args.command == "suites":
            return inventory.suites(args)
        return inventory.cases(args)
    except UsageError as exc:  # OutputError too (its exit_code is 3)
        print(f"attnconf {args.command}: {exc}", file=sys.stderr)
        return int(exc.exit_code)
    except WorkerStartError as exc:  # not the user's fault: the machine or an adapter import is broken
        print(f"attnconf {args.command}: {exc}", file=sys.stderr)
        return Exit.INTERNAL
