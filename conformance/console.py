"""The rich console every ``attnconf`` table and progress bar writes through.

rich answers a closed pipe (``attnconf backends | head``) by pointing stdout at /dev/null and raising
``SystemExit(1)``, which would make a reader that stops early look like a failure.  :class:`PipeConsole` raises
``BrokenPipeError`` instead, which :func:`conformance.cli.main` ends quietly with exit 141 like any other closed
pipe (:mod:`conformance.exits`).
"""

from __future__ import annotations

import errno

from rich.console import Console

__all__ = ["PipeConsole"]


class PipeConsole(Console):
    """A rich ``Console`` whose closed output raises ``BrokenPipeError``."""

    def on_broken_pipe(self) -> None:
        raise BrokenPipeError(errno.EPIPE, "the reader of this output went away")
