"""report.html in a real browser: headless Chromium opens the built-in default model's report (and one with
apply's results) at 1280 and 1920 px, and the page's own script is exercised; nothing may overflow horizontally
and the key sections must be there.

Needs a Chromium binary: Debian's ``chromium`` (``apt-get install chromium``), Google Chrome, or Playwright's
(``playwright install chromium``); skipped with that reason when none is found. The browser is driven from its
command line (``--dump-dom`` after a measuring script ran in the page), so no Python package is needed.
"""

from __future__ import annotations

import html as html_lib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from fusion_advisor.report import write as report
from tests.test_report_views import layered, plan_doc

WIDTHS = (1280, 1920)

#: Sections a reader needs: the first screen's parts, the pictures, the table, apply's results.
KEY_SECTIONS = ("verdict", "breakdown", "roofline", "chains", "apply", "breaks", "warnings", "run")
KEY_PARTS = ("do", "buys", "opportunities", "left-alone", "chains-table")

#: Runs in the page after its own script: measures overflow, then uses the filters and the group toggle as a
#: reader would, and writes what it saw into <pre id="fa-measure"> for the test to read from the dumped DOM.
MEASURE = r"""<script>
(function () {
  var w = window.innerWidth, out = {viewport: w, scrollWidth: document.documentElement.scrollWidth, wide: []};
  document.querySelectorAll("body *").forEach(function (el) {
    var r = el.getBoundingClientRect();
    if (r.width === 0 || r.right <= w + 1) return;
    for (var p = el.parentElement; p; p = p.parentElement) {  // inside a clipping box that itself fits: fine
      var o = getComputedStyle(p).overflowX;
      if ((o === "hidden" || o === "auto" || o === "scroll") && p.getBoundingClientRect().right <= w + 1) return;
    }
    out.wide.push(el.tagName + (el.id ? "#" + el.id : "") + "." + el.className + " right=" + Math.round(r.right));
  });
  out.wide = out.wide.slice(0, 10);
  out.ids = Array.prototype.map.call(document.querySelectorAll("[id]"), function (e) { return e.id; });
  out.first_screen = document.getElementById("verdict").getBoundingClientRect().top;
  var bar = document.querySelector("[data-filter-for='chains-table']");
  out.count_before = bar.querySelector(".count").textContent;
  var rows = document.querySelectorAll("#chains-table tbody.row");
  var shown = function (b) { return b.style.display !== "none"; };
  var visible = function () { return Array.prototype.filter.call(rows, shown).length; };
  var sel = bar.querySelector("select[data-filter='route']");
  sel.value = "triton"; sel.dispatchEvent(new Event("change"));
  out.triton_rows = visible();
  out.triton_routes = Array.prototype.filter.call(rows, function (b) { return b.style.display !== "none"; })
    .map(function (b) { return b.getAttribute("data-route"); });
  sel.value = ""; sel.dispatchEvent(new Event("change"));
  out.all_rows = visible();
  var member = document.querySelector("#chains-table tr.member");
  out.member_hidden = member ? getComputedStyle(member).display === "none" : null;
  var ids = document.querySelector("#chains-table tbody.has-members td.ids");
  if (ids) ids.click();
  out.member_shown = member ? getComputedStyle(member).display !== "none" : null;
  var th = document.querySelector("#chains-table th[data-key='eager']");
  th.click();
  out.sorted_eager = Array.prototype.map.call(document.querySelectorAll("#chains-table tbody.row"),
    function (b) { return parseFloat(b.getAttribute("data-eager")); });
  var pre = document.createElement("pre");
  pre.id = "fa-measure";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script>"""


def find_browser() -> str | None:
    """A Chromium-family binary: $FA_CHROMIUM, Debian's chromium, Chrome, or Playwright's download."""
    for name in (os.environ.get("FA_CHROMIUM", ""), "chromium", "chromium-browser", "google-chrome",
                 "google-chrome-stable"):
        if name and shutil.which(name):
            return shutil.which(name)
    home = Path(os.environ.get("PLAYWRIGHT_BROWSERS_PATH", Path.home() / ".cache" / "ms-playwright"))
    found = sorted(home.glob("chromium-*/chrome-linux*/chrome")) if home.is_dir() else []
    return str(found[-1]) if found else None


BROWSER = find_browser()
pytestmark = pytest.mark.skipif(
    BROWSER is None, reason="no headless Chromium found (apt-get install chromium, or playwright install chromium; "
                            "FA_CHROMIUM=/path/to/chrome): the in-browser check of report.html is skipped")


