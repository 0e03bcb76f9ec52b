"""The HTML report as a person sees it: opened in headless Chromium (Debian's package, installed by
``./install.sh --with-tests``) at 1,300 x 900 pixels, every figure loads and nothing runs off the page."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from testbed.plan.build import plan_experiment
from testbed.results.html_report import build_report
from testbed.results.page import HTML_COLUMNS_PER_TABLE, column_groups
from testbed.results.runs import run_simulation

REPO = Path(__file__).resolve().parents[1]
WIDTH = 1300

#: Run in the page once it has loaded: the viewport, the page's width, each image (loaded, right
#: edge) and each table's right edge, written into the DOM that --dump-dom prints.
PROBE = """window.addEventListener('load', () => {
  const box = e => Math.round(e.getBoundingClientRect().right);
  const out = {viewport: window.innerWidth, scrollWidth: document.documentElement.scrollWidth,
    imgs: [...document.images].map(i => ({alt: i.alt, ok: i.complete && i.naturalWidth > 0, right: box(i)})),
    tables: [...document.querySelectorAll('table')].map(t => box(t))};
  const pre = document.createElement('pre'); pre.id = 'probe'; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});"""


def _chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.fail("headless Chromium is missing: it is Debian's 'chromium' package, installed by "
                    "'./install.sh --with-tests' (README's test command)")
    return exe


def _probe(html: Path) -> dict:
    page = html.with_name("probed.html")
    page.write_text(html.read_text().replace("</head>", f"<script>{PROBE}</script></head>", 1))
    out = subprocess.run([_chromium(), "--headless", "--no-sandbox", "--disable-gpu", f"--window-size={WIDTH},900",
                          "--virtual-time-budget=5000", "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=120, check=False)
    found = re.search(r'<pre id="probe">([^<]*)</pre>', out.stdout)
    assert found, f"Chromium printed no probe result (exit {out.returncode}): {out.stderr[-2000:]}"
    return json.loads(found.group(1).replace("&quot;", '"'))


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    """The report of two simulated runs (the default experiment and the hotspot scenario, 8 s each)."""
    tmp = tmp_path_factory.mktemp("browser")
    runs = [run_simulation(plan_experiment(REPO / "experiments" / name), runs_dir=tmp / "runs", duration_s=8.0,
                           quiet=True)[0] for name in ("default.yaml", "scenario-hotspot.yaml")]
    return build_report(runs, tmp / "report")["html"]


def test_the_report_renders_every_figure_within_the_page(report):
    seen = _probe(report)
    assert seen["viewport"] == WIDTH
    assert len(seen["imgs"]) >= 4, seen  # CDF, breakdown, success and policy over time at least
    assert [i["alt"] for i in seen["imgs"] if not i["ok"]] == []
    assert seen["scrollWidth"] <= seen["viewport"], f"the page is {seen['scrollWidth']} px wide: {seen}"
    assert max(seen["tables"] + [i["right"] for i in seen["imgs"]]) <= seen["viewport"], seen


def test_a_wide_table_is_split_with_its_key_column_in_each_part():
    cols = ["run"] + [f"c{i}" for i in range(2 * HTML_COLUMNS_PER_TABLE + 1)]
    table = pd.DataFrame([list(range(len(cols)))], columns=cols)
    parts = column_groups(table)
    assert len(parts) == 3 and all(p.columns[0] == "run" for p in parts)
    assert [c for p in parts for c in p.columns[1:]] == cols[1:]
    assert column_groups(table[cols[:5]])[0].equals(table[cols[:5]])
