"""One results file read as the shards of a sweep it holds, and the checks that shards belong to one sweep.

The reading half of ``attnconf merge`` (:mod:`conformance.reporting.shards` merges): a file is read as segments,
one per header line (a resumed run has several headers of one shard, the ``cat`` of several shard files one
segment per shard, a merged file one header whose ``env.merge`` lists the shards it holds); each shard becomes
a :class:`ShardPart` with the selected (case, backend) pairs it did not record.  The pairs are named when the
shard's selection can be rebuilt from its header (:func:`rebuild_selection`: its ``selection``, or for a header
written before that field existed its ``argv`` re-parsed; the suite built by this checkout, and the same number of
cases as the header recorded); otherwise they are counted from the header's case count.  :func:`agree` is the
sweep identity two headers must share (suite, git commit, backends and versions, device type, seed, timing and
tolerance options).

Files are read by :func:`conformance.results_file.load_results`, strictly: an unreadable file (binary, not UTF-8, a
line longer than :data:`conformance.results_file.MAX_LINE`, corrupt gzip data), one written by a newer attnconf (the
merged file would lose the fields this version does not know), one recording a (case, backend) pair twice
(unless ``drop_duplicates``: the last record is kept) or holding lines that are not records (unless
``allow_skipped``) is a :class:`MergeError`.  A killed runner's cut tail (a last line without its newline, a cut
last gzip member) is not refused: its pair is missing like any other, and the merge says so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conformance.records import CheckResult, Header, SCHEMA
from conformance.results_file import load_results, ResultsFile, ResultsFileError
from conformance.running.selection import Selection, SelectionError

__all__ = ["RUN_KEYS", "MergeError", "Pair", "ShardPart", "agree", "read_file", "read_parts", "rebuild_selection"]

Pair = tuple[str, str]  # (case id, backend)
#: run options that every shard of one sweep shares (``env.run`` keys; the device compared by type)
RUN_KEYS = ("device", "seed", "time", "tol", "tol_file")


class MergeError(ValueError):
    """The files do not belong to one sweep, or two of them disagree; the message names the file and field."""


@dataclass(frozen=True)
class ShardPart:
    """The records of one shard (or of the shards a merged file holds) as found in one file."""

    source: str
    shard_count: int
    covers: tuple[int, ...]
    header: Header
    results: tuple[CheckResult, ...]
    #: selected (case, backend) pairs without a record: named when the selection could be rebuilt
    missing: tuple[Pair, ...] = ()
    #: how many selected pairs lack a record (>= len(missing)); None when the header does not say
    missing_count: int | None = 0
    #: selected cases, from the header(s); None when the header does not say
    cases: int | None = None
    #: header lines of this shard in the file (more than one: the run was resumed)
    segments: int = 1

    @property
    def label(self) -> str:
        shards = ",".join(str(i) for i in self.covers)
        return f"{self.source} (shard {shards}/{self.shard_count})"


# --------------------------------------------------------------------------------------------- reading


def read_file(path: Path | str, *, allow_skipped: bool = False, drop_duplicates: bool = False) -> ResultsFile:
    """One input of a merge, read strictly (see the module docstring); :class:`MergeError` naming the file."""
    try:
        f = load_results(
            path, allow_skipped=True, need_header=False, need_results=False, drop_duplicates=drop_duplicates
        )
    except ResultsFileError as exc:
        raise MergeError(str(exc)) from None
    garbled = f.skipped[:-1] if f.cut_tail else f.skipped
    if garbled and not allow_skipped:
        listed = "; ".join(str(s) for s in garbled[:3]) + (f"; +{len(garbled) - 3} more" if len(garbled) > 3 else "")
        raise MergeError(
            f"{path}: {len(garbled)} line{'s' * (len(garbled) != 1)} not records ({listed}); pass --allow-skipped to "
            "merge the rest"
        )
    if f.newer:
        raise MergeError(
            f"{path}: written by a newer attnconf (schema {f.schema} > {SCHEMA}); merge it with that version (this "
            "one would drop the fields it does not know)"
        )
    return f


def _segments(f: ResultsFile) -> list[tuple[Header, list[CheckResult]]]:
    segments: list[tuple[Header, list[CheckResult]]] = [(h, []) for h in f.headers]
    for r, at, line in zip(f.results, f.result_headers, f.result_lines):
        if at < 0:
            raise MergeError(f"{f.path}: a result record comes before any header line (line {line})")
        segments[at][1].append(r)
    if not segments:
        raise MergeError(f"{f.path}: no header line (not a results file of `attnconf run`)")
    return segments


def _coverage(h: Header, source: Path) -> tuple[int, tuple[int, ...]]:
    """(n, shard indices) a header's records belong to: its shard, a merged file's shards, or 0/1."""
    merge = h.env.get("merge")
    if isinstance(merge, dict) and "shards" in merge:
        try:
            return int(merge["shard_count"]), tuple(sorted(int(i) for i in merge["shards"]))
        except (KeyError, TypeError, ValueError):
            raise MergeError(f"{source}: field env.merge is not readable: {merge!r}") from None
    shard = h.run_options.get("shard")
    if shard is None:
        return 1, (0,)
    try:
        i, n = (int(x) for x in shard)
    except (TypeError, ValueError):
        raise MergeError(f"{source}: field env.run.shard must be [i, n], got {shard!r}") from None
    if not 0 <= i < n:
        raise MergeError(f"{source}: field env.run.shard needs 0 <= i < n, got {shard!r}")
    return n, (i,)


def rebuild_selection(h: Header) -> Selection | None:
    """The selection of the run that wrote ``h``: its ``selection`` (:meth:`Selection.from_json`), or, in a header
    written before that field existed (empty), its ``argv`` re-parsed
    (:func:`conformance.running.run_args.selection_from_argv`); None when the header is not a run's (``fuzz``),
    or this version cannot read it (a newer selection format, a field or flag it does not know, a refused value)."""
    from conformance.running.run_args import selection_from_argv
    from conformance.exits import UsageError

    try:
        if h.selection:
            return Selection.from_json(h.selection)
        return selection_from_argv(list(h.argv))
    except (SystemExit, UsageError, SelectionError, ValueError, KeyError, TypeError):
        return None


def _selection(h: Header, shard: tuple[int, int]) -> list[str] | None:
    """Case ids a shard's run selected (:func:`rebuild_selection`, with the header's shard); None when that is not
    possible here."""
    from conformance.exits import UsageError

    chosen = rebuild_selection(h)
    if chosen is None:
        return None
    try:
        cases = dataclasses.replace(chosen, shard=shard if shard[1] > 1 else None).cases()
    except (SystemExit, UsageError, OSError, ValueError, KeyError, TypeError):
        return None  # a suite this version does not know, a --case-json file not here
    return [c.id for c in cases]


def _missing(
    h: Header, shard: tuple[int, int], results: Sequence[CheckResult]
) -> tuple[tuple[Pair, ...], int | None, int | None]:
    """(named missing pairs, missing count or None, selected cases or None) of one shard's run."""
    merge = h.env.get("merge")
    if isinstance(merge, dict):  # a merged file: what it was missing stays missing
        pairs = tuple((str(c), str(b)) for c, b in merge.get("missing_pairs", []))
        count = merge.get("missing_count")
        return pairs, (None if count is None else int(count)), h.run_options.get("cases")
    backends = list(h.backends)
    recorded = {(r.case_id, r.backend) for r in results}
    n_cases = h.run_options.get("cases")
    ids = _selection(h, shard)
    if ids is not None and (n_cases is None or len(ids) == n_cases):
        expected = [(c, b) for c in ids for b in backends]
        if not {p for p in recorded if p[1] in backends} - set(expected):  # else the rebuilt selection is not it
            missing = tuple(p for p in expected if p not in recorded)
            return missing, len(missing), len(ids)
    if n_cases is None:
        return (), None, None
    have = len({p for p in recorded if p[1] in backends})
    return (), max(0, int(n_cases) * len(backends) - have), int(n_cases)


