"""attnconf merge: shard files of one sweep -> one results file; gaps found and named, strangers refused.

Records are built directly (no kernel runs): the case ids are those `attnconf run --suite smoke --shard i/n
--limit 2` selects, so the merge's rebuild of each shard's selection from its header is exercised for real.
tests/ci/test_workflow.py runs the real shards through the workflow's own steps.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from conformance.cli import main
from conformance.records import CheckResult, ErrorStats, Header, Status
from conformance.results_file import read_records
from conformance.results_writer import append_record
from conformance.reporting.shards import MergeError, merge_shards, read_parts
from conformance.running.runner import select_cases
from conformance.running.selection import Selection

N, LIMIT = 3, 2
BACKENDS = ("kern-a", "kern-b")
COMMIT = "0123abc"


def stats(ratio: float) -> ErrorStats:
    return ErrorStats(
        max_abs=ratio * 0.01,
        max_rel=ratio,
        mean_abs=ratio * 1e-3,
        worst=(0, 0, 0),
        mismatch_frac=0.0,
        error_ratio=ratio,
        baseline_max_abs=0.004,
        baseline_mean_abs=4e-4,
        allowed_max_abs=0.01,
        cosine=0.999,
    )


def header(i: int | None, n: int = N, *, commit: str = COMMIT, versions: str = "1.0", **run: Any) -> Header:
    argv = ["attnconf", "run", "--suite", "smoke", "--limit", str(LIMIT), "--out", f"s{i}.jsonl"]
    for b in BACKENDS:
        argv += ["--backend", b]
    if i is not None:
        argv += ["--shard", f"{i}/{n}"]
    cases = len(select_cases("smoke", shard=None if i is None else (i, n), limit=LIMIT))
    return Header(
        suite="smoke",
        backends={b: {"name": b, "family": b, "version": versions} for b in BACKENDS},
        env={
            "host": f"runner-{i}",
            "git_commit": commit,
            "run": {
                "device": f"cuda:{i or 0}",
                "seed": 0,
                "time": False,
                "tol": [],
                "tol_file": None,
                "shard": None if i is None else [i, n],
                "cases": cases,
                **run,
            },
        },
        argv=argv,
        started=f"2026-11-22T10:0{i or 0}:00+00:00",
    )


def selection_header(i: int | None, n: int = N, **run: Any) -> Header:
    """:func:`header` as runs write it since ``Header.selection`` exists: the selection beside the argv."""
    chosen = Selection(backends=BACKENDS, suite="smoke", limit=LIMIT, shard=None if i is None else (i, n))
    return dataclasses.replace(header(i, n, **run), selection=chosen.to_json())


def results(i: int, n: int = N) -> list[CheckResult]:
    out = []
    for k, case in enumerate(select_cases("smoke", shard=(i, n), limit=LIMIT)):
        for b in BACKENDS:
            out.append(
                CheckResult(
                    case_id=case.id,
                    backend=b,
                    family=b,
                    status=Status.PASS,
                    case=case.to_json(),
                    stats=stats(0.1 + 0.01 * k),
                )
            )
    return out


def write(path: Path, *records: Header | CheckResult) -> Path:
    for r in records:
        append_record(path, r)
    return path


@pytest.fixture
def shards(tmp_path: Path) -> list[Path]:
    return [write(tmp_path / f"s{i}.jsonl", header(i), *results(i)) for i in range(N)]


def test_complete_merge_one_header_every_result_once(shards: list[Path], tmp_path: Path, capsys) -> None:
    out = tmp_path / "merged.jsonl"
    # the order of the arguments does not matter: parts come out by shard index
    assert main(["merge", str(shards[2]), str(shards[0]), str(shards[1]), "--out", str(out)]) == 0
    headers, merged = read_records(out)
    assert len(headers) == 1 and len(merged) == N * LIMIT * len(BACKENDS)
    assert [r.case_id for r in merged] == [r.case_id for i in range(N) for r in results(i)]
    h = headers[0]
    assert h.env["run"]["shard"] is None and h.env["run"]["cases"] == N * LIMIT
    assert h.env["merge"]["shards"] == [0, 1, 2] and h.env["merge"]["missing_count"] == 0
    assert [s["host"] for s in h.env["merge"]["sources"]] == ["runner-0", "runner-1", "runner-2"]
    assert "--shard" not in h.argv and "--out" not in h.argv  # the sweep's command, not one shard's
    text = capsys.readouterr().out
    assert "3 of 3 shards of suite `smoke`: complete" in text and "| pass | 12 |" in text


def test_missing_shard_exits_1_names_it_and_still_writes(shards: list[Path], tmp_path: Path, capsys) -> None:
    out, summary = tmp_path / "merged.jsonl", tmp_path / "merge.md"
    assert main(["merge", str(shards[0]), str(shards[2]), "--out", str(out), "--summary", str(summary)]) == 1
    err = capsys.readouterr().err
    assert "missing shards: 1/3" in err
    assert "INCOMPLETE" in summary.read_text() and "| 1/3 | **missing** |" in summary.read_text()
    h, rs = read_records(out)
    assert h[0].env["merge"]["missing_shards"] == [1] and len(rs) == 2 * LIMIT * len(BACKENDS)
    assert main(["merge", str(shards[0]), str(shards[2]), "--out", str(out), "--allow-incomplete"]) == 0


def test_missing_pairs_of_a_cut_shard_are_named(tmp_path: Path, capsys) -> None:
    full = results(1)
    cut = write(tmp_path / "s1.jsonl", header(1), *full[:-3])  # the runner was killed 3 pairs short
    others = [write(tmp_path / f"s{i}.jsonl", header(i), *results(i)) for i in (0, 2)]
    merged = merge_shards([others[0], cut, others[1]])
    assert not merged.complete and merged.missing_count == 3
    assert set(merged.missing_pairs) == {(r.case_id, r.backend) for r in full[-3:]}
    assert main(["merge", str(cut), *map(str, others), "--out", str(tmp_path / "m.jsonl")]) == 1
    err = capsys.readouterr().err
    assert f"{full[-1].case_id} x {full[-1].backend}" in err and "3 selected (case, backend) pairs not recorded" in err


def test_missing_pairs_counted_when_the_selection_cannot_be_rebuilt(tmp_path: Path) -> None:
    h = dataclasses.replace(header(0, 1), argv=["attnconf", "run", "--suite", "no-such-suite-anymore"])
    path = write(tmp_path / "old.jsonl", h, *results(0, 1)[:-1])
    (part,) = read_parts(path)
    assert part.missing == () and part.missing_count == 1  # from env.run.cases x backends
    no_count = dataclasses.replace(h, env={**h.env, "run": {k: v for k, v in h.env["run"].items() if k != "cases"}})
    path2 = write(tmp_path / "older.jsonl", no_count, *results(0, 1))
    merged = merge_shards([path2])
    assert merged.unchecked == (str(path2),) and merged.complete  # nothing to check against: not a gap


@pytest.mark.parametrize(
    "bad, field",
    [
        (lambda: header(1, commit="fedcba9"), "env.git_commit"),
        (lambda: header(1, versions="2.0"), "backends"),
        (lambda: header(1, seed=7), "env.run.seed"),
        (lambda: header(1, tol=["factor=2"]), "env.run.tol"),
        (lambda: dataclasses.replace(header(1), suite="default"), "suite"),
        (lambda: header(1, n=4), "env.run.shard"),
    ],
)
def test_a_shard_of_another_sweep_is_refused_naming_file_and_field(
    shards: list[Path], tmp_path: Path, bad, field: str, capsys
) -> None:
    stranger = write(tmp_path / "stranger.jsonl", bad(), *results(1))
    with pytest.raises(MergeError, match=rf"stranger\.jsonl: field {field} "):
        merge_shards([shards[0], stranger, shards[2]])
    out = tmp_path / "merged.jsonl"
    assert main(["merge", str(shards[0]), str(stranger), "--out", str(out)]) == 2
    assert "stranger.jsonl" in capsys.readouterr().err and not out.exists()


def test_device_index_is_not_a_difference(shards: list[Path]) -> None:
    # header(i) records cuda:i: shards on several GPUs of one host are one sweep
    assert merge_shards(shards).complete


def test_one_shard_twice_is_refused(shards: list[Path], tmp_path: Path) -> None:
    again = write(tmp_path / "again.jsonl", header(1), *results(1))
    with pytest.raises(MergeError, match=r"again\.jsonl: shard 1/3 is also in .*s1\.jsonl"):
        merge_shards([*shards, again])


def test_conflicting_duplicate_pair_is_refused_identical_one_kept_once(shards: list[Path], tmp_path: Path) -> None:
    stray = results(1)[0]
    same = write(tmp_path / "s0-same.jsonl", header(0), *results(0), stray)
    merged = merge_shards([same, shards[1], shards[2]])
    assert merged.duplicates == 1 and len(merged.results) == N * LIMIT * len(BACKENDS)
    failed = dataclasses.replace(stray, status=Status.FAIL, stats=stats(3.0))
    other = write(tmp_path / "s0-other.jsonl", header(0), *results(0), failed)
    with pytest.raises(MergeError, match=rf"case {stray.case_id} on {stray.backend} is pass here but fail in"):
        merge_shards([other, shards[1], shards[2]])


def test_resumed_shard_and_catted_shards_are_read_by_segment(shards: list[Path], tmp_path: Path) -> None:
    first, rest = results(1)[:2], results(1)[2:]
    resumed = write(tmp_path / "s1-resumed.jsonl", header(1), *first, header(1, resume=True), *rest)
    catted = tmp_path / "cat.jsonl"
    catted.write_text(shards[0].read_text() + shards[2].read_text())
    merged = merge_shards([catted, resumed])
    assert merged.complete and len(merged.parts) == 3 and merged.header.env["run"]["resume"] is True
    resumed_elsewhere = write(tmp_path / "s1-moved.jsonl", header(1), *first, header(1, commit="fedcba9"), *rest)
    with pytest.raises(MergeError, match=r"a later header of shard 1/3\): field env.git_commit"):
        read_parts(resumed_elsewhere)


def test_merged_files_merge_again_and_gz_round_trips(shards: list[Path], tmp_path: Path) -> None:
    part01 = tmp_path / "m01.jsonl.gz"
    assert main(["merge", str(shards[0]), str(shards[1]), "--out", str(part01), "--allow-incomplete"]) == 0
    with gzip.open(part01, "rt") as fh:
        assert json.loads(fh.readline())["env"]["merge"]["missing_shards"] == [2]
    final = tmp_path / "all.jsonl"
    assert main(["merge", str(part01), str(shards[2]), "--out", str(final)]) == 0
    h, rs = read_records(final)
    assert h[0].env["merge"]["shards"] == [0, 1, 2] and len(rs) == N * LIMIT * len(BACKENDS)
    with pytest.raises(MergeError, match="shard 0/3 is also in"):
        merge_shards([part01, shards[0]])


def test_not_a_results_file(tmp_path: Path, capsys) -> None:
    headerless = write(tmp_path / "bare.jsonl", *results(0))
    with pytest.raises(MergeError, match=r"bare\.jsonl: a result record comes before any header"):
        merge_shards([headerless])
    (tmp_path / "empty.jsonl").write_text("")
    assert main(["merge", str(tmp_path / "empty.jsonl")]) == 2
    assert "empty.jsonl: empty file (not a results file" in capsys.readouterr().err  # read as every reader reads
    assert main(["merge", str(tmp_path / "absent.jsonl")]) == 2


def test_merge_then_gate_against_a_baseline(shards: list[Path], tmp_path: Path, capsys) -> None:
    """The CI recipe in-process: merge -> report -> compare with the baseline (identical, then a planted
    regression in one shard)."""
    baseline, merged = tmp_path / "baseline.jsonl", tmp_path / "merged.jsonl"
    assert main(["merge", *map(str, shards), "--out", str(baseline)]) == 0
    assert main(["report", *map(str, shards), "--out", str(tmp_path / "report")]) == 0
    assert "kern-a" in (tmp_path / "report" / "report.md").read_text()
    assert main(["compare", str(baseline), str(baseline)]) == 0
    bad = results(2)
    bad[1] = dataclasses.replace(bad[1], status=Status.FAIL, stats=stats(4.2), reason="planted")
    regressed = write(tmp_path / "s2-regressed.jsonl", header(2), *bad)
    assert main(["merge", str(shards[0]), str(shards[1]), str(regressed), "--out", str(merged)]) == 0
    capsys.readouterr()
    assert main(["compare", str(baseline), str(merged)]) == 1
    text = capsys.readouterr().out
    assert "REGRESSED" in text and "## New failures (1)" in text and f"| {bad[1].case_id} | pass | fail |" in text


def test_merged_header_keeps_the_sweep_identity_less_the_shard(tmp_path: Path) -> None:
    import dataclasses

    tol = [{"factor": 3.0}]
    paths = []
    for i in range(N):
        h = header(i)
        sweep = {
            "schema": 1,
            "suite": "smoke",
            "selection": {"case": [], "shard": [i, N], "limit": LIMIT},
            "cases": h.env["run"]["cases"],
            "case_ids_sha256": f"sha-{i}",
            "seed": 0,
            "device": "cuda",
            "tol": tol,
        }
        paths.append(write(tmp_path / f"t{i}.jsonl", dataclasses.replace(h, sweep=sweep), *results(i)))
    out = tmp_path / "merged.jsonl"
    assert main(["merge", *map(str, paths), "--out", str(out)]) == 0
    (h,), _ = read_records(out)
    assert h.sweep["suite"] == "smoke" and h.sweep["tol"] == tol and h.sweep["seed"] == 0
    assert h.sweep["selection"]["shard"] is None and h.sweep["cases"] == N * LIMIT
    assert h.sweep["case_ids_sha256"] is None  # one shard's ids are not the sweep's


def test_a_backend_unsupported_in_every_shard_exits_4_one_unsupported_in_one_shard_does_not(
    tmp_path: Path, capsys
) -> None:
    """A shard may hold none of the cases a backend supports; the merged sweep judging nothing of it is a finding."""

    def refuse(records: list[CheckResult], backend: str) -> list[CheckResult]:
        return [
            dataclasses.replace(r, status=Status.UNSUPPORTED, stats=None, reason="runs on cuda, not cpu")
            if r.backend == backend
            else r
            for r in records
        ]

    out = tmp_path / "merged.jsonl"
    one = [
        write(tmp_path / f"a{i}.jsonl", header(i), *(refuse(results(i), "kern-b") if i else results(i)))
        for i in range(N)
    ]
    assert main(["merge", *map(str, one), "--out", str(tmp_path / "one.jsonl")]) == 0
    capsys.readouterr()
    every = [write(tmp_path / f"b{i}.jsonl", header(i), *refuse(results(i), "kern-b")) for i in range(N)]
    assert main(["merge", *map(str, every), "--out", str(out), "--summary", str(tmp_path / "m.md")]) == 4
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"attnconf merge: UNJUDGED: kern-b judged none of its {N * LIMIT} pair(s): unsupported: runs on cuda, not cpu"
    ]
    assert "## Nothing judged" in (tmp_path / "m.md").read_text() and len(read_records(out)[1]) == N * LIMIT * 2
    assert main(["merge", *map(str, every), "--out", str(out), "--allow-unjudged"]) == 0
    assert main(["merge", *map(str, every[:2]), "--out", str(out)]) == 1  # missing shard: 1 before 4


def _cut_sweep(make, where: Path) -> list[Path]:
    """The shards of one sweep with headers by ``make``, shard 1 killed 3 pairs short; relative paths in ``where``."""
    where.mkdir()
    full = [write(where / f"s{i}.jsonl", make(i), *results(i)) for i in (0, 2)]
    cut = write(where / "s1.jsonl", make(1), *results(1)[:-3])
    return [Path(p.name) for p in (full[0], cut, full[1])]


def test_merge_by_the_header_selection_equals_merge_by_the_old_argv(tmp_path: Path, monkeypatch) -> None:
    merged = {}
    for name, make in (("new", selection_header), ("old", header)):
        files = _cut_sweep(make, tmp_path / name)
        monkeypatch.chdir(tmp_path / name)
        merged[name] = merge_shards(files)
    new, old = merged["new"], merged["old"]
    assert len(new.missing_pairs) == new.missing_count == 3 and set(new.missing_pairs) == set(old.missing_pairs)
    assert new.results == old.results and new.parts == tuple(
        dataclasses.replace(p, header=dataclasses.replace(p.header, selection=selection_header(i).selection))
        for i, p in enumerate(old.parts)
    )
    assert new.header.selection == {**selection_header(0).selection, "shard": None} and old.header.selection == {}
    assert dataclasses.replace(new.header, selection={}) == old.header


def test_the_selection_is_read_not_the_argv_which_only_old_headers_need(tmp_path: Path) -> None:
    unreadable_argv = ["attnconf", "run", "--a-flag-of-no-version"]
    files = _cut_sweep(lambda i: dataclasses.replace(selection_header(i), argv=unreadable_argv), tmp_path / "new")
    merged = merge_shards([tmp_path / "new" / f for f in files])
    assert merged.missing_count == 3 and len(merged.missing_pairs) == 3  # named: the selection was rebuilt
    # a selection this version cannot read is not replaced by the argv beside it: the pairs are counted, not named
    later = {**selection_header(1).selection, "schema": 2}
    path = write(tmp_path / "later.jsonl", dataclasses.replace(header(1), selection=later), *results(1)[:-3])
    (part,) = read_parts(path)
    assert part.missing == () and part.missing_count == 3
