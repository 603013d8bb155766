"""The documentation site builds as ``nox -s docs`` builds it (``mkdocs build --strict``: a broken link or anchor,
a page missing from the nav, a docstring mkdocstrings cannot read fails), its CLI reference is the parser's
``--help`` of every command, its API reference has every public name of ``attnref``; README.md stays a short
entry page that leads to every guide; ``reports/README.md`` has a row for every committed data file.

The build takes about 10 s on an idle 2-core machine (most of it importing torch for the parser and the
docstrings); mkdocs and its plugins are in the ``test`` extra (``docs``), so the README's test command builds it.
"""

from __future__ import annotations

import fnmatch
import html
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _hook():
    spec = importlib.util.spec_from_file_location("cli_reference", REPO / "docs" / "_hooks" / "cli_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _text(page: Path) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", page.read_text(encoding="utf-8")))


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    res = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        check=False,
    )
    assert res.returncode == 0, (
        "mkdocs build --strict failed (mkdocs, mkdocs-material and mkdocstrings are in the test extra: "
        f"pip install -e '.[test]'):\n{res.stdout[-2000:]}\n{res.stderr[-6000:]}"
    )
    return out


def test_the_site_builds_with_warnings_as_errors(site: Path) -> None:
    for page in (
        "index.html",
        "getting-started/index.html",
        "results/index.html",
        "guides/compare-versions/index.html",
    ):
        assert (site / page).is_file(), page


def test_the_cli_reference_is_generated_from_the_parser(site: Path) -> None:
    from conformance.cli import build_parser

    text = _text(site / "reference" / "cli" / "index.html")
    commands = list(_hook().subcommands(build_parser(), ("attnconf",)))
    assert {" ".join(path) for path, _ in commands} >= {"attnconf run", "attnconf compare", "attnconf ledger audit"}
    for path, parser in commands:
        assert f"usage: {' '.join(path)}" in text, path
        for action in parser._actions:
            for option in action.option_strings:
                assert option in text, (path, option)


def test_a_hand_written_cli_page_is_refused(tmp_path: Path) -> None:
    from mkdocs.exceptions import PluginError
    from mkdocs.structure.files import File, Files

    page = File("reference/cli.md", src_dir=str(tmp_path), dest_dir=str(tmp_path / "site"), use_directory_urls=True)
    with pytest.raises(PluginError, match="generated from the parser"):
        _hook().on_files(Files([page]), config=None)


def test_the_api_reference_has_every_public_name_of_attnref(site: Path) -> None:
    import attnref

    page = (site / "reference" / "attnref" / "index.html").read_text(encoding="utf-8")
    missing = [name for name in attnref.__all__ if f'id="attnref.{name}"' not in page]
    assert not missing, missing


def test_the_readme_is_short_and_leads_to_every_page() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 150
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)
    local = [link for link in links if "://" not in link]
    assert [link for link in local if not (REPO / link).exists()] == []
    pages = sorted(str(p.relative_to(REPO)) for d in ("guides", "concepts") for p in (REPO / "docs" / d).glob("*.md"))
    assert pages and [p for p in pages if p not in local] == []
    assert "reports/README.md" in local and "docs/getting-started.md" in local


def index_patterns(text: str) -> list[str]:
    """The backticked paths of the first column of the ``## Index`` table of reports/README.md."""
    section = text.split("\n## Index\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| folder")]
    return [p for row in rows for p in re.findall(r"`([^`]+)`", row.split(" | ")[0])]


def test_the_results_index_has_a_row_for_every_committed_data_file() -> None:
    reports = REPO / "reports"
    patterns = index_patterns((reports / "README.md").read_text(encoding="utf-8"))
    data = [
        str(p.relative_to(reports))
        for p in sorted(reports.rglob("*"))
        if p.is_file()
        and p.name != "README.md"
        and p.suffix not in (".png", ".log")
        and p.name not in ("report.md", "report.html", "report.html.gz")
    ]
    assert len(data) > 40
    assert [f for f in data if not any(fnmatch.fnmatch(f, pat) for pat in patterns)] == []
    assert "h100-2026-11-24/default-h100.jsonl.gz" in patterns  # the CI gate's baseline
