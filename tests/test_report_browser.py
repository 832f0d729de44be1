"""report.html seen in a real browser (headless Chromium): the page renders (a screenshot of
the right size that is not blank), every chart label lies inside its chart, no two labels of a
chart overlap, and nothing makes the page scroll sideways.

The fixture is an H200 tune of bert-base (inference, 9 variants with long names), its graph-break
evidence edited to hold a break found twice at one line and a code span with `>` in it.
`.ci/run` installs Chromium; on CI a missing browser fails the test instead of skipping it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from torchkiln.report.load import load_result
from torchkiln.report.render import html

FIXTURE = Path(__file__).parent / "fixtures" / "tune_bert_base_h200.json"
WIDTH, HEIGHT = 1200, 3000

# Run in the page after layout: each chart's text boxes against the chart's box and each other.
CHECK_JS = """
<script>
window.addEventListener('load', () => {
  const out = {charts: 0, texts: 0, outside: [], overlaps: [],
               scroll_width: document.documentElement.scrollWidth, width: window.innerWidth};
  document.querySelectorAll('div.chart svg').forEach((svg, i) => {
    out.charts += 1;
    const frame = svg.getBoundingClientRect();
    const boxes = [];
    svg.querySelectorAll('text').forEach(t => {
      const b = t.getBoundingClientRect();
      if (!t.textContent.trim() || b.width === 0) return;
      out.texts += 1;
      if (b.left < frame.left - 1 || b.right > frame.right + 1 ||
          b.top < frame.top - 1 || b.bottom > frame.bottom + 1)
        out.outside.push([i, t.textContent]);
      boxes.push([t.textContent, b]);
    });
    for (let a = 0; a < boxes.length; a++)
      for (let c = a + 1; c < boxes.length; c++) {
        const p = boxes[a][1], q = boxes[c][1];
        const w = Math.min(p.right, q.right) - Math.max(p.left, q.left);
        const h = Math.min(p.bottom, q.bottom) - Math.max(p.top, q.top);
        if (w > 1 && h > 1) out.overlaps.push([i, boxes[a][0], boxes[c][0]]);
      }
  });
  const pre = document.createElement('pre');
  pre.id = 'kiln-check';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>
"""


def _browser() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        found = shutil.which(name)
        if found:
            return found
    why = "no Chromium on PATH (.ci/run installs it: apt-get install -y chromium)"
    if os.environ.get("CI") == "true":
        pytest.fail(why)
    pytest.skip(why)


def _run(browser: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",  # as root in CI containers
            "--disable-gpu",
            "--hide-scrollbars",
            f"--window-size={WIDTH},{HEIGHT}",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    pytest.importorskip("matplotlib")
    path = tmp_path_factory.mktemp("report") / "report.html"
    path.write_text(html(load_result(FIXTURE)))
    return path


def test_the_page_renders_in_a_browser_and_is_not_blank(page, tmp_path):
    from PIL import Image, ImageStat

    browser = _browser()
    shot = tmp_path / "shot.png"
    proc = _run(browser, f"--screenshot={shot}", page.as_uri())
    assert shot.exists(), proc.stderr[-2000:]
    with Image.open(shot) as im:
        assert im.size == (WIDTH, HEIGHT)
        gray = im.convert("L")
        assert ImageStat.Stat(gray).stddev[0] > 20  # text and charts, not one colour
        dark = sum(gray.histogram()[:200])
        assert dark > 0.02 * WIDTH * HEIGHT


def test_chart_labels_lie_inside_their_charts_and_do_not_overlap(page, tmp_path):
    browser = _browser()
    checked = tmp_path / "checked.html"
    checked.write_text(page.read_text().replace("</body>", CHECK_JS + "</body>"))
    proc = _run(browser, "--virtual-time-budget=10000", "--dump-dom", checked.as_uri())
    found = re.search(r'<pre id="kiln-check">(.*?)</pre>', proc.stdout, re.S)
    assert found, proc.stderr[-2000:]
    result = json.loads(found[1].replace("&quot;", '"').replace("&amp;", "&"))
    assert result["charts"] >= 5  # step time, compile vs speedup, cumulative, memory, kernels
    assert result["texts"] > 50  # ticks, axis labels, legends, values: drawn as text
    assert result["outside"] == []
    assert result["overlaps"] == []
    assert result["scroll_width"] <= result["width"]  # no sideways scrolling
