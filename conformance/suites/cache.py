"""Built case lists kept on disk, so a suite whose covering arrays take tens of seconds to build is built once per
machine and version, not once per command.

:func:`cached_cases` returns what ``build()`` returns, bit for bit: the cache holds the cases' JSON and is keyed by
the SHA-256 of every source file of :mod:`conformance.cases` (the case model, the case space, the covering-array
search), :mod:`conformance.suites` (the suite tables), :mod:`conformance.models` (its code and ``data/*.toml``: the
space's head counts are real models') and :mod:`attnref` (the case model validates against it), the name of the
list and this module's format version; any edit to those files is another key.  A missing, unreadable or corrupt entry
is rebuilt and rewritten (atomically: a temporary file renamed into place), one process at a time (a second
process waits for the first one's entry: the two workers of a test run build the ``default`` covering array once);
a cache directory that cannot be written only costs the build.  The cases' ids are checked against the entry's
recorded ids on load.

Where: ``$ATTNCONF_CACHE_DIR``, else ``$XDG_CACHE_HOME/attnconf``, else ``~/.cache/attnconf``;
``ATTNCONF_CACHE_DIR=off`` switches the cache off (every call builds).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from conformance.cases.case import AttentionCase

__all__ = ["CACHE_ENV", "cache_dir", "cached_cases", "source_key"]

CACHE_ENV = "ATTNCONF_CACHE_DIR"
#: bumped when the entry format changes
FORMAT = 1


def cache_dir() -> Path | None:
    """The cache directory (not created here), or None when the cache is off."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return None if explicit.lower() in ("off", "0", "none") else Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "attnconf"


@lru_cache(maxsize=1)
def source_key() -> str:
    """SHA-256 over the sources the built lists depend on (path and bytes of each, in a fixed order)."""
    import attnref
    import conformance.cases as cases_pkg
    import conformance.models as models_pkg
    import conformance.suites as suites_pkg

    h = hashlib.sha256(f"attnconf-cases-v{FORMAT}".encode())
    for pkg in (cases_pkg, suites_pkg, models_pkg, attnref):
        assert pkg.__file__ is not None  # regular packages, not namespace ones
        root = Path(pkg.__file__).resolve().parent
        for path in sorted(p for p in root.rglob("*") if p.suffix in (".py", ".toml")):
            h.update(str(path.relative_to(root)).encode() + b"\0")
            h.update(path.read_bytes() + b"\0")
    return h.hexdigest()


def _load(path: Path) -> tuple[AttentionCase, ...] | None:
    from conformance.cases.case import AttentionCase  # here: cache_dir() is read before torch is imported

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        cases = tuple(AttentionCase.from_json(c) for c in data["cases"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if [c.id for c in cases] != data.get("ids"):
        return None
    return cases


def _store(path: Path, cases: Sequence[AttentionCase]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError:
        return
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump({"ids": [c.id for c in cases], "cases": [c.to_json() for c in cases]}, fh)
        os.replace(tmp, path)
        tmp = ""
    except OSError:
        pass
    finally:
        if tmp:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def cached_cases(name: str, build: Callable[[], Sequence[AttentionCase]]) -> tuple[AttentionCase, ...]:
    """``tuple(build())``, from the disk cache when an entry for ``name`` and the current sources exists."""
    root = cache_dir()
    if root is None:
        return tuple(build())
    path = root / f"cases-{name}-{source_key()[:32]}.json"
    hit = _load(path)
    if hit is not None:
        return hit
    with _building(path):  # another process building the same entry: wait for it, then read what it wrote
        hit = _load(path)
        if hit is not None:
            return hit
        cases = tuple(build())
        _store(path, cases)
    return cases


@contextlib.contextmanager
def _building(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``PATH.lock`` while the entry is built (none where the directory cannot be made or
    ``fcntl`` is missing: the builds then only run twice)."""
    try:
        import fcntl

        path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(path.with_name(path.name + ".lock"), "a")
    except (ImportError, OSError):
        yield
        return
    with fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        except OSError:
            pass
        yield
