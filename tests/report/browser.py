"""Open an npukit HTML report in headless Chromium (Debian's ``chromium``) at a given width and read back what the
browser laid out: whether the verdict is the first thing under the title, whether every figure drew, and whether any
table is wider than its card (a horizontal scroll bar). A screenshot is kept for a person to look at."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

# Run in the page after layout; its findings go into the DOM that --dump-dom prints.
_PROBE = """
<script>
(function () {
  const main = document.querySelector("main");
  const kids = main ? Array.from(main.children) : [];
  const afterHeader = kids.length > 1 && kids[0].tagName === "HEADER" ? kids[1] : null;
  const figures = Array.from(document.querySelectorAll("figure")).map(function (f) {
    const svg = f.querySelector("svg");
    const box = svg ? svg.getBoundingClientRect() : null;
    const marks = svg ? svg.querySelectorAll("circle, rect, path, polyline, line").length : 0;
    const title = svg && svg.querySelector("title") ? svg.querySelector("title").textContent : "";
    return {title: title, width: box ? box.width : 0, height: box ? box.height : 0, marks: marks,
            error: f.querySelector(".error") ? f.querySelector(".error").textContent : ""};
  });
  const tables = Array.from(document.querySelectorAll("section.card")).map(function (card) {
    const scroll = card.querySelector(".scroll");
    const title = card.querySelector("h3") ? card.querySelector("h3").textContent : "";
    const table = card.querySelector("table");
    return {title: title, scroll_width: scroll ? scroll.scrollWidth : (table ? table.scrollWidth : 0),
            client_width: scroll ? scroll.clientWidth : card.clientWidth,
            card_right: card.getBoundingClientRect().right};
  });
  const out = {verdict_first: !!(afterHeader && afterHeader.classList.contains("verdict")),
               after_header: afterHeader ? afterHeader.tagName + "." + afterHeader.className : "",
               viewport: window.innerWidth, page_width: document.documentElement.scrollWidth,
               figures: figures, tables: tables};
  const pre = document.createElement("pre");
  pre.id = "npukit-browser-check";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script>
"""


def chromium() -> str | None:
    """The headless browser's path (``NPUKIT_CHROMIUM`` or chromium on PATH), None where there is none."""
    named = os.environ.get("NPUKIT_CHROMIUM")
    return named if named and Path(named).exists() else shutil.which("chromium") or shutil.which("chromium-browser")


def _run(browser: str, args: list[str], url: str) -> str:
    base = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--mute-audio",
            "--no-first-run", "--disable-dev-shm-usage"]
    done = subprocess.run(base + args + [url], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"chromium exited {done.returncode}: {done.stderr.strip().splitlines()[-1:]}")
    return done.stdout


def inspect_report(html_path: Path, *, width: int = 1280, height: int = 2000,
                   screenshot: Path | None = None) -> dict:
    """What Chromium laid out for the report at ``html_path`` in a ``width`` x ``height`` window; a screenshot of
    the report as it is goes to ``screenshot`` when given."""
    browser = chromium()
    if browser is None:
        raise RuntimeError("no chromium on PATH")
    text = html_path.read_text(encoding="utf-8")
    if "</body>" not in text:
        raise ValueError(f"{html_path} has no </body>")
    with tempfile.TemporaryDirectory(prefix="npukit-browser-") as tmp:
        probed = Path(tmp) / "probe.html"
        probed.write_text(text.replace("</body>", _PROBE + "</body>", 1), encoding="utf-8")
        dom = _run(browser, [f"--window-size={width},{height}", "--dump-dom"], probed.as_uri())
    found = re.search(r'<pre id="npukit-browser-check">(.*?)</pre>', dom, re.S)
    if found is None:
        raise RuntimeError("the probe did not run (no result in the DOM Chromium printed)")
    import html

    result = json.loads(html.unescape(found.group(1)))
    if screenshot is not None:
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        _run(browser, [f"--window-size={width},{height}", f"--screenshot={screenshot}"], html_path.as_uri())
        result["screenshot"] = str(screenshot)
    return result


def layout_problems(result: dict, *, verdict: bool = True) -> list[str]:
    """One line per thing a reader would see wrong: the verdict not first, a figure not drawn, a table wider than
    its card, the page wider than the window."""
    problems = []
    if verdict and not result["verdict_first"]:
        problems.append(f"the verdict is not the first thing under the title (found {result['after_header']})")
    for f in result["figures"]:
        if f["error"] or f["width"] < 100 or f["height"] < 50 or f["marks"] < 3:
            problems.append(f"figure {f['title']!r} did not draw: {f}")
    for t in result["tables"]:
        if t["scroll_width"] > t["client_width"] + 1:
            problems.append(f"table {t['title'][:80]!r} is {t['scroll_width']} px wide in a {t['client_width']} px "
                            "card (it scrolls sideways)")
    if result["page_width"] > result["viewport"] + 1:
        problems.append(f"the page is {result['page_width']} px wide in a {result['viewport']} px window")
    return problems
