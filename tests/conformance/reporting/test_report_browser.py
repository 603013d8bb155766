"""The HTML report in a real headless browser: the verdict on the first screen, the sections in order, the
environment last and folded, Markdown rendered (issue 28).

The report of a small results file (:mod:`tests.conformance.reporting.report_data`, compared with a baseline) is
loaded by Chromium, headless, in a 1280 x 800 window; a script appended to a copy of the page measures it once
the page has loaded and writes the figures into the page, which ``--dump-dom`` prints.  A screenshot of the first
screen is taken too.  Nothing but the browser binary is needed (no driver, no Python package): Debian's
``apt-get install chromium`` (or ``ATTNCONF_CHROMIUM=/path/to/chrome``).  Without one the tests skip, saying so.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from conformance.cli import main
from tests.conformance.reporting.report_data import write_files

WIDTH, HEIGHT = 1280, 800


def _browser() -> str | None:
    given = os.environ.get("ATTNCONF_CHROMIUM")
    if given:
        return given
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


BROWSER = _browser()
pytestmark = pytest.mark.skipif(
    BROWSER is None,
    reason="no headless browser: install Chromium (Debian: apt-get install chromium) or set ATTNCONF_CHROMIUM",
)

#: Appended to a copy of the report: on load, the figures the tests assert, as JSON in <pre id="measured">.
MEASURE = """
<script>
window.addEventListener("load", () => {
  const box = (el) => { if (!el) return null; const r = el.getBoundingClientRect();
    return {top: Math.round(r.top), bottom: Math.round(r.bottom), height: Math.round(r.height)}; };
  const ids = ["verdict", "unexpected", "baseline", "details", "environment"];
  const env = document.getElementById("environment");
  const folded = env ? env.querySelector("details") : null;
  const runTable = env ? env.querySelector("table") : null;
  const nothing = document.querySelector("#verdict .nothing-judged");
  const notes = [...document.querySelectorAll("#details li")];
  const m = {
    viewport: [window.innerWidth, window.innerHeight],
    page_height: document.documentElement.scrollHeight,
    boxes: Object.fromEntries(ids.map((id) => [id, box(document.getElementById(id))])),
    order: [...document.querySelectorAll("body > section")].map((s) => s.id),
    nav: [...document.querySelectorAll("nav.sections a")].map((a) => a.getAttribute("href")),
    dangling: [...document.querySelectorAll("a[href^='#']")].map((a) => a.getAttribute("href"))
      .filter((h) => !document.getElementById(h.slice(1))),
    verdict_text: document.getElementById("verdict").innerText,
    nothing_color: nothing ? getComputedStyle(nothing).color : null,
    env_open: folded ? folded.open : null,
    env_table_visible: runTable ? runTable.checkVisibility() : null,
    notes_with_backticks: notes.filter((li) => li.innerText.includes("`")).map((li) => li.innerText),
    notes_with_code: notes.filter((li) => li.querySelector("code")).length,
    no_graph_note: notes.some((li) => li.innerText.includes("No graph captured on device cpu")),
    repro_in_problems: document.querySelectorAll("#unexpected .problem code").length,
  };
  const pre = document.createElement("pre");
  pre.id = "measured";
  pre.textContent = JSON.stringify(m);
  document.body.appendChild(pre);
});
</script>
"""


def _chromium(*args: str, tmp: Path) -> subprocess.CompletedProcess:
    cmd = [
        str(BROWSER),
        "--headless",
        "--no-sandbox",  # root in a container has no user namespace for the sandbox
        "--disable-gpu",
        "--no-first-run",
        f"--user-data-dir={tmp / 'profile'}",  # one profile per test: runs in parallel do not share one
        f"--window-size={WIDTH},{HEIGHT}",
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, check=False)


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", head[16:24])


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The report of report_data's run against its baseline, measured in the browser; its screenshot's path."""
    f = write_files(tmp_path_factory.mktemp("browser"))
    tmp, new, old, ledgers = f["tmp"], f["new"], f["old"], f["ledgers"]
    args = ["report", str(new), "--baseline", str(old), "--ledger-dir", str(ledgers), "--out", str(tmp / "rep")]
    assert main(args) == 0
    html = (tmp / "rep" / "report.html").read_text(encoding="utf-8")
    probe = tmp / "probe.html"
    probe.write_text(html.replace("</body>", MEASURE + "</body>"), encoding="utf-8")
    res = _chromium("--virtual-time-budget=5000", "--dump-dom", probe.as_uri(), tmp=tmp)
    found = re.search(r'<pre id="measured">(.*?)</pre>', res.stdout, re.S)
    assert found, f"the browser printed no measurements (exit {res.returncode}): {res.stderr[-2000:]}"
    measured = json.loads(found.group(1).replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">"))
    shot = tmp / "first-screen.png"
    res = _chromium(f"--screenshot={shot}", (tmp / "rep" / "report.html").as_uri(), tmp=tmp)
    assert shot.is_file(), f"no screenshot (exit {res.returncode}): {res.stderr[-2000:]}"
    return {"m": measured, "shot": shot}


def test_the_verdict_fills_the_first_screen_and_the_sections_follow_in_order(page: dict) -> None:
    m = page["m"]
    width, height = m["viewport"]
    assert width == WIDTH and 0 < height <= HEIGHT, m["viewport"]
    boxes = m["boxes"]
    assert boxes["verdict"]["top"] < 200 and boxes["verdict"]["bottom"] <= height, boxes["verdict"]  # all of it
    assert m["order"] == ["verdict", "unexpected", "baseline", "details", "environment"]
    tops = [boxes[s]["top"] for s in m["order"]]
    assert tops == sorted(tops) and len(set(tops)) == len(tops), boxes
    assert boxes["environment"]["top"] > boxes["unexpected"]["bottom"]  # the environment after the problems
    assert boxes["unexpected"]["top"] < height  # the problems start on the first screen too
    assert m["page_height"] > height  # a page longer than the screen: the order above is what a reader meets


def test_the_verdict_has_a_line_per_backend_and_nothing_judged_in_red(page: dict) -> None:
    m = page["m"]
    text = m["verdict_text"]
    assert "kern 1.0: 10 judged, 3 passed, 6 unexpected, 1 known; 1 unsupported" in text
    assert "other 1.0: 12 judged, 12 passed, 0 unexpected, 0 known" in text
    assert "refuser 1.0: nothing judged: unsupported: refuses every case: planted" in text
    assert "CPU backends only" in text and "no CUDA graph was captured" in text
    assert m["nothing_color"] == "rgb(198, 40, 40)"
    assert m["repro_in_problems"] == 6  # every unexpected problem with its repro line


def test_the_environment_is_folded_and_the_links_reach_their_sections(page: dict) -> None:
    m = page["m"]
    assert m["env_open"] is False and m["env_table_visible"] is False  # folded: the run's table is not shown
    assert m["boxes"]["environment"]["height"] < 120, m["boxes"]["environment"]  # a heading and a summary line
    assert m["nav"][:5] == ["#verdict", "#unexpected", "#baseline", "#details", "#environment"]
    assert m["dangling"] == []


def test_markdown_in_the_notes_is_rendered(page: dict) -> None:
    m = page["m"]
    assert m["notes_with_backticks"] == []
    assert m["notes_with_code"] >= 1 and m["no_graph_note"]


def test_the_first_screen_screenshot(page: dict) -> None:
    assert _png_size(page["shot"]) == (WIDTH, HEIGHT)
