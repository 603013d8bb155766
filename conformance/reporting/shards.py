"""Merge the shard files of one sweep (``attnconf run --shard i/n`` on several machines) into one results file.

A CI matrix runs ``attnconf run --shard i/n`` on ``n`` runners; ``attnconf merge`` joins their files and
checks that they belong together before anything is compared with a baseline:

* every file comes from the same sweep: same suite, git commit, backends (names and package versions),
  device type, seed, timing and tolerance options, and shard count ``n`` (:class:`MergeError` naming the
  file and the field otherwise);
* no shard twice, and no (case, backend) pair with two different verdicts (status and error figures) in
  two files; the same verdict twice is kept once and counted; within one file a pair recorded twice is refused
  (two runs wrote it at once) unless ``drop_duplicates`` (the last record is kept, and counted);
* every file reads cleanly (:func:`conformance.reporting.shard_parts.read_file`: unreadable, binary or cut gzip
  data, a newer writer's schema, lines that are not records unless ``allow_skipped`` are refused); a killed
  runner's cut last line is not refused, its pair is missing like the others;
* what is missing: shards ``i/n`` no file holds, and, per shard, the selected (case, backend) pairs it did
  not record (a runner killed mid-sweep).  The pairs are named when the shard's selection can be rebuilt
  from its header (its ``selection``, or an older header's ``argv`` re-parsed; the suite built by this checkout,
  and the same number of cases as the header recorded); otherwise they are counted from the header's case count;
* what the whole sweep judged: a backend of the sweep none of whose merged records is judged (every pair
  ``unsupported``, e.g. its kernel not installed on the runners) is listed (:attr:`MergedRun.unjudged`, as
  ``attnconf run`` lists it; ``attnconf merge`` exits 4).  One shard judging nothing of a backend is no finding
  (a shard may hold none of the cases a backend supports), the merged sweep judging nothing is.

A file is read as segments, one per header line (:mod:`conformance.reporting.shard_parts` reads them and checks
that two headers belong to one sweep; a merged file's header lists the shards it holds, so merged files merge
again).  The merged file has one header: the first shard's, with ``env.run.shard`` (and the shard of its ``argv``,
``sweep`` and ``selection``) cleared, ``env.run.cases`` summed and ``env.merge`` recording the sources, the shards
held, and what is missing.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from conformance.outputs import Output, write_many
from conformance.records import CheckResult, Header, Status
from conformance.results_file import ResultsFile
from conformance.reporting.shard_parts import MergeError, Pair, ShardPart, agree, read_file, read_parts
from conformance.running.outcome import unjudged_backends

__all__ = [
    "MergeError",
    "MergedRun",
    "ShardPart",
    "merge_shards",
    "merged_output",
    "read_parts",
    "render_markdown",
    "write_merged",
]

#: most missing pairs listed in a merged header or summary (the count is always exact)
MAX_LISTED = 1000


@dataclass(frozen=True)
class MergedRun:
    """The merged sweep: one header, every result once, and what is missing."""

    header: Header
    results: tuple[CheckResult, ...]
    parts: tuple[ShardPart, ...]
    shard_count: int
    missing_shards: tuple[int, ...] = ()
    duplicates: int = 0
    #: what reading the files noted, ``PATH: note`` (a cut last line, duplicates dropped within a file, ...)
    notes: tuple[str, ...] = ()

    @property
    def missing_pairs(self) -> tuple[Pair, ...]:
        return tuple(p for part in self.parts for p in part.missing)

    @property
    def missing_count(self) -> int:
        return sum(part.missing_count or 0 for part in self.parts)

    @property
    def unchecked(self) -> tuple[str, ...]:
        """Sources whose header does not say how many cases were selected (their gaps cannot be seen)."""
        return tuple(part.source for part in self.parts if part.missing_count is None)

    @property
    def complete(self) -> bool:
        return not self.missing_shards and self.missing_count == 0

    @property
    def unjudged(self) -> list[tuple[str, str, int]]:
        """(backend, why, pairs) of each backend of the sweep that judged no case in any shard
        (:func:`conformance.running.outcome.unjudged_backends`)."""
        backends = {
            name: (info.get("unavailable_reason") or "?") if info.get("available") == "no" else ""
            for name, info in self.header.backends.items()
        }
        return unjudged_backends(self.results, backends)

    def problems(self) -> list[str]:
        """One line per gap (empty when complete)."""
        out = []
        if self.missing_shards:
            shards = ", ".join(f"{i}/{self.shard_count}" for i in self.missing_shards)
            out.append(f"missing shards: {shards} (no file holds them)")
        for part in self.parts:
            if part.missing_count:
                named = ", ".join(f"{c} x {b}" for c, b in part.missing[:5])
                more = f" (+{part.missing_count - min(5, len(part.missing))} more)" if part.missing_count > 5 else ""
                what = f": {named}{more}" if part.missing else " (not named: the selection could not be rebuilt)"
                out.append(f"{part.label}: {part.missing_count} selected (case, backend) pairs not recorded{what}")
        return out


def _verdict(r: CheckResult) -> tuple[Any, ...]:
    s = r.stats
    figures = None if s is None else (s.max_abs, s.lse_max_abs, s.error_ratio, s.nonfinite)
    return (r.status, figures)


# --------------------------------------------------------------------------------------------- merging


def merge_shards(
    paths: Iterable[Path | str], *, allow_skipped: bool = False, drop_duplicates: bool = False
) -> MergedRun:
    """Check and merge the shard files of one sweep (see the module docstring); :class:`MergeError` when
    they do not belong together or one cannot be read."""
    files = [read_file(p, allow_skipped=allow_skipped, drop_duplicates=drop_duplicates) for p in paths]
    notes = tuple(f"{f.path}: {note}" for f in files for note in (*_skipped_note(f), *f.notes()))
    parts = [part for f in files for part in read_parts(f)]
    if not parts:
        raise MergeError("no shard file given")
    ref = parts[0]
    owner: dict[int, ShardPart] = {}
    for part in parts:
        agree(ref.header, ref.source, part.header, part.source)
        if part.shard_count != ref.shard_count:
            raise MergeError(
                f"{part.source}: field env.run.shard is {part.covers[0]}/{part.shard_count}, but {ref.source} "
                f"is a shard of {ref.shard_count}; the shards of one sweep share n"
            )
        for i in part.covers:
            if i in owner:
                raise MergeError(
                    f"{part.source}: shard {i}/{part.shard_count} is also in {owner[i].source}; give each shard once"
                )
            owner[i] = part
    parts.sort(key=lambda p: p.covers[0])
    merged: dict[Pair, tuple[CheckResult, ShardPart]] = {}
    duplicates = 0
    for part in parts:
        for r in part.results:
            key = (r.case_id, r.backend)
            if key in merged:
                first, where = merged[key]
                if _verdict(first) != _verdict(r):
                    raise MergeError(
                        f"{part.source}: case {r.case_id} on {r.backend} is {r.status.value} here but "
                        f"{first.status.value} in {where.source} (or their error figures differ); "
                        "one (case, backend) pair must have one verdict"
                    )
                duplicates += 1
                continue
            merged[key] = (r, part)
    n = ref.shard_count
    missing_shards = tuple(i for i in range(n) if i not in owner)
    results = tuple(r for r, _ in merged.values())
    header = _header(parts, n, missing_shards, duplicates)
    header.env["merge"]["dropped_duplicates"] = sum(f.dropped_duplicates for f in files)
    header.env["merge"]["skipped_lines"] = sum(len(f.skipped) for f in files)
    return MergedRun(header, results, tuple(parts), n, missing_shards, duplicates, notes)


def _skipped_note(f: ResultsFile) -> list[str]:
    if not f.skipped:
        return []
    what = "its pair counts as missing" if f.cut_tail and len(f.skipped) == 1 else "accepted with --allow-skipped"
    return [f"{f.skipped_summary()}: {what}"]


def _header(parts: list[ShardPart], n: int, missing_shards: tuple[int, ...], duplicates: int) -> Header:
    first = parts[0].header
    cases = [p.cases for p in parts]
    missing = [p for part in parts for p in part.missing]
    counts = [p.missing_count for p in parts]
    sources = []
    for part in parts:
        h = part.header
        sources.append(
            {
                "source": part.source,
                "shards": list(part.covers),
                "host": h.env.get("host", "?"),
                "gpu": h.env.get("gpu", h.env.get("cpu", "?")),
                "started": h.started,
                "records": len(part.results),
                "missing_count": part.missing_count,
            }
        )
    argv = list(first.argv)
    for flag in ("--shard", "--out"):  # the sweep's command, without one shard's options
        while flag in argv[:-1]:
            k = argv.index(flag)
            del argv[k : k + 2]
    run = {
        **first.run_options,
        "shard": None,
        "cases": None if None in cases else sum(c for c in cases if c is not None),
        "already_recorded": sum(int(p.header.run_options.get("already_recorded", 0) or 0) for p in parts),
        "resume": any(p.segments > 1 or bool(p.header.run_options.get("resume")) for p in parts),
    }
    merge = {
        "shard_count": n,
        "shards": sorted(i for p in parts for i in p.covers),
        "missing_shards": list(missing_shards),
        "missing_pairs": [list(p) for p in missing[:MAX_LISTED]],
        "missing_count": None if None in counts else sum(c for c in counts if c is not None),
        "duplicates": duplicates,
        "sources": sources,
    }
    started = min((p.header.started for p in parts if p.header.started), default=first.started)
    # the sweep identity of the whole sweep: one shard's, less what only that shard had (its i/n, its case count
    # and ids); compare reads suite, tolerance and seed from it
    sweep = dict(first.sweep)
    if sweep:
        sweep["selection"] = {**sweep.get("selection", {}), "shard": None}
        sweep["cases"] = run["cases"]
        sweep["case_ids_sha256"] = None
    selection = {**first.selection, "shard": None} if isinstance(first.selection, dict) and first.selection else {}
    return Header(
        suite=first.suite,
        backends=first.backends,
        env={**first.env, "run": run, "merge": merge},
        argv=argv,
        started=started,
        sweep=sweep,
        selection=selection,
    )


def merged_output(run: MergedRun, out: Path | str, flag: str = "--out") -> Output:
    """The merged JSONL (gzipped when ``out`` ends in ``.gz``) as a :class:`conformance.outputs.Output` of no
    kind: a results file is data, so whatever is at ``out`` is kept as a numbered backup, never replaced."""
    out = Path(out)

    def lines(fh: BinaryIO | gzip.GzipFile) -> None:
        records: tuple[Header | CheckResult, ...] = (run.header, *run.results)
        for record in records:
            fh.write((json.dumps(record.to_json(), sort_keys=True, allow_nan=True) + "\n").encode("utf-8"))

    def data(fh: BinaryIO) -> None:
        if out.name.endswith(".gz"):
            with gzip.GzipFile(filename=out.name, mode="wb", fileobj=fh) as gz:
                lines(gz)
        else:
            lines(fh)

    return Output(out, data, None, flag)


def write_merged(run: MergedRun, out: Path | str) -> Path:
    """Write the merged JSONL (:func:`merged_output`) as :func:`conformance.outputs.write_many` writes: checked,
    atomic, an existing file at ``out`` kept as a numbered backup."""
    return write_many([merged_output(run, out)])[0]


def render_markdown(run: MergedRun, out: Path | str | None = None) -> str:
    """The summary ``attnconf merge`` prints: sources, totals, and every gap."""
    h = run.header
    verdict = "complete" if run.complete else "INCOMPLETE"
    held = len(run.header.env["merge"]["shards"])
    lines = [
        f"# Merge: {held} of {run.shard_count} shards of suite `{h.suite}`: {verdict}",
        "",
        f"Commit `{h.env.get('git_commit', '?')}`; backends "
        + ", ".join(f"{name} {info.get('version', '?')}" for name, info in sorted(h.backends.items()))
        + f"; {len(run.results)} records"
        + (f" -> `{out}`" if out else "")
        + ".",
        "",
        "| shard | file | host | records | missing pairs |",
        "|---|---|---|---|---|",
    ]
    for part in run.parts:
        count = "not checked" if part.missing_count is None else str(part.missing_count)
        shards = ",".join(str(i) for i in part.covers)
        lines.append(
            f"| {shards}/{part.shard_count} | {part.source} | {part.header.env.get('host', '?')} | "
            f"{len(part.results)} | {count} |"
        )
    for i in run.missing_shards:
        lines.append(f"| {i}/{run.shard_count} | **missing** | | 0 | all |")
    counts = Counter(r.effective_status.value for r in run.results)
    lines += ["", "| status | records |", "|---|---|"]
    lines += [f"| {s.value} | {counts.get(s.value, 0)} |" for s in Status]
    if run.duplicates:
        lines += ["", f"{run.duplicates} (case, backend) pairs were in two files with the same verdict; kept once."]
    if run.unchecked:
        lines += ["", "Not checked for missing pairs (the header has no case count): " + ", ".join(run.unchecked)]
    unjudged = run.unjudged
    if unjudged:
        lines += ["", "## Nothing judged", ""]
        lines += [f"- {name} judged none of its {pairs} pair(s): {why}" for name, why, pairs in unjudged]
    if run.notes:
        lines += ["", "Read with notes:", ""] + [f"- {note}" for note in run.notes]
    problems = run.problems()
    if problems:
        lines += ["", "## Missing", ""] + [f"- {p}" for p in problems]
        listed = run.missing_pairs[:MAX_LISTED]
        if listed:
            lines += ["", "| case | backend |", "|---|---|"] + [f"| {c} | {b} |" for c, b in listed]
            if run.missing_count > len(listed):
                lines.append(f"| ... {run.missing_count - len(listed)} more | |")
    return "\n".join(lines) + "\n"
