"""``nox -s gate`` fails closed: a refusal of ``attnconf compare`` (exit 2) fails the session, the baseline's
families the new run was not asked for are outside the comparison (and said so), and ``--all-families``
brings them back in.  Relative paths are the user's (read and written where nox was started, not in the
noxfile's directory), and nox's uv notice is not printed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conformance.reporting.test_fail_closed import full, header, write

REPO = Path(__file__).resolve().parents[2]


def _noxfile():
    pytest.importorskip("nox", reason="nox is in the test extra")
    sys.path.insert(0, str(REPO))
    try:
        import noxfile

        return noxfile
    finally:
        sys.path.remove(str(REPO))


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


def test_relative_paths_are_read_and_written_where_nox_was_started(tmp_path: Path) -> None:
    """Before: nox runs sessions in the noxfile's directory, so ``nox -f REPO/noxfile.py -s gate -- old.jsonl
    new.jsonl --out gate.md`` from another directory looked for REPO/old.jsonl (compare refused: no such file) and
    would have written REPO/gate.md.  The attnconf commands now run in ``session.invoked_from``."""
    pytest.importorskip("nox", reason="nox is in the test extra")
    write(tmp_path / "baseline.jsonl", header(), *full())
    write(tmp_path / "new.jsonl", header(), *full())
    assert not (REPO / "baseline.jsonl").exists() and not (REPO / "gate-relative.md").exists()
    res = gate(tmp_path, "baseline.jsonl", "new.jsonl", "--out", "gate-relative.md")
    output = res.stdout + res.stderr
    assert res.returncode == 0, output
    assert "no regression" in (tmp_path / "gate-relative.md").read_text()
    assert not (REPO / "gate-relative.md").exists()
    assert f"attnconf runs in {tmp_path}, where nox was started" in output
    assert _noxfile().UV_NOTICE not in output  # nox's "uv binary not found." notice (uv is not used)


def test_the_attnconf_commands_import_this_checkout_from_any_directory() -> None:
    """``python -m conformance`` run outside the checkout finds it first on PYTHONPATH, then what was set."""
    env = _noxfile().attnconf_env
    assert env({}, "/repo") == {"PYTHONPATH": "/repo"}
    assert env({"PYTHONPATH": "/a" + os.pathsep + "/b"}, "/repo") == {
        "PYTHONPATH": os.pathsep.join(["/repo", "/a", "/b"])
    }
    assert env({"PYTHONPATH": ""}, "/repo") == {"PYTHONPATH": "/repo"}
    assert _noxfile().CHECKOUT == str(REPO)


def test_the_uv_notice_filter_drops_that_notice_only() -> None:
    import logging

    keep = _noxfile().not_uv_notice

    def record(msg: str) -> logging.LogRecord:
        return logging.LogRecord("nox", logging.INFO, __file__, 1, msg, None, None)

    assert not keep(record("uv binary not found."))
    assert keep(record("Running session gate")) and keep(record("uv binary not found. (and more)"))
