"""``nox -s mutation`` (docs "Mutation testing"): listed by nox, configured over attnref/, conformance/verdict/ and
the modules that decide a CI verdict, and failing below its threshold overall or in any one module.  The mutation
run itself takes far too long for CI; these tests check the wiring in a second or two (nox's listing, the session
run against a stand-in mutmut)."""

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


#: the modules that decide a CI verdict (issue 29): compare and its inputs, the ledger, its predicates, fields and
#: audit, the records and results file (resume, backups), the bitwise comparison and the invariance verdicts
VERDICT_MODULES = [
    "conformance/engines/invariance.py",
    "conformance/graphs/bitwise.py",
    "conformance/graphs/invariance.py",
    "conformance/outputs.py",
    "conformance/records.py",
    "conformance/reporting/compare.py",
    "conformance/reporting/compare_inputs.py",
    "conformance/ledger/entries.py",
    "conformance/ledger/audit.py",
    "conformance/ledger/fields.py",
    "conformance/ledger/predicate.py",
    "conformance/results_file.py",
    "conformance/results_writer.py",
    "conformance/running/outfile.py",
]


def test_mutmut_mutates_the_reference_the_verdict_and_what_decides_a_ci_verdict_with_their_tests(
    noxfile, monkeypatch
) -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    cfg = project["tool"]["mutmut"]
    assert sorted(cfg["only_mutate"]) == sorted(["attnref/*", "conformance/verdict/*", *VERDICT_MODULES])
    assert all(Path(REPO, p).is_dir() for p in cfg["source_paths"])
    selection = cfg["pytest_add_cli_args_test_selection"]
    assert {"tests/attnref", "tests/conformance/verdict", "tests/conformance/reporting"} <= set(selection)
    assert all(Path(REPO, p).exists() for p in selection), [p for p in selection if not Path(REPO, p).exists()]
    monkeypatch.chdir(REPO)
    modules = noxfile.mutated_modules()  # every glob names a file that exists (the records code moves)
    assert set(VERDICT_MODULES) <= set(modules)
    assert {m.split("/")[0] for m in modules} == {"attnref", "conformance"}
    # the config keys above are mutmut 3.8's: the extra must not let pip pick an older or a 4.x mutmut
    assert project["project"]["optional-dependencies"]["mutation"] == ["mutmut>=3.8,<4"]


def test_mutants_folder_holds_every_first_party_package_the_tests_import() -> None:
    """mutmut runs the tests inside ``mutants/``, which holds ``source_paths`` and ``also_copy`` only: a first-party
    package outside both is imported from wherever the project is installed (another checkout's ``attnfast``, or
    none: a 64-core machine without the project failed mutmut's test listing with "No module named
    'attnfast.base'"), so every package the mutated code or the selected tests import must be copied in."""
    import ast

    cfg = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mutmut"]
    copied = {Path(p).parts[0] for p in [*cfg["source_paths"], *cfg.get("also_copy", [])]}
    first_party = {"attnref", "attnfast", "conformance"}
    files = [f for p in cfg["source_paths"] for f in Path(REPO, p).rglob("*.py")]
    for sel in cfg["pytest_add_cli_args_test_selection"]:
        path = Path(REPO, sel)
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    imported = set()
    for f in files:
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                imported.add(node.module.split(".")[0])
    assert imported & first_party <= copied, sorted(imported & first_party - copied)


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


def _project(tmp_path: Path, modules: dict[str, dict[str, int | None]], stats: dict | None = None) -> None:
    """A project of modules ``pkg/<name>.py`` mutated by ``[tool.mutmut]``, with mutmut's per-mutant results
    (``mutants/pkg/<name>.py.meta``, name -> exit code) and the CI/CD stats a run of them writes."""
    (tmp_path / "pyproject.toml").write_text('[tool.mutmut]\nsource_paths = ["pkg"]\nonly_mutate = ["pkg/*"]\n')
    (tmp_path / "pkg").mkdir()
    (tmp_path / "mutants" / "pkg").mkdir(parents=True)
    for name, codes in modules.items():
        (tmp_path / "pkg" / f"{name}.py").write_text("")
        meta = {"exit_code_by_key": codes, "hash_by_function_name": {}, "durations_by_key": {}}
        (tmp_path / "mutants" / "pkg" / f"{name}.py.meta").write_text(json.dumps(meta))
    if stats is None:
        codes = [c for m in modules.values() for c in m.values()]
        stats = {
            "killed": sum(c in (1, 3) for c in codes),
            "timeout": sum(c == 36 for c in codes),
            "total": len(codes),
            "skipped": sum(c == 34 for c in codes),
        }
    (tmp_path / "mutants" / "mutmut-cicd-stats.json").write_text(json.dumps(stats))


