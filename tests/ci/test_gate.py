"""``nox -s gate`` fails closed: a refusal of ``attnconf compare`` (exit 2) fails the session, the baseline's
families the new run was not asked for are outside the comparison (and said so), and ``--all-families``
brings them back in."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conformance.reporting.test_fail_closed import full, header, write

REPO = Path(__file__).resolve().parents[2]


def gate(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOX")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "nox", "--no-venv", "-f", str(REPO / "noxfile.py"), "-s", "gate", "--", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_gate_scopes_to_the_new_runs_families_and_fails_on_a_refusal(tmp_path: Path) -> None:
    pytest.importorskip("nox", reason="nox is in the test extra")
    baseline = write(tmp_path / "baseline.jsonl", header(), *full())  # families kern and other
    kern = [r for r in full() if r.family == "kern"]
    new = write(tmp_path / "new.jsonl", header(families=("kern",)), *kern)
    res = gate(tmp_path, str(baseline), str(new), "--out", str(tmp_path / "gate.md"))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "gate: the backend families the new run was asked for" in res.stderr
    assert "Outside the comparison (--only-new-families" in (tmp_path / "gate.md").read_text()

    res = gate(tmp_path, str(baseline), str(new), "--all-families", "--out", str(tmp_path / "gate.md"))
    output = res.stdout + res.stderr  # nox passes the command's output on
    assert res.returncode != 0 and "refused: " in output and "lacks 3 of the 6" in output
    assert "REFUSED" in (tmp_path / "gate.md").read_text()


def test_gate_fails_when_the_new_run_judged_nothing(tmp_path: Path) -> None:
    """A new run on a runner without the kernel: every pair unsupported in NEW, and in the baseline too (the
    baseline was made there as well) -> attnconf compare exits 4 and the session fails; --allow-unjudged
    accepts it."""
    pytest.importorskip("nox", reason="nox is in the test extra")
    import dataclasses

    from conformance.records import Status

    refused = [dataclasses.replace(r, status=Status.UNSUPPORTED, stats=None, reason="not installed") for r in full()]
    baseline = write(tmp_path / "baseline.jsonl", header(), *refused)
    new = write(tmp_path / "new.jsonl", header(), *refused)
    res = gate(tmp_path, str(baseline), str(new), "--out", str(tmp_path / "gate.md"))
    output = res.stdout + res.stderr
    assert res.returncode != 0 and "nothing judged: family kern" in output and "exit code 4" in output, output
    assert "NOTHING JUDGED" in (tmp_path / "gate.md").read_text()
    res = gate(tmp_path, str(baseline), str(new), "--allow-unjudged")
    assert res.returncode == 0, res.stdout + res.stderr
