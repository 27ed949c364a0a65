"""Render the TensorBoard view of a run's diagnostics to one PNG (the figure in ``docs/diagnostics.md``).

Starts ``tensorboard --logdir LOGDIR`` on a free local port, opens it in headless Chromium through Playwright, and
stacks two screenshots: the Text tab's token table (its step list expanded, so every row of the latest tables is
visible) and the Time Series tab filtered to the mask charts and histograms. Maintainer tool, not a dependency of
the plugin: needs ``pip install playwright`` (its Python package only; the browser is the system's Chromium, e.g.
Debian's ``chromium`` package) and Pillow.

Usage::

    python scripts/tensorboard_screenshot.py --logdir RUN_DIR/tensorboard --out docs/figures/diagnostics_tensorboard.png
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

#: the Time Series tab's tag filter: the mask charts and histograms worth a first look
TAG_FILTER = ("^actor/(entropy|stapo/(tau_h|candidate_entropy_p95|pos_adv_below_tau_p_frac|silenced_share_end|"
              "lm_head_grad_norm|collapse/entropy_z|hist/entropy_adv_pos|hist/log10_p_adv_pos))$")
#: Chromium flags for a machine without network or GPU
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
#: expands the Text tab's scrolling step list (inside the text plugin's shadow DOM)
EXPAND_JS = """() => { const walk = (root) => { for (const el of root.querySelectorAll('*')) {
  if (el.id === 'steps-container') { el.style.maxHeight = 'none'; el.style.height = 'auto'; }
  if (el.shadowRoot) walk(el.shadowRoot); } }; walk(document); }"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(url: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"TensorBoard did not answer at {url} within {seconds:.0f} s")


def shoot(url: str, out: Path, chromium: str, width: int) -> None:
    """Screenshot the Text and Time Series tabs at ``url`` and stack them into ``out``."""
    from PIL import Image
    from playwright.sync_api import sync_playwright

    parts = [out.with_suffix(".text.png"), out.with_suffix(".series.png")]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": width, "height": 2400})
        page.goto(f"{url}/#text")
        page.wait_for_selector("text=token table", timeout=60_000)
        page.wait_for_timeout(1500)
        page.evaluate(EXPAND_JS)
        page.wait_for_timeout(500)
        card = page.locator("#steps-container").first.bounding_box()
        bottom = card["y"] + card["height"] + 24
        page.screenshot(path=str(parts[0]), clip={"x": 0, "y": 0, "width": width, "height": bottom})
        page.set_viewport_size({"width": width, "height": 1000})
        page.goto(f"{url}/#timeseries")
        page.wait_for_timeout(3000)
        settings = page.locator("button[aria-label='Toggle settings side pane']")
        if settings.count() and page.locator("text=Horizontal Axis").count():
            settings.first.click()  # close the settings pane: more room for the cards
        box = page.locator("input[placeholder*='Filter tags']").first
        box.fill(TAG_FILTER)
        box.press("Escape")
        page.mouse.click(width // 2, 5)  # close the autocomplete list
        page.wait_for_timeout(6000)
        page.screenshot(path=str(parts[1]))
        browser.close()
    images = [Image.open(p).convert("RGB") for p in parts]
    canvas = Image.new("RGB", (max(i.width for i in images), sum(i.height for i in images)), "white")
    y = 0
    for image in images:
        canvas.paste(image, (0, y))
        y += image.height
    canvas.save(out, optimize=True)
    for p in parts:
        p.unlink()


def main(argv=None) -> int:
    """CLI (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--logdir", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--chromium", default=shutil.which("chromium") or shutil.which("chromium-browser"),
                    help="the Chromium executable (default: chromium on PATH)")
    ap.add_argument("--width", type=int, default=1400)
    a = ap.parse_args(argv)
    if not a.chromium:
        ap.error("no Chromium found on PATH (Debian: apt-get install chromium); pass --chromium")
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", str(a.logdir), "--port",
                               str(port), "--host", "127.0.0.1"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    try:
        url = f"http://127.0.0.1:{port}"
        _wait(url, 60)
        a.out.parent.mkdir(parents=True, exist_ok=True)
        shoot(url, a.out, a.chromium, a.width)
    finally:
        server.terminate()
        server.wait(timeout=30)
    print(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