def _codes(prefix: str, killed: int, survived: int = 0, **more: int) -> dict[str, int | None]:
    """``killed`` mutants killed, ``survived`` survived, and ``more`` of other codes (timeout=36, skipped=34,
    untried=None, no_tests=33)."""
    code = {"timeout": 36, "skipped": 34, "untried": None, "no_tests": 33}
    kinds = [1] * killed + [0] * survived + [code[k] for k, n in more.items() for _ in range(n)]
    return {f"{prefix}.x_f__mutmut_{i}": c for i, c in enumerate(kinds)}


def _run_session(noxfile, monkeypatch, tmp_path: Path) -> tuple[_Session, list[tuple[str, ...]]]:
    calls: list[tuple[str, ...]] = []
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(noxfile, "_install", lambda session, *extras: None)
    monkeypatch.setattr(noxfile, "_mutmut", lambda session, *args, **kwargs: calls.append(args))
    session = _Session()
    try:
        noxfile.mutation.func(session)
    finally:
        assert [c[0] for c in calls][:2] == ["run", "export-cicd-stats"]
    return session, calls


@pytest.mark.parametrize(("killed", "passes"), [(95, True), (94, False), (0, False)])
def test_session_fails_below_95_percent(noxfile, monkeypatch, tmp_path: Path, killed: int, passes: bool) -> None:
    """The session with mutmut replaced by a stand-in: the results of a run of 100 mutants of one module."""
    _project(tmp_path, {"a": _codes("pkg.a", killed, 100 - killed)})
    if passes:
        session, calls = _run_session(noxfile, monkeypatch, tmp_path)
        assert f"{killed}/100 killed = {killed}.0%" in session.logs[-1] and session.logs[-1].endswith(": ok")
        assert f"pkg/a.py: {killed}/100 = {killed}.0%, {100 - killed} not detected" in session.logs
        assert [c[0] for c in calls] == ["run", "export-cicd-stats", "results"]
    else:
        with pytest.raises(_Stop, match=rf"{killed}/100 = {killed}\.0% killed, below 95%"):
            _run_session(noxfile, monkeypatch, tmp_path)


def test_session_fails_when_one_module_is_below_95_percent_while_the_total_is_above(
    noxfile, monkeypatch, tmp_path: Path
) -> None:
    """96 of 100 detected overall, but ``pkg/b.py`` has 16 of 20: the issue asks 95 % of every module."""
    _project(tmp_path, {"a": _codes("pkg.a", 80), "b": _codes("pkg.b", 15, 4, timeout=1), "c": {}})
    with pytest.raises(_Stop, match=r"1 module\(s\) below 95%: pkg/b\.py 16/20 = 80\.0%$"):
        _run_session(noxfile, monkeypatch, tmp_path)


def test_session_passes_when_every_module_and_the_total_reach_95_percent(noxfile, monkeypatch, tmp_path: Path) -> None:
    _project(tmp_path, {"a": _codes("pkg.a", 78, 2, skipped=3), "b": _codes("pkg.b", 18, 1, timeout=1), "c": {}})
    session, _ = _run_session(noxfile, monkeypatch, tmp_path)
    assert "pkg/a.py: 78/80 = 97.5%, 2 not detected" in session.logs
    assert "pkg/b.py: 19/20 = 95.0%, 1 not detected" in session.logs
    assert "pkg/c.py: no mutants" in session.logs  # a module without functions to mutate has nothing to score
    assert "97/100 killed = 97.0%" in session.logs[-1] and session.logs[-1].endswith(": ok")


def test_module_score_counts_as_the_total_does(noxfile, monkeypatch, tmp_path: Path) -> None:
    """Killed and timed out: detected; skipped: not counted; survived, untried (None), no tests: not detected."""
    _project(tmp_path, {"a": _codes("pkg.a", 5, 2, timeout=1, skipped=2, untried=3, no_tests=1)})
    monkeypatch.chdir(tmp_path)
    detected, counted, missed = noxfile.mutmut_results().module_score("pkg/a.py")
    assert (detected, counted) == (6, 12)
    assert missed == sorted(f"pkg.a.x_f__mutmut_{i}" for i in (5, 6, 10, 11, 12, 13))


def test_a_partial_run_of_one_module_does_not_pass(noxfile, monkeypatch, tmp_path: Path) -> None:
    """A run with a name glob tried ``pkg.a``'s mutants only: ``pkg/b.py``'s untried mutants fail the session."""
    _project(tmp_path, {"a": _codes("pkg.a", 200), "b": _codes("pkg.b", 0, untried=5)})
    with pytest.raises(_Stop, match=r"pkg/b\.py 0/5 = 0\.0%"):
        _run_session(noxfile, monkeypatch, tmp_path)


