"""Screenshots of a report.html in headless Chromium, as committed in this folder.

    python reports/examples/screenshots.py reports/examples/default-h200-static/report.html

writes, beside the report: ``first-screen-1440.png`` (what a reader sees on opening it at 1440 x 900 px) and
``full-1280.png`` / ``full-1920.png`` (the whole page at 1280 and 1920 px wide). Needs Debian's ``chromium``
(or ``FA_CHROMIUM=/path/to/chrome``); the page's height is measured in the browser first.
"""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HEIGHT = """<script>document.body.insertAdjacentHTML('beforeend', '<pre id="fa-height">' +
document.documentElement.scrollHeight + '</pre>');</script>"""


def chromium() -> str:
    exe = os.environ.get("FA_CHROMIUM") or shutil.which("chromium") or shutil.which("google-chrome")
    if not exe:
        sys.exit("no chromium found: apt-get install chromium, or set FA_CHROMIUM")
    return exe


def run(args: list[str], profile: str) -> str:
    cmd = [chromium(), "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
           f"--user-data-dir={profile}", "--virtual-time-budget=5000", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, check=True).stdout


def page_height(page: Path, width: int, profile: str) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / "probe.html"
        probe.write_text(page.read_text(encoding="utf-8").replace("</body>", HEIGHT + "</body>"), encoding="utf-8")
        out = run([f"--window-size={width},1000", "--dump-dom", probe.as_uri()], profile)
    return int(html.unescape(re.search(r'<pre id="fa-height">(\d+)</pre>', out).group(1)))


def main(report_html: str) -> None:
    page = Path(report_html).resolve()
    with tempfile.TemporaryDirectory() as profile:
        shots = [("first-screen-1440.png", 1440, 900)]
        shots += [(f"full-{w}.png", w, page_height(page, w, profile)) for w in (1280, 1920)]
        for name, width, height in shots:
            run([f"--window-size={width},{height}", f"--screenshot={page.parent / name}", page.as_uri()], profile)
            shrink(page.parent / name)
            print(f"{page.parent / name}: {width} x {height}")


def shrink(path: Path) -> None:
    """256 colours are plenty for a report page: a quarter of the bytes (needs Pillow; skipped without it)."""
    try:
        from PIL import Image
    except ImportError:
        return
    with Image.open(path) as im:
        small = im.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    small.save(path, optimize=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "reports/examples/default-h200-static/report.html")
