"""Executed tutorials, rendered as a reader sees them: every figure must draw in an HTML export,
and nothing may have been printed to stderr (a stray warning shows in red).

`make test` runs the tutorials under nbmake; conftest.py keeps each executed copy in
test-output/notebooks/ and, once the notebook passed, calls `check_rendered`: nbconvert's HTML
export, opened in Debian's chromium (Playwright) with every network request refused, must draw as
many plotly figures as the notebook has figure outputs. A full-page screenshot of each rendered
tutorial goes to test-output/rendered/.
"""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXECUTED = ROOT / "test-output" / "notebooks"
SHOTS = ROOT / "test-output" / "rendered"
CHROMIUM = "/usr/bin/chromium"
PLOTLY = "application/vnd.plotly.v1+json"


def figure_outputs(nb: dict) -> list[str]:
    """The title of each plotly figure the notebook's outputs hold."""
    titles = []
    for cell in nb["cells"]:
        for out in cell.get("outputs", []):
            fig = out.get("data", {}).get(PLOTLY)
            if fig is not None:
                title = fig.get("layout", {}).get("title", "")
                titles.append(title.get("text", "") if isinstance(title, dict) else str(title))
    return titles


def check_rendered(executed: Path) -> tuple[list[str], list[str]]:
    """(the figures the notebook holds, the figures its HTML export drew); raises AssertionError if
    one did not draw."""
    import nbformat
    from nbconvert import HTMLExporter
    from playwright.sync_api import sync_playwright

    nb = json.loads(executed.read_text())
    stray = [f"cell {i}: {''.join(o['text'])[:200]!r}" for i, cell in enumerate(nb["cells"])
             for o in cell.get("outputs", []) if o.get("output_type") == "stream" and o.get("name") == "stderr"]
    assert not stray, f"{executed.name} printed to stderr (a reader sees it in red): {stray}"
    wanted = figure_outputs(nb)
    html, _ = HTMLExporter().from_notebook_node(nbformat.reads(executed.read_text(), as_version=4))
    page_file = executed.with_suffix(".html")
    page_file.write_text(html)
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            # Offline, as a reader without a network: only the file itself loads.
            page.route("**/*", lambda r: r.continue_() if r.request.url.startswith("file:") else r.abort())
            page.goto(page_file.resolve().as_uri(), timeout=120_000)
            count = f"() => document.querySelectorAll('.js-plotly-plot .main-svg').length >= {2 * len(wanted)}"
            try:
                page.wait_for_function(count, timeout=60_000)
            except Exception:
                pass                      # what did draw is reported below
            drawn = page.evaluate("""() => [...document.querySelectorAll('.js-plotly-plot')]
                .filter(g => g.querySelector('.main-svg') && g.querySelectorAll('g.trace').length > 0)
                .map(g => (g.layout && g.layout.title && (g.layout.title.text || g.layout.title)) || '')""")
            page.screenshot(path=str(SHOTS / f"{executed.stem}.png"), full_page=True)
        finally:
            browser.close()
    missing = list(wanted)
    for title in drawn:
        if title in missing:
            missing.remove(title)
    assert not missing, (f"{executed.name}: {len(drawn)} of {len(wanted)} figures drew in its HTML export; "
                         f"not drawn: {missing}")
    return wanted, drawn