@pytest.mark.parametrize(
    ("meta", "match"),
    [(None, r"no results for module pkg/a\.py"), ("{}", "not mutmut's per-mutant results"), ("[1", "not mutmut's")],
)
def test_a_missing_or_garbled_module_result_is_an_error(noxfile, monkeypatch, tmp_path: Path, meta, match) -> None:
    _project(tmp_path, {"a": _codes("pkg.a", 10)})
    path = tmp_path / "mutants" / "pkg" / "a.py.meta"
    path.unlink() if meta is None else path.write_text(meta)
    with pytest.raises(_Stop, match="cannot read the kill rate: .*" + match):
        _run_session(noxfile, monkeypatch, tmp_path)


def test_per_module_results_that_disagree_with_the_stats_are_an_error(noxfile, monkeypatch, tmp_path: Path) -> None:
    _project(tmp_path, {"a": _codes("pkg.a", 10)}, stats={"killed": 20, "timeout": 0, "total": 20, "skipped": 0})
    with pytest.raises(_Stop, match="disagree on the counts"):
        _run_session(noxfile, monkeypatch, tmp_path)


def test_a_glob_that_names_no_module_is_an_error(noxfile, monkeypatch, tmp_path: Path) -> None:
    """A module renamed or moved must not leave the mutated set silently."""
    _project(tmp_path, {"a": _codes("pkg.a", 10)})
    (tmp_path / "pyproject.toml").write_text(
        '[tool.mutmut]\nsource_paths = ["pkg"]\nonly_mutate = ["pkg/a.py", "pkg/gone.py"]\n'
        'do_not_mutate = ["pkg/a.py"]\n'
    )
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"only_mutate 'pkg/gone\.py' matches no file"):
        noxfile.mutated_modules()
    (tmp_path / "pyproject.toml").write_text(
        '[tool.mutmut]\nsource_paths = ["pkg"]\nonly_mutate = ["pkg/*"]\ndo_not_mutate = ["pkg/a.py"]\n'
    )
    (tmp_path / "pkg" / "b.py").write_text("")
    (tmp_path / "pkg" / "notes.txt").write_text("")
    assert noxfile.mutated_modules() == ["pkg/b.py"]


def test_session_fails_without_stats(noxfile, monkeypatch, tmp_path: Path) -> None:
    """No stats file (mutmut crashed before writing it, or wrote nothing): an error, never a pass."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(noxfile, "_install", lambda session, *extras: None)
    monkeypatch.setattr(noxfile, "_mutmut", lambda session, *args, **kwargs: None)
    with pytest.raises(_Stop, match="cannot read the kill rate"):
        noxfile.mutation.func(_Session())


def test_a_glob_given_again_runs_only_the_mutants_without_a_result(noxfile, monkeypatch, tmp_path: Path) -> None:
    """mutmut reruns every mutant its command line names: going on with ``nox -s mutation -- 'pkg.a.*'`` after an
    interrupted run must name only ``pkg.a``'s untried mutants, keep other arguments, and leave other modules out."""
    _project(tmp_path, {"a": _codes("pkg.a", 3, 1, untried=2), "b": _codes("pkg.b", 0, untried=4)})
    monkeypatch.chdir(tmp_path)
    args = ["--max-children", "4", "pkg.a.*"]
    assert noxfile.mutmut_results().untried_mutants(args) == [
        "--max-children",
        "4",
        "pkg.a.x_f__mutmut_4",
        "pkg.a.x_f__mutmut_5",
    ]
    assert noxfile.mutmut_results().untried_mutants(["pkg.a.x_f__mutmut_0"]) == [
        "pkg.a.x_f__mutmut_0"
    ]  # a name: rerun as asked
    assert noxfile.mutmut_results().untried_mutants([]) == []  # no glob: mutmut itself tries only what has no result
    assert noxfile.mutmut_results().untried_mutants(["pkg.?.x_f__mutmut_[05]"]) == [
        "pkg.a.x_f__mutmut_5",
        "pkg.b.x_f__mutmut_0",
    ]


def test_before_the_first_run_the_globs_go_to_mutmut_as_given(noxfile, monkeypatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)  # no mutants/ yet: mutmut makes the mutants, then runs those the glob names
    assert noxfile.mutmut_results().untried_mutants(["pkg.a.*"]) == ["pkg.a.*"]


