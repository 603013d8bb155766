"""What ``attnconf compare`` reads from the two headers before it compares (suite, tolerance, seed), the promises
that test_fail_closed.py leaves open (found by `nox -s mutation`): each test is named after the promise it checks."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from conformance.cases.case import AttentionCase

from conformance.records import Header
from conformance.reporting.compare_inputs import LISTED, CompareRefused, check_inputs, suite_of, tolerance_of
from tests.conformance.reporting.test_fail_closed import (
    CASES,
    FAMILIES,
    compare,
    full,
    header,
    legacy_header,
    refused,
    result,
    write,
)


def _legacy(suite: str | None = "smoke", **run) -> Header:
    """A header written before ``Header.sweep`` existed: the suite and ``env.run`` as recorded."""
    return Header(suite=suite, backends=legacy_header([]).backends, env={"run": run})


def _partial(drop: str, **env_run) -> Header:
    """A current header run with ``--tol factor=3`` whose sweep lacks ``drop`` (another writer's, or a future
    one's), env.run as given."""
    h = header(tol=[{"factor": 3.0}])
    return dataclasses.replace(h, sweep={k: v for k, v in h.sweep.items() if k != drop}, env={"run": env_run})


# ------------------------------------------------------------------------------------------------- suite


def test_the_suite_compared_is_the_sweeps_not_the_top_level_field(tmp_path: Path, capsys) -> None:
    """The suite is ``Header.sweep["suite"]`` where the sweep records one, whatever the top-level field says."""
    relabelled = dataclasses.replace(header("smoke"), suite="default")
    assert suite_of(relabelled) == "smoke"
    old = write(tmp_path / "old.jsonl", header("smoke"), *full())
    new = write(tmp_path / "new.jsonl", relabelled, *full())
    assert compare(capsys, old, new)[0] == 0
    other = write(tmp_path / "other.jsonl", dataclasses.replace(header("default"), suite="smoke"), *full())
    assert "a run of suite default, but" in refused(capsys, old, other)


def test_a_header_without_a_suite_is_a_custom_run(tmp_path: Path, capsys) -> None:
    """A header from before ``sweep`` with no suite recorded is a ``custom`` run, like a --case-json run now."""
    assert suite_of(_legacy(None, seed=0, tol=[])) == "custom"
    assert suite_of(_legacy("", seed=0, tol=[])) == "custom"
    old = write(tmp_path / "old.jsonl", _legacy(None, seed=0, tol=[]), *full())
    new = write(tmp_path / "new.jsonl", header(None), *full())
    status, out, err = compare(capsys, old, new)
    assert status == 0 and err == "" and "Suite `custom` in both" in out


def test_a_sweep_lacking_a_field_is_read_from_what_else_the_header_recorded(tmp_path: Path) -> None:
    """A sweep without suite, tol or seed: the top-level suite and env.run's tol and seed stand in, no crash."""
    now = write(tmp_path / "now.jsonl", header(tol=[{"factor": 3.0}]), *full())
    no_suite = write(tmp_path / "no-suite.jsonl", _partial("suite", seed=0, tol=["factor=3"]), *full())
    no_tol = write(tmp_path / "no-tol.jsonl", _partial("tol", seed=0, tol=["factor=3"]), *full())
    no_seed = write(tmp_path / "no-seed.jsonl", _partial("seed", seed=7, tol=["factor=3"]), *full())
    assert suite_of(_partial("suite")) == "smoke"
    assert tolerance_of(_partial("tol", tol=["factor=3"]))[1] == 'overrides [{"factor": 3.0}] (--tol factor=3)'
    assert check_inputs(now, no_suite).notes == []
    assert check_inputs(now, no_tol).notes == []
    assert check_inputs(now, no_seed).notes[0].startswith("Seeds differ (old ['0'], new ['7']): ")


# --------------------------------------------------------------------------------------------- tolerance


def test_an_old_header_recording_only_tol_or_only_tol_file_has_a_known_tolerance(tmp_path: Path, capsys) -> None:
    """env.run with a ``tol`` key but no ``tol_file`` key (or the reverse) records a tolerance: not "unrecorded"."""
    tol_only = write(tmp_path / "tol-only.jsonl", _legacy(seed=0, tol=["factor=3"]), *full())
    now = write(tmp_path / "now.jsonl", header(tol=[{"factor": 3}]), *full())
    assert compare(capsys, tol_only, now)[0] == 0
    file_only = write(tmp_path / "file-only.jsonl", _legacy(seed=0, tol_file="tol.toml"), *full())
    assert compare(capsys, file_only, file_only)[0] == 0
    assert tolerance_of(_legacy(tol_file="tol.toml"))[1] == "--tol-file tol.toml (file contents not recorded)"


def test_an_unrecorded_tolerance_is_described_as_such(tmp_path: Path, capsys) -> None:
    """A header recording no tolerance at all is refused, described as "no tolerance recorded ... (env.run.tol)"."""
    bare = _legacy(seed=0)
    assert tolerance_of(bare) == ("unrecorded", "no tolerance recorded in the header (env.run.tol)")
    unrecorded = write(tmp_path / "unrecorded.jsonl", bare, *full())
    line = refused(capsys, unrecorded, unrecorded)
    assert ": judged with tolerance no tolerance recorded in the header (env.run.tol), but " in line


def test_old_flags_that_do_not_parse_match_only_the_same_flags(tmp_path: Path, capsys) -> None:
    """A --tol this version cannot parse, or a --tol-file, is compared as typed: other flags or file names differ."""
    two = write(tmp_path / "two.jsonl", _legacy(seed=0, tol=["oldkey=2"]), *full())
    three = write(tmp_path / "three.jsonl", _legacy(seed=0, tol=["oldkey=3"]), *full())
    line = refused(capsys, two, three)
    assert "judged with tolerance --tol oldkey=3 (file contents not recorded), but " in line
    assert " with --tol oldkey=2 (file contents not recorded); verdicts under different (or unknown)" in line
    assert compare(capsys, two, two)[0] == 0
    a = write(tmp_path / "a.jsonl", legacy_header([], "a.toml"), *full())
    b = write(tmp_path / "b.jsonl", legacy_header([], "b.toml"), *full())
    assert "judged with tolerance --tol-file b.toml (file contents not recorded)" in refused(capsys, a, b)


def test_one_override_is_one_tolerance_whatever_the_order_of_its_keys(tmp_path: Path, capsys) -> None:
    """``bf16.atol=0.5`` typed as a flag (parsed scope first) and the same override recorded in a sweep (a TOML
    table, keys in any order) are one tolerance."""
    flags = write(tmp_path / "flags.jsonl", legacy_header(["bf16.atol=0.5"]), *full())
    table = write(tmp_path / "table.jsonl", header(tol=[{"atol": 0.5, "dtype": "bf16"}]), *full())
    assert compare(capsys, flags, table)[0] == 0
    assert compare(capsys, table, flags)[0] == 0
    shown = 'overrides [{"atol": 0.5, "dtype": "bf16"}]'
    assert tolerance_of(header(tol=[{"dtype": "bf16", "atol": 0.5}]))[1] == shown
    assert tolerance_of(legacy_header(["bf16.atol=0.5"]))[1] == f"{shown} (--tol bf16.atol=0.5)"


def test_a_long_override_is_described_cut_to_160_characters(tmp_path: Path) -> None:
    """Overrides up to 160 characters of JSON are shown whole; longer ones as their first 157 and "..."."""

    def tol(text_length: int) -> list:
        short = [{"case": "", "factor": 3.0}]
        return [{"case": "c" * (text_length - len(json.dumps(short))), "factor": 3.0}]

    at_limit, over = tol(160), tol(161)
    text = json.dumps(at_limit, sort_keys=True)
    assert len(text) == 160 and tolerance_of(header(tol=at_limit))[1] == f"overrides {text}"
    text = json.dumps(over, sort_keys=True)
    shown = tolerance_of(header(tol=over))[1].removeprefix("overrides ")
    assert len(text) == 161 and shown == text[:157] + "..." and len(shown) == 160
    assert tolerance_of(header(tol=over))[0] != tolerance_of(header(tol=tol(162)))[0]  # compared in full


def test_the_flags_of_a_tolerance_are_listed_as_typed_one_space_apart() -> None:
    """Several --tol flags (and a --tol-file) are described as the command line had them, space-separated."""
    parsed = tolerance_of(legacy_header(["factor=3", "atol=1"]))[1]
    assert parsed == 'overrides [{"factor": 3.0}, {"atol": 1.0}] (--tol factor=3 --tol atol=1)'
    typed = tolerance_of(legacy_header(["factor=3"], "tol.toml"))[1]
    assert typed == "--tol factor=3 --tol-file tol.toml (file contents not recorded)"


def test_a_file_mixing_three_tolerances_is_refused_naming_the_first_two(tmp_path: Path, capsys) -> None:
    """A file of three runs under three tolerances is refused (exit 2, one line) naming headers 1 and 2."""
    results = full()
    mixed = write(
        tmp_path / "mixed.jsonl",
        header(),
        *results[:2],
        header(tol=[{"atol": 1.0}]),
        *results[2:4],
        header(tol=[{"factor": 3.0}]),
        *results[4:],
    )
    old = write(tmp_path / "old.jsonl", header(), *full())
    line = refused(capsys, old, mixed)
    assert 'header 1 has the defaults, header 2 has overrides [{"atol": 1.0}]; compare one run' in line


# -------------------------------------------------------------------------------------------------- seed


def test_seeds_are_the_sweeps_and_a_difference_is_noted(tmp_path: Path) -> None:
    """Two runs whose sweeps record different seeds are compared with a note that the seeds differ."""
    zero = write(tmp_path / "zero.jsonl", header(), *full())
    one = write(tmp_path / "one.jsonl", header(seed=1), *full())  # env.run still says seed 0
    assert check_inputs(zero, zero).notes == []
    (note,) = check_inputs(zero, one).notes
    assert note.startswith("Seeds differ (old ['0'], new ['1']): the inputs differ")


def test_the_seed_of_an_old_header_is_its_env_run_seed(tmp_path: Path) -> None:
    """A header from before ``sweep`` records its seed in env.run: two such runs of different seeds get the note."""
    zero = write(tmp_path / "zero.jsonl", _legacy(seed=0, tol=[]), *full())
    one = write(tmp_path / "one.jsonl", _legacy(seed=1, tol=[]), *full())
    assert check_inputs(zero, zero).notes == []
    (note,) = check_inputs(zero, one).notes
    assert note.startswith("Seeds differ (old ['0'], new ['1']): the inputs differ")


# ------------------------------------------------------------------------------- defaults, duplicates, texts
# (the survivors of the fourth session's mutation run over compare_inputs.py)


MANY = [AttentionCase(requests=((2, 2 + i),), num_heads=2, num_kv_heads=1, head_dim=8) for i in range(8)]


def _refusal(old: Path, new: Path, **options) -> str:
    with pytest.raises(CompareRefused) as exc:
        check_inputs(old, new, **options)
    return exc.value.reason


def test_check_inputs_fails_closed_when_called_without_options(tmp_path: Path) -> None:
    """Every option of check_inputs defaults to the closed side: skipped lines, a subset, other families and
    duplicated pairs are refused unless the caller asks for them."""
    old = write(tmp_path / "old.jsonl", header(), *full())
    garbled = write(tmp_path / "garbled.jsonl", header(), *full()[:3])
    with open(garbled, "a", encoding="utf-8") as fh:
        fh.write("{not json\n")
    write(garbled, *full()[3:])
    assert "skipped" in _refusal(old, garbled) or "line" in _refusal(old, garbled)
    assert check_inputs(old, garbled, allow_skipped=True).new_results
    subset = write(tmp_path / "subset.jsonl", header(), *full()[:-1])
    assert "lacks 1 of the" in _refusal(old, subset)
    kern_only = write(tmp_path / "kern.jsonl", header(families=("kern",)), *[result(c, "kern") for c in CASES])
    assert "lacks 3 of the 6" in _refusal(old, kern_only)
    assert check_inputs(old, kern_only, only_new_families=True).outside_scope == {"other": 3}
    doubled = write(tmp_path / "doubled.jsonl", header(), *full(), full()[0])
    _refusal(old, doubled)


def test_dropping_duplicates_applies_to_both_files(tmp_path: Path) -> None:
    """--drop-duplicates drops the duplicated pairs of OLD as well as NEW (each file loaded with the option)."""
    old = write(tmp_path / "old.jsonl", header(), *full())
    doubled = write(tmp_path / "doubled.jsonl", header(), *full(), full()[0])
    for a, b in ((doubled, old), (old, doubled)):
        _refusal(a, b)
        inputs = check_inputs(a, b, drop_duplicates=True)
        assert len(inputs.old_results) == len(inputs.new_results) == len(full())


@pytest.mark.parametrize("side", ["old", "new"])
def test_a_file_mixing_suites_or_tolerances_is_refused_by_name(tmp_path: Path, side: str) -> None:
    """A file whose headers disagree is refused with what they disagree on: suites or tolerances."""
    plain = write(tmp_path / "plain.jsonl", header(), *full())
    suites = write(tmp_path / "suites.jsonl", header("smoke"), *full()[:3], header("default"), *full()[3:])
    tols = write(tmp_path / "tols.jsonl", header(), *full()[:3], header(tol=[{"factor": 3.0}]), *full()[3:])
    for mixed, what in ((suites, "suites"), (tols, "tolerances")):
        pair = (mixed, plain) if side == "old" else (plain, mixed)
        assert _refusal(*pair).startswith(f"mixes runs of different {what}: header 1 has ")


def test_the_refusals_say_what_to_do(tmp_path: Path) -> None:
    """Nothing in common: '... ; nothing to compare'.  A subset: the missing pairs named (at most LISTED, joined
    by ', ', the exact count of the rest) and the way out."""
    old = write(tmp_path / "old.jsonl", header(), *[result(c, f) for c in MANY for f in FAMILIES])
    other = write(tmp_path / "other.jsonl", header(), *full())
    assert _refusal(old, other).endswith("(16 pairs there, 6 here); nothing to compare")
    pairs = sorted((c.id, f) for c in MANY for f in FAMILIES)
    one = write(tmp_path / "one.jsonl", header(), result(MANY[0], "kern"))
    missing = [p for p in pairs if p != (MANY[0].id, "kern")]
    named = ", ".join(f"{c} x {b}" for c, b in missing[:LISTED])
    assert _refusal(old, one) == (
        f"lacks {len(missing)} of the {len(pairs)} (case, family) pairs of {old}: {named} "
        f"(+{len(missing) - LISTED} more); run them, or pass --allow-subset to compare the rest"
    )
    keep = [p for p in pairs if p not in missing[:LISTED]]
    exactly = write(
        tmp_path / "five.jsonl", header(), *[result(next(c for c in MANY if c.id == i), f) for i, f in keep]
    )
    five = ", ".join(f"{c} x {b}" for c, b in missing[:LISTED])
    assert _refusal(old, exactly).endswith(f": {five}; run them, or pass --allow-subset to compare the rest")
