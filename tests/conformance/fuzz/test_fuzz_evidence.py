"""A fuzz campaign needs evidence too (issue 29): a backend that judged no drawn case exits 4 (unless
--allow-unjudged), and a campaign whose every draw is refused stops instead of drawing forever."""

from __future__ import annotations

from pathlib import Path

from conformance.cli import main
from conformance.fuzz import campaign

FAKES = "tests.conformance.fakes"


def fuzz(tmp_path: Path, *args: str) -> list[str]:
    return ["fuzz", "--device", "cpu", "--max-tokens", "64", "--max-heads", "4", "--no-progress", "--timeout", "60",
            "--out", str(tmp_path / "f.jsonl"), *args]  # fmt: skip


def test_a_backend_for_another_device_is_refused_before_any_draw(tmp_path: Path, capsys) -> None:
    """Before: `--budget 5` never ended (every draw refused, no case ever run); a time budget exited 0.  Now the
    backend is refused up front (exit 2), as `run` refuses it."""
    assert main(fuzz(tmp_path, "--backend", f"{FAKES}:CudaOnlyBackend", "--budget", "5")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "CudaOnlyBackend runs on cuda only, not on --device cpu" in err[0], err


def test_a_backend_not_installed_here_judges_nothing_and_exits_4(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setattr(campaign, "MAX_IDLE_DRAWS", 40)
    assert main(fuzz(tmp_path, "--backend", f"{FAKES}:NotInstalledBackend", "--budget", "5")) == 4
    err = capsys.readouterr().err
    assert "UNJUDGED: fake-not-installed judged none of its" in err and "not available here: planted" in err
    assert main(fuzz(tmp_path, "--backend", f"{FAKES}:NotInstalledBackend", "--budget", "5", "--allow-unjudged")) == 0


def test_a_backend_refusing_every_drawn_case_beside_one_that_judges_exits_4(tmp_path: Path, capsys) -> None:
    args = fuzz(tmp_path, "--backend", f"{FAKES}:ExactBackend", "--backend", f"{FAKES}:RefusesEverythingBackend")
    assert main([*args, "--budget", "2"]) == 4
    err = capsys.readouterr().err
    assert "UNJUDGED: fake-refuses-everything judged none of its 2 drawn case(s): unsupported: planted refusal" in err
    assert "fake-exact judged" not in err


def test_draws_all_refused_by_declarations_stop_after_max_idle_draws(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setattr(campaign, "MAX_IDLE_DRAWS", 40)
    assert main(fuzz(tmp_path, "--backend", f"{FAKES}:DeclaresNothingBackend", "--budget", "3")) == 4
    err = capsys.readouterr().err
    assert "stopped drawing before the budget was spent: 40 draws in a row ran no case" in err
    assert "0 cases run from 40 draws" in err
