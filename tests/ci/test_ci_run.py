""".ci/run runs the README's two command lines, read from README.md, so the README and CI cannot drift.

``.ci/run --print`` lists the steps without running them (the same ``step`` calls that run them): README line 1
(the install and the main job), the example backend's install and a check that its entry point registered,
README line 2 (the tests but the slow ones: noxfile.TEST_ARGS), then the slow tests (``nox --no-venv -s slow``).
A README whose first ``bash`` block is not two lines stops CI with exit 2.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / ".ci" / "run"


def readme_lines(text: str) -> list[str]:
    """The lines of the first ```bash block (an independent reading: .ci/run uses awk)."""
    block = re.search(r"^```bash\s*\n(.*?)^```", text, re.S | re.M)
    assert block, "README.md has no ```bash block"
    return [line for line in block.group(1).splitlines() if line.strip()]


def planned_steps(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(root / ".ci" / "run"), "--print"], capture_output=True, text=True, timeout=60, check=False
    )


def steps_of(res: subprocess.CompletedProcess) -> list[str]:
    assert res.returncode == 0, res.stderr
    return [line[2:] for line in res.stdout.splitlines() if line.startswith("+ ")]


def test_readme_lines_install_the_pinned_torch_then_the_test_extra_and_run_the_tests() -> None:
    line1, line2 = readme_lines((REPO / "README.md").read_text())
    torch_pin = re.search(r'"ATTNCONF_TORCH", "(torch==[^"]+)"', (REPO / "noxfile.py").read_text()).group(1)
    # the main job needs the runtime and the report's libraries only (issue 28: a lean install); the tests' tools
    # come with line 2
    assert line1.startswith(f"pip install {torch_pin} && pip install -e '.[report]' && attnconf run "), line1
    # one command for the main job, so the line's exit status is the run's (0, 1, 4: conformance.exits), not a
    # report's written after it (issue 28); .ci/run checks the files it leaves
    assert line1.endswith(" && attnconf run --suite smoke --out results.jsonl --report report"), line1
    assert ";" not in line1 and "||" not in line1
    assert line2 == "pip install -e '.[test]' && python -m pytest -q " + shlex.join(_noxfile().TEST_ARGS)
    assert shlex.split(line2)[-3:] == ["-m", "not slow", "tests"]


def test_ci_runs_the_readme_lines_and_the_example_backend() -> None:
    line1, line2 = readme_lines((REPO / "README.md").read_text())
    (example_install, *_) = readme_lines((REPO / "examples" / "attnfast_example_backend" / "README.md").read_text())
    steps = steps_of(planned_steps(REPO))
    assert len(steps) == 5, steps
    assert steps[0] == line1 and steps[1] == example_install and steps[3] == line2
    assert steps[4] == "python -m nox --no-venv -s slow"  # the tests README line 2 leaves out
    assert "example-chunked" in steps[2] and "runnable_names" in steps[2]
    text = SCRIPT.read_text()
    assert "python3 -m venv" in text and "--system-site-packages" not in text  # a fresh venv, as a new user's


def _noxfile():
    sys.path.insert(0, str(REPO))
    try:
        import noxfile

        return noxfile
    finally:
        sys.path.remove(str(REPO))


def test_the_slow_session_runs_the_tests_the_readme_leaves_out() -> None:
    """README line 2 deselects ``slow``; ``nox -s slow`` selects it (less the 32k memory benchmark, which runs only
    when asked for by name), so each test runs in one of the two CI steps (a step that collects nothing fails CI)."""
    nox = _noxfile()
    every_core = ["-n", "auto", "--dist", "worksteal"]
    assert list(nox.TEST_ARGS) == [*every_core, "-m", "not slow", "tests"]
    assert list(nox.SLOW_ARGS) == [*every_core, "-m", "slow", "--deselect", nox.BENCH_32K, "tests"]
    path, name = nox.BENCH_32K.split("::")
    assert f"def {name}(" in (REPO / path).read_text()


def _copy_with_readme(tmp_path: Path, readme: str) -> Path:
    (tmp_path / ".ci").mkdir(parents=True)
    shutil.copy(SCRIPT, tmp_path / ".ci" / "run")
    (tmp_path / "README.md").write_text(readme)
    return tmp_path


def test_ci_follows_an_edited_readme(tmp_path: Path) -> None:
    text = (REPO / "README.md").read_text()
    line1, line2 = readme_lines(text)
    edited = text.replace(line2, "python -m pytest -q tests/attnref", 1).replace(line1, line1 + " --quiet", 1)
    steps = steps_of(planned_steps(_copy_with_readme(tmp_path, edited)))
    assert steps[0] == line1 + " --quiet" and steps[3] == "python -m pytest -q tests/attnref"


def test_ci_refuses_a_readme_block_that_is_not_two_lines(tmp_path: Path) -> None:
    line1, line2 = readme_lines((REPO / "README.md").read_text())
    for n, block in enumerate(([line1], [line1, line2, "echo extra"], [])):
        root = _copy_with_readme(tmp_path / str(n), "# t\n\n```bash\n" + "\n".join(block) + "\n```\n")
        res = planned_steps(root)
        assert res.returncode == 2 and "README.md" in res.stderr and f"found {len(block)}" in res.stderr, res
        assert "+ " not in res.stdout
    root = _copy_with_readme(tmp_path / "unknown", (REPO / "README.md").read_text())
    res = subprocess.run(
        ["bash", str(root / ".ci" / "run"), "--dry"], capture_output=True, text=True, timeout=60, check=False
    )
    assert res.returncode == 2 and "--dry" in res.stderr


def test_the_readme_says_what_each_exit_status_of_line_1_means() -> None:
    """Every status of conformance.exits but 141 (a closed pipe: not the main job's) is explained next to the two
    lines, with a link to the table."""
    from conformance.exits import Exit

    text = (REPO / "README.md").read_text()
    paragraph = text[text.index("The first line installs") : text.index("The second line ")]
    said = re.search(r"Its exit status is the run's: (.*?)\(\[the table\]\(conformance/exits\.py\)", paragraph, re.S)
    assert said, paragraph
    codes = [int(c) for c in re.findall(r"(?:^|, )(\d+) ", said.group(1).replace("\n", " "))]
    assert codes == [int(e) for e in Exit if e is not Exit.PIPE_CLOSED], said.group(1)