def test_a_glob_with_nothing_left_to_try_runs_nothing(noxfile, monkeypatch, tmp_path: Path) -> None:
    """Every mutant of ``pkg.a`` has a result: no ``mutmut run`` (which, given no name, would try ``pkg.b``'s), and
    the scores are read as they stand (``pkg.b`` untried fails the session)."""
    _project(tmp_path, {"a": _codes("pkg.a", 10), "b": _codes("pkg.b", 0, untried=4)})
    monkeypatch.chdir(tmp_path)
    assert noxfile.mutmut_results().untried_mutants(["--max-children", "2", "pkg.a.*"]) is None
    calls: list[tuple[str, ...]] = []
    monkeypatch.setattr(noxfile, "_install", lambda session, *extras: None)
    monkeypatch.setattr(noxfile, "_mutmut", lambda session, *args, **kwargs: calls.append(args))
    session = _Session()
    session.posargs = ["pkg.a.*"]
    with pytest.raises(_Stop, match=r"10/14 = 71\.4% killed, below 95%"):
        noxfile.mutation.func(session)
    assert [c[0] for c in calls] == ["export-cicd-stats", "results"] and "nothing to run" in session.logs[0]


def test_a_garbled_result_file_stops_the_glob_expansion_in_one_line(noxfile, monkeypatch, tmp_path: Path) -> None:
    """The same reading as the scores (:func:`exit_codes`): a ``.meta`` that is not mutmut's is refused, naming it."""
    _project(tmp_path, {"a": _codes("pkg.a", 3, untried=2)})
    (tmp_path / "mutants" / "pkg" / "a.py.meta").write_text('{"exit_code_by_key": [1]}')
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"a\.py\.meta: not mutmut's per-mutant results"):
        noxfile.mutmut_results().untried_mutants(["pkg.a.*"])
    monkeypatch.setattr(noxfile, "_install", lambda session, *extras: None)
    monkeypatch.setattr(noxfile, "_mutmut", lambda session, *args, **kwargs: None)
    session = _Session()
    session.posargs = ["pkg.a.*"]
    with pytest.raises(_Stop, match=r"^nox -s mutation: cannot read which mutants have results: .*a\.py\.meta"):
        noxfile.mutation.func(session)


def test_stale_copies_are_the_old_data_and_the_files_the_checkout_no_longer_has(noxfile, tmp_path, monkeypatch) -> None:
    """mutmut refreshes a mutated module but copies other source files only when absent and never deletes: a changed
    ledger TOML, a moved test and a moved module's results would stay in mutants/ and be tested against."""
    monkeypatch.chdir(tmp_path)
    Path("pyproject.toml").write_text(
        '[tool.mutmut]\nsource_paths = ["pkg"]\nalso_copy = ["extra"]\nonly_mutate = ["pkg/mod.py"]\n'
    )
    files = {
        "pkg/mod.py": "x = 1\n",
        "pkg/data.toml": "a = 1\n",
        "pkg/same.toml": "b = 2\n",
        "extra/helper.py": "y = 2\n",
        "tests/test_new.py": "def test(): pass\n",
    }
    for name, text in files.items():
        Path(name).parent.mkdir(parents=True, exist_ok=True)
        Path(name).write_text(text)
    copies = {
        "mutants/pkg/mod.py": "x = 1  # mutated\n",  # a mutated module differs from its source: mutmut's own
        "mutants/pkg/mod.py.meta": "{}",
        "mutants/pkg/mod.py.spans": "",
        "mutants/pkg/data.toml": "a = 0\n",  # stale data
        "mutants/pkg/same.toml": "b = 2\n",
        "mutants/pkg/old.py": "z = 0\n",  # moved away: module, results and spans all stale
        "mutants/pkg/old.py.meta": "{}",
        "mutants/pkg/old.py.spans": "",
        "mutants/pkg/__pycache__/old.cpython-312.pyc": "",
        "mutants/extra/helper.py": "y = 1\n",  # also_copy: copied over on every run, so only a missing source counts
        "mutants/extra/gone.py": "",
        "mutants/tests/test_new.py": "def test(): pass\n",
        "mutants/tests/test_moved.py": "def test(): pass\n",
        "mutants/mutmut-stats.json": "{}",
    }
    for name, text in copies.items():
        Path(name).parent.mkdir(parents=True, exist_ok=True)
        Path(name).write_text(text)
    assert noxfile.stale_copies() == [
        "mutants/extra/gone.py",
        "mutants/pkg/data.toml",
        "mutants/pkg/old.py",
        "mutants/pkg/old.py.meta",
        "mutants/pkg/old.py.spans",
        "mutants/tests/test_moved.py",
    ]
    Path("mutants/pkg/data.toml").write_text("a = 1\n")
    for name in ("extra/gone.py", "pkg/old.py", "pkg/old.py.meta", "pkg/old.py.spans", "tests/test_moved.py"):
        Path("mutants", name).unlink()
    assert noxfile.stale_copies() == []