def render_in_browser(page: Path, width: int, tmp: Path) -> dict:
    """Open ``page`` at ``width`` px in headless Chromium with :data:`MEASURE` appended; return what it saw."""
    probe = tmp / f"probe-{width}.html"
    probe.write_text(page.read_text(encoding="utf-8").replace("</body>", MEASURE + "</body>"), encoding="utf-8")
    cmd = [BROWSER, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
           f"--user-data-dir={tmp / 'profile'}", f"--window-size={width},1000", "--virtual-time-budget=5000",
           "--dump-dom", probe.as_uri()]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    m = re.search(r'<pre id="fa-measure">(.*?)</pre>', run.stdout, re.S)
    assert m, f"the page's measuring script did not run (exit {run.returncode}): {run.stderr[-2000:]}"
    return json.loads(html_lib.unescape(m.group(1)))


def with_profile(a):
    """``a`` with a measurement for every chain (the widest chains table: five measured columns more)."""
    from fusion_advisor.analyze.records import ChainMeasurement, Profile

    chains = {c.id: ChainMeasurement(c.id, 100.0 + i, 60.0, 40.0 + i, 3.0, 1234.5, 12.345, 56.7, "memory", 90.0,
                                     0.9, False) for i, c in enumerate(a.chains)}
    a.profile = Profile(device="cuda", device_name="NVIDIA H200 <test>", runs=3, warmup_runs=2, total_us=5000.0,
                        attributed_us=4500.0, unattributed_us=500.0, wall_us=6000.0, eager_wall_us=5200.0,
                        setup="3 runs after 2 warm-up runs", compared="the roofline's eager time in the model",
                        chains=chains, notes=["a note"])
    return a


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> dict[str, Path]:
    """The built-in default model's report as `fusion-advisor analyze` writes it, a report with apply's results
    (a plan in the folder) and repeated layers, and one with a profile (the widest chains table)."""
    from fusion_advisor.analyze.pipeline import analyze

    root = tmp_path_factory.mktemp("browser")
    default = report.write_report(analyze(None, device="meta"), root / "default")["html"]
    a = layered(4)
    (root / "applied").mkdir()
    (root / "applied" / "plan.yaml").write_text("# fusion-advisor plan: test\n" + yaml.safe_dump(plan_doc(a)))
    applied = report.write_report(a, root / "applied")["html"]
    profiled = report.write_report(with_profile(layered(4)), root / "profiled")["html"]
    return {"default": default, "applied": applied, "profiled": profiled}


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("which", ["default", "applied", "profiled"])
def test_report_fits_and_works_in_a_browser(pages, which, width, tmp_path):
    seen = render_in_browser(pages[which], width, tmp_path)
    assert seen["viewport"] == width
    # nothing overflows horizontally: no page scrollbar, no element past the right edge
    assert seen["scrollWidth"] <= width, seen
    assert seen["wide"] == [], seen["wide"]
    # the key sections are there, the first screen at the top
    for part in KEY_SECTIONS + KEY_PARTS:
        assert part in seen["ids"], part
    assert seen["first_screen"] < 200
    # the page's script ran: the count is filled, the route filter shows only triton rows, the group toggle opens
    # a group's per-layer rows, a header click sorts
    assert seen["count_before"].startswith("showing")
    assert seen["triton_rows"] >= 1 and set(seen["triton_routes"]) == {"triton"}
    assert seen["all_rows"] > seen["triton_rows"]
    if seen["member_hidden"] is not None:
        assert seen["member_hidden"] is True and seen["member_shown"] is True
    values = [v for v in seen["sorted_eager"] if v is not None]  # NaN (no estimate) serialises as null, sorted last
    assert seen["sorted_eager"][len(values):] == [None] * (len(seen["sorted_eager"]) - len(values))
    assert values == sorted(values, reverse=True)


def test_diff_page_fits_in_a_browser(tmp_path):
    # diff.html shares the report's CSS and script: it must fit as well
    from fusion_advisor.report import diff as D
    from tests.test_diff import _b_side

    report.write_report(layered(4), tmp_path / "A")
    report.write_report(_b_side(), tmp_path / "B")
    page = D.write_diff(D.diff_folders(tmp_path / "A", tmp_path / "B"), tmp_path / "d")["html"]
    probe = (MEASURE.split("  out.first_screen")[0] + 'var pre = document.createElement("pre"); '
             'pre.id = "fa-measure"; pre.textContent = JSON.stringify(out); document.body.appendChild(pre); })();'
             "</script>")
    for width in WIDTHS:
        text = page.read_text(encoding="utf-8").replace("</body>", probe + "</body>")
        (tmp_path / "p.html").write_text(text, encoding="utf-8")
        cmd = [BROWSER, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
               f"--user-data-dir={tmp_path / 'profile'}", f"--window-size={width},1000",
               "--virtual-time-budget=5000", "--dump-dom", (tmp_path / "p.html").as_uri()]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120).stdout
        seen = json.loads(html_lib.unescape(re.search(r'<pre id="fa-measure">(.*?)</pre>', out, re.S).group(1)))
        assert seen["scrollWidth"] <= width and seen["wide"] == [], seen
        assert {"runs", "changes", "diff-table"} <= set(seen["ids"])
