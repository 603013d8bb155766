"""``nox -s mutation`` (docs "Mutation testing"): listed by nox, configured over attnref/ and
conformance/verdict/, and failing below its threshold.  The mutation run itself takes far too long for CI;
these tests check the wiring in a second or two (nox's listing, the session run against a stand-in mutmut)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib


@pytest.fixture(scope="module")
def noxfile():
    pytest.importorskip("nox", reason="nox is in the test extra")
    sys.path.insert(0, str(REPO))
    try:
        import noxfile
    finally:
        sys.path.remove(str(REPO))
    return noxfile


def test_nox_lists_the_mutation_session() -> None:
    pytest.importorskip("nox", reason="nox is in the test extra")
    res = subprocess.run(
        [sys.executable, "-m", "nox", "-f", str(REPO / "noxfile.py"), "-l", "--json", "-s", "mutation"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    assert [s["session"] for s in json.loads(res.stdout)] == ["mutation"]


def test_mutmut_mutates_the_reference_and_the_verdict_with_their_tests() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    cfg = project["tool"]["mutmut"]
    assert sorted(cfg["only_mutate"]) == ["attnref/*", "conformance/verdict/*"]
    assert all(Path(REPO, p).is_dir() for p in cfg["source_paths"])
    assert sorted(cfg["pytest_add_cli_args_test_selection"]) == ["tests/attnref", "tests/conformance/verdict"]
    # the config keys above are mutmut 3.8's: the extra must not let pip pick an older or a 4.x mutmut
    assert project["project"]["optional-dependencies"]["mutation"] == ["mutmut>=3.8,<4"]


def test_score_counts_timeouts_as_detected_and_everything_untried_as_not(noxfile) -> None:
    stats = {"killed": 90, "timeout": 5, "survived": 3, "no_tests": 1, "total": 102, "skipped": 2}
    assert noxfile.mutation_score(stats) == (95, 100)  # 1 no-tests + 1 not checked count against
    with pytest.raises(ValueError, match="'killed'"):
        noxfile.mutation_score({"timeout": 0, "total": 1, "skipped": 0})


class _Stop(Exception):
    pass


class _Session:
    posargs: list[str] = []

    def __init__(self) -> None:
        self.logs: list[str] = []

    def log(self, msg: str) -> None:
        self.logs.append(msg)

    def error(self, msg: str) -> None:
        raise _Stop(msg)


@pytest.mark.parametrize(("killed", "passes"), [(95, True), (94, False), (0, False)])
def test_session_fails_below_95_percent(noxfile, monkeypatch, tmp_path: Path, killed: int, passes: bool) -> None:
    """The session with mutmut replaced by a stand-in that writes the CI/CD stats of a run of 100 mutants."""
    calls: list[tuple[str, ...]] = []

    def fake_mutmut(session, *args, **kwargs) -> None:
        calls.append(args)
        if args[0] == "export-cicd-stats":
            Path("mutants").mkdir()
            total = 100
            Path(noxfile.MUTMUT_STATS).write_text(
                json.dumps({"killed": killed, "timeout": 0, "total": total, "skipped": 0})
            )

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(noxfile, "_install", lambda session, *extras: None)
    monkeypatch.setattr(noxfile, "_mutmut", fake_mutmut)
    session = _Session()
    if passes:
        noxfile.mutation.func(session)
        assert f"{killed}/100 killed = {killed}.0%" in session.logs[-1]
    else:
        with pytest.raises(_Stop, match=rf"{killed}/100 = {killed}\.0% killed, below 95%"):
            noxfile.mutation.func(session)
    assert [c[0] for c in calls] == ["run", "export-cicd-stats", "results"]


def test_session_fails_without_stats(noxfile, monkeypatch, tmp_path: Path) -> None:
    """No stats file (mutmut crashed before writing it, or wrote nothing): an error, never a pass."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(noxfile, "_install", lambda session, *extras: None)
    monkeypatch.setattr(noxfile, "_mutmut", lambda session, *args, **kwargs: None)
    with pytest.raises(_Stop, match="cannot read the kill rate"):
        noxfile.mutation.func(_Session())
