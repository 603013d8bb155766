"""How an ``attnconf`` command ends: its exit statuses, and the two exceptions that end it early.

Every subcommand exits with one of :class:`Exit`'s values, and the CLI reference lists them once:

====  ================  ==================================================================================
code  name              meaning
====  ================  ==================================================================================
0     ``OK``            the command did what it was asked and found nothing to fail on
1     ``PROBLEMS``      it found what it exists to find: an unexpected problem (``run``, ``fuzz``), a
                        regression (``compare``), missing shards or pairs (``merge``), an unexplained
                        problem (``ledger audit --strict``)
2     ``USAGE``         the command line or an input is refused (:class:`UsageError`): a bad flag or value,
                        an unknown suite or backend, an unreadable, duplicated or mismatched input file, an
                        output path that is a directory, a device node, a FIFO or one of the command's own
                        inputs, a results file another run holds
3     ``OUTPUT``        an output could not be written (:class:`OutputError`): a read-only directory, a full
                        disk, an I/O error; whatever the path held before is left as it was
4     ``NO_EVIDENCE``   nothing was judged where a verdict was asked for (``run``, ``compare``, ``merge``,
                        ``fuzz``; ``--allow-unjudged`` accepts it, 1 takes precedence): a selected backend
                        judged no case of the selection or of any shard (every pair unsupported, or the
                        backend is not installed or runs on another device), a backend judged no drawn case
                        of a campaign, or a backend family judged no compared pair in both files; a gate
                        never passes on that
5     ``INTERNAL``      the harness itself is broken on this machine (a worker cannot start, an adapter
                        cannot be imported)
130   ``INTERRUPTED``   Ctrl-C (SIGINT), at any moment; what was written is kept, and a run says how to resume
141   ``PIPE_CLOSED``   the reader of standard output went away (``attnconf cases | head``): the command stops
                        quietly, as a program killed by SIGPIPE would
====  ================  ==================================================================================

The codes are ordered by what a CI step should do: 1 means "look at the findings", 2 "fix the command or its
inputs", 3 "fix the machine's disk", 4 "the kernel under test did not run", 5 "the harness is broken".
"""

from __future__ import annotations

import enum

__all__ = ["Exit", "OutputError", "UsageError"]


class Exit(enum.IntEnum):
    """Exit statuses of every ``attnconf`` subcommand (the table in this module's docstring)."""

    OK = 0
    PROBLEMS = 1
    USAGE = 2
    OUTPUT = 3
    NO_EVIDENCE = 4
    INTERNAL = 5
    INTERRUPTED = 130
    PIPE_CLOSED = 141


class UsageError(ValueError):
    """The command line or an input is refused: one line naming the option or file and the constraint, printed
    by the command as ``attnconf COMMAND: MESSAGE``; exit :attr:`Exit.USAGE` (2), before any result is touched."""

    exit_code: int = Exit.USAGE


class OutputError(UsageError):
    """An output could not be written (read-only, disk full, I/O error); exit :attr:`Exit.OUTPUT` (3).  The path
    keeps what it held before (outputs are written to a temporary file and renamed into place)."""

    exit_code: int = Exit.OUTPUT
