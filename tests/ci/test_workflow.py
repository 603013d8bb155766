""".github/workflows/gpu-conformance.yml: linted, wired to nox sessions that exist, and its steps run on CPU.

* The linters of the ``lint`` nox session (check-jsonschema's GitHub-workflow schema, zizmor offline with
  strict collection, actionlint when on PATH) accept the workflow and reject broken copies of it.
* Every ``nox -s NAME -- ARGS`` the workflow runs names a session of noxfile.py, and its arguments parse
  (the session's own parser, then ``attnconf run``'s): the step scripts are run by bash with a stub
  interpreter that records what would have been run.
* End to end on CPU: the plan step, two shard steps (``sdpa-cpu``, one case each), the merge and summary
  steps, and the gate step against a planted regression (exit 1, the case named in the job summary), all as
  GitHub runs them (``bash -eo pipefail``), in a scratch directory; the merged run compared with itself
  passes, and one shard alone is reported missing (both in-process, through ``attnconf``).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml", reason="pyyaml is in the test extra: pip install -e '.[test]'")

REPO = Path(__file__).resolve().parents[2]
WORKFLOW = REPO / ".github" / "workflows" / "gpu-conformance.yml"


@pytest.fixture(scope="module")
def workflow() -> dict[str, Any]:
    return yaml.safe_load(WORKFLOW.read_text())


def step(workflow: dict[str, Any], job: str, step_id: str) -> dict[str, Any]:
    (found,) = [s for s in workflow["jobs"][job]["steps"] if s.get("id") == step_id]
    return found


def run_step(
    workflow: dict[str, Any], job: str, step_id: str, cwd: Path, env: dict[str, str]
) -> subprocess.CompletedProcess:
    """One ``run:`` step the way a GitHub runner runs it: ``bash --noprofile --norc -eo pipefail``."""
    script = cwd / f".step-{job}-{step_id}.sh"
    script.write_text(step(workflow, job, step_id)["run"])
    return subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def base_env(tmp: Path, python: str, **extra: str) -> dict[str, str]:
    """The workflow-level env with CPU values, a `python` on PATH, and the files GitHub provides."""
    bindir = tmp / "bin"
    bindir.mkdir(exist_ok=True)
    shim = bindir / "python"
    if not shim.exists():
        # a script that execs the interpreter by its own path: a symlink to a venv's python, called by another
        # path, finds no pyvenv.cfg beside it and runs the base interpreter without the venv's packages
        shim.write_text(f'#!/bin/sh\nexec {shlex.quote(python)} "$@"\n')
        shim.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "NOX"))}
    env.update(
        PATH=f"{bindir}{os.pathsep}{env.get('PATH', '')}",
        PYTHON=python,
        SUITE="smoke",
        BACKENDS="sdpa-cpu",
        DEVICE="cpu",
        RUN_ARGS="--limit 1 --timeout 300",
        SHARDS="2",
        BASELINE="baseline.jsonl",
        ATTNCONF_GIT_COMMIT="c0ffee0000000000000000000000000000000042",
        GITHUB_OUTPUT=str(tmp / "github_output"),
        GITHUB_STEP_SUMMARY=str(tmp / "step_summary.md"),
        PYTHONPATH=str(REPO),
    )
    env.update(extra)
    return env


def test_python_on_the_step_path_keeps_a_venv(tmp_path: Path) -> None:
    """The steps' ``python`` is the interpreter it names, venv included (a symlink to a venv's python is not)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    env = base_env(tmp_path, str(venv / "bin" / "python"))
    res = subprocess.run(
        ["bash", "--noprofile", "--norc", "-c", "python -c 'import sys; print(sys.prefix)'"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    assert Path(res.stdout.strip()) == venv


# ------------------------------------------------------------------------------------------ structure


def test_jobs_matrix_artifacts_and_pins(workflow: dict[str, Any]) -> None:
    on = workflow.get("on", workflow.get(True))  # YAML 1.1 reads the bare key `on` as True
    assert {"push", "pull_request", "workflow_dispatch"} <= set(on)
    assert {"suite", "backends", "shards", "baseline"} <= set(on["workflow_dispatch"]["inputs"])
    jobs = workflow["jobs"]
    shard, merge = jobs["shard"], jobs["merge"]
    assert "self-hosted" in shard["runs-on"] and "vars.ATTNCONF_GPU_RUNNER" in shard["runs-on"]
    assert shard["strategy"]["matrix"]["shard"] == "${{ fromJSON(needs.plan.outputs.shards) }}"
    assert shard["strategy"]["fail-fast"] is False
    assert merge["runs-on"] == "ubuntu-latest" and set(merge["needs"]) == {"plan", "shard"}
    assert "!cancelled()" in merge["if"]  # a failed shard job still gets merged (and reported missing)
    (upload,) = [s for s in shard["steps"] if "upload-artifact" in s.get("uses", "")]
    assert "${{ matrix.shard }}" in upload["with"]["name"]  # unique per shard: v4+ artifacts are immutable
    (download,) = [s for s in merge["steps"] if "download-artifact" in s.get("uses", "")]
    prefix = download["with"]["pattern"].rstrip("*")
    assert upload["with"]["name"].startswith(prefix) and download["with"]["merge-multiple"] is True
    uses = [s["uses"] for job in jobs.values() for s in job.get("steps", []) if "uses" in s]
    assert uses and all(re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", u) for u in uses), uses


def test_pins_agree_with_noxfile_and_test_extra() -> None:
    """The merge job installs the noxfile's torch pin; `nox -s lint` installs the linters the test extra has."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    nox_text = (REPO / "noxfile.py").read_text()
    torch_pin = re.search(r'"ATTNCONF_TORCH", "(torch==[^"]+)"', nox_text).group(1)
    assert f"pip install {torch_pin} --index-url https://download.pytorch.org/whl/cpu" in WORKFLOW.read_text()
    linters = re.search(r"WORKFLOW_LINTERS = \(([^)]*)\)", nox_text).group(1)
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    pins = re.findall(r'"([^"]+)"', linters)
    assert len(pins) == 2 and set(pins) <= set(extra), (pins, extra)


def nox_sessions_called(text: str) -> set[str]:
    """Session names after ``-m nox [--no-venv] -s`` in the workflow's scripts (up to ``--`` or the line end)."""
    names: set[str] = set()
    for line in text.splitlines():
        if "-m nox" not in line:
            continue
        tokens = line.split("-m nox", 1)[1].split()
        rest = tokens[tokens.index("-s") + 1 :]
        names.update(rest[: rest.index("--")] if "--" in rest else rest)
    return names


def test_nox_sessions_the_workflow_calls_exist() -> None:
    pytest.importorskip("nox", reason="nox is in the test extra")
    called = nox_sessions_called(WORKFLOW.read_text())
    assert called == {"shard", "merge", "gate", "tests", "lint"}
    res = subprocess.run(
        [sys.executable, "-m", "nox", "-f", str(REPO / "noxfile.py"), "-l", "--json", "-s", *sorted(called)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    assert {s["session"] for s in json.loads(res.stdout)} == called
    bad = subprocess.run(
        [sys.executable, "-m", "nox", "-f", str(REPO / "noxfile.py"), "-l", "--json", "-s", "shard", "no-such"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert bad.returncode != 0 and "no-such" in bad.stderr  # the check above can fail


def test_step_commands_parse(workflow: dict[str, Any], tmp_path: Path) -> None:
    """The shard, merge and gate steps run with a stub interpreter; what they would have run must parse."""
    pytest.importorskip("nox", reason="nox is in the test extra")
    sys.path.insert(0, str(REPO))
    try:
        import noxfile
    finally:
        sys.path.remove(str(REPO))
    from conformance.cli import build_parser

    log = tmp_path / "calls.jsonl"
    stub = tmp_path / "stub-python"
    stub.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        "if sys.argv[1:3] != ['-m', 'nox']:\n"  # `python -c ...` in a step script: the real interpreter
        "    os.execv(sys.executable, [sys.executable, *sys.argv[1:]])\n"
        f"open({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
    )
    stub.chmod(0o755)
    env = base_env(tmp_path, str(stub), SHARD="1", COUNT="3", RUN_ARGS="--timeout 120 --case 'gqa_*'")
    for job, sid in (("shard", "shard"), ("merge", "merge"), ("merge", "gate")):
        res = run_step(workflow, job, sid, tmp_path, env)
        assert res.returncode == 0, res.stderr
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert [c[:5] for c in calls] == [["-m", "nox", "--no-venv", "-s", s] for s in ("shard", "merge", "gate")]
    shard_args = calls[0][6:]
    known, run_args = noxfile.shard_parser().parse_known_args(shard_args)
    assert known.shard == "1/3"
    run = build_parser().parse_args(["run", "--shard", known.shard, *run_args])  # exits 2 on a bad flag
    assert (run.suite, run.backend, run.device, run.timeout, run.case) == (
        "smoke",
        ["sdpa-cpu"],
        "cpu",
        120.0,
        ["gqa_*"],
    )
    merge = noxfile.merge_parser().parse_args(calls[1][6:])
    assert (merge.out, merge.report) == ("merged.jsonl", "report") and merge.shards == ["shards/*.jsonl"]
    gate, compare_args = noxfile.gate_parser().parse_known_args(calls[2][6:])
    assert (gate.baseline, gate.new) == ("baseline.jsonl", ["merged.jsonl"])
    build_parser().parse_args(["compare", gate.baseline, *gate.new, *compare_args])


# ------------------------------------------------------------------------------------------ linters


def _broken_copies(tmp_path: Path) -> dict[str, Path]:
    text = WORKFLOW.read_text()
    copies = {
        # a typo in a job key: schema error (and zizmor's strict collection)
        "schema": text.replace(
            "runs-on: ubuntu-latest\n    timeout-minutes: 30", "run-on: ubuntu-latest\n    timeout-minutes: 30"
        ),
        # attacker-controlled text expanded into a shell script: template injection
        "injection": text.replace('--suite "$SUITE"', '--suite "${{ github.event.pull_request.title }}"'),
        # a job that needs a job that does not exist
        "needs": text.replace("needs: [plan, shard]", "needs: [plan, shards]"),
    }
    out = {}
    for name, broken in copies.items():
        assert broken != text, name
        path = tmp_path / name / ".github" / "workflows" / "gpu-conformance.yml"
        path.parent.mkdir(parents=True)
        path.write_text(broken)
        out[name] = path
    return out


LINTERS = {
    "check-jsonschema": (["--builtin-schema", "vendor.github-workflows"], {"schema"}),
    "zizmor": (["--offline", "--strict-collection", "--no-progress"], {"schema", "injection"}),
    "actionlint": ([], {"schema", "injection", "needs"}),
}


@pytest.mark.parametrize("linter", sorted(LINTERS))
def test_linter_accepts_the_workflow_and_rejects_broken_copies(linter: str, tmp_path: Path) -> None:
    exe = shutil.which(linter)
    if exe is None:
        extra = "" if linter == "actionlint" else " (it is in the test extra: pip install -e '.[test]')"
        pytest.skip(f"{linter} is not installed{extra}")
    args, must_reject = LINTERS[linter]

    def lint(path: Path) -> subprocess.CompletedProcess:
        return subprocess.run([exe, *args, str(path)], capture_output=True, text=True, timeout=120, check=False)

    res = lint(WORKFLOW)
    assert res.returncode == 0, res.stdout + res.stderr
    for name, path in _broken_copies(tmp_path).items():
        if name in must_reject:
            assert lint(path).returncode != 0, f"{linter} accepted the {name} breakage"


# ------------------------------------------------------------------------------------------ end to end


@pytest.mark.slow
def test_shards_merge_report_gate_on_cpu(workflow: dict[str, Any], tmp_path: Path) -> None:
    pytest.importorskip("nox", reason="nox is in the test extra")
    shutil.copy(REPO / "noxfile.py", tmp_path / "noxfile.py")
    env = base_env(tmp_path, sys.executable)

    # plan: the matrix of shard indices
    assert run_step(workflow, "plan", "plan", tmp_path, env).returncode == 0
    outputs = dict(line.split("=", 1) for line in (tmp_path / "github_output").read_text().splitlines())
    assert outputs == {"count": "2", "shards": "[0, 1]"}
    assert run_step(workflow, "plan", "plan", tmp_path, {**env, "SHARDS": "0"}).returncode != 0

    # the shard jobs (in parallel, as the matrix runs them); each leaves the file its upload step names
    upload = next(s for s in workflow["jobs"]["shard"]["steps"] if "upload-artifact" in s.get("uses", ""))
    procs = []
    for i in json.loads(outputs["shards"]):
        script = tmp_path / f".step-shard-{i}.sh"
        script.write_text(step(workflow, "shard", "shard")["run"])
        shard_env = {**env, "SHARD": str(i), "COUNT": outputs["count"]}
        procs.append(
            subprocess.Popen(
                ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)],
                cwd=tmp_path,
                env=shard_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    for proc in procs:
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, out
    shard_files = []
    for i in range(2):
        path = upload["with"]["path"].replace("${{ matrix.shard }}", str(i))
        shard_files.append(tmp_path / path.replace("${{ needs.plan.outputs.count }}", outputs["count"]))
    assert all(p.is_file() for p in shard_files)

    # merge + report + summary
    res = run_step(workflow, "merge", "merge", tmp_path, env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert run_step(workflow, "merge", "summary", tmp_path, env).returncode == 0
    summary = (tmp_path / "step_summary.md").read_text()
    assert "2 of 2 shards of suite `smoke`: complete" in summary and "c0ffee" in summary
    assert "# attnconf report" in summary or "sdpa-cpu" in summary
    assert (tmp_path / "report" / "report.html").is_file() and "](error_ratio.png)" not in summary
    merged = tmp_path / "merged.jsonl"
    lines = merged.read_text().splitlines()
    assert len(lines) == 3 and json.loads(lines[0])["env"]["merge"]["shards"] == [0, 1]

    # the gate: the merged run against itself passes (in-process: `attnconf compare`, what the gate runs)
    from conformance.cli import main

    shutil.copy(merged, tmp_path / "baseline.jsonl")
    assert main(["compare", str(tmp_path / "baseline.jsonl"), str(merged), "--out", str(tmp_path / "same.md")]) == 0
    assert "no regression" in (tmp_path / "same.md").read_text()

    # the gate step on a planted regression: one pass turned into a fail -> exit 1, the case in the job summary
    record = json.loads(lines[2])
    assert record["status"] == "pass"
    record.update(status="fail", reason="planted regression")
    merged.write_text("\n".join([*lines[:2], json.dumps(record)]) + "\n")
    res = run_step(workflow, "merge", "gate", tmp_path, env)
    assert res.returncode == 1, res.stdout + res.stderr
    summary = (tmp_path / "step_summary.md").read_text()
    assert "REGRESSED" in summary and f"| {record['case_id']} | pass | fail |" in summary

    # a missing shard: the merge names it and fails (in-process: the CLI the merge step calls)
    assert main(["merge", str(shard_files[0]), "--out", str(tmp_path / "partial.jsonl")]) == 1