def read_parts(path: Path | str | ResultsFile) -> list[ShardPart]:
    """The shards one file holds, in file order (a resumed shard's segments are one part); ``path`` may be the
    file as :func:`read_file` read it."""
    f = path if isinstance(path, ResultsFile) else read_file(path)
    path = Path(f.path)
    grouped: dict[tuple[int, tuple[int, ...]], list[tuple[Header, list[CheckResult]]]] = {}
    for header, results in _segments(f):
        grouped.setdefault(_coverage(header, path), []).append((header, results))
    parts = []
    for (n, covers), segments in grouped.items():
        first = segments[0][0]
        for other, _ in segments[1:]:
            agree(first, str(path), other, f"{path} (a later header of shard {covers[0]}/{n})")
        latest: dict[Pair, CheckResult] = {}
        for _, results in segments:
            for r in results:  # within one file the last record of a pair wins, as in reports
                latest.pop((r.case_id, r.backend), None)
                latest[r.case_id, r.backend] = r
        kept = tuple(latest.values())
        missing, count, cases = _missing(first, (covers[0], n), kept)
        parts.append(ShardPart(str(path), n, covers, first, kept, missing, count, cases, len(segments)))
    return parts


# --------------------------------------------------------------------------------------------- checks


def _identity(h: Header) -> dict[str, Any]:
    run = h.run_options
    ident: dict[str, Any] = {
        "suite": h.suite,
        "env.git_commit": h.env.get("git_commit"),
        "backends": {name: info.get("version", "") for name, info in sorted(h.backends.items())},
    }
    for key in RUN_KEYS:
        value = run.get(key)
        if key == "device" and isinstance(value, str):
            value = value.split(":")[0]  # cuda:0 and cuda:1 are one device type
        ident[f"env.run.{key}"] = value
    return ident


def agree(ref: Header, ref_source: str, other: Header, source: str) -> None:
    """:class:`MergeError` naming ``source`` and the field unless ``other`` is of ``ref``'s sweep."""
    mine, theirs = _identity(ref), _identity(other)
    for key, value in theirs.items():
        if value != mine[key]:
            raise MergeError(
                f"{source}: field {key} is {value!r}, but {ref_source} has {mine[key]!r}; "
                "the shards of one sweep must agree (merge each sweep on its own)"
            )
