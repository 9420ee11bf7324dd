"""The HTML report as a person sees it: rendered by headless Chromium, with no console
errors, and every chart drawn (its series' colours on the rendered page, not only in the
markup). Light and dark."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import replace

import pytest
from support.synth import gpu, host, snapshot, story, trainer

from loadertop.outputs.report import build_report
from loadertop.outputs.report_html import COLOURS, render

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# A real browser renders the report.
pytestmark = [pytest.mark.live, pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (.ci/run installs it)")]


def _page() -> str:
    def make(t):
        tr = replace(trainer(workers=3, wait=0.4 + 0.02 * t), gpus=(0,))
        return snapshot(t, [tr], host(), gpus=[gpu(util=50.0 + t)])

    snaps = story(30, make)
    return render(build_report(snaps), snaps)


def _shoot(tmp_path, page: str, dark: bool) -> tuple[str, object]:
    from PIL import Image

    html = tmp_path / "report.html"
    html.write_text(page)
    png = tmp_path / ("dark.png" if dark else "light.png")
    args = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--enable-logging=stderr",
            "--v=0", f"--screenshot={png}", "--window-size=900,2600", "--virtual-time-budget=3000"]
    if dark:
        args.append("--force-dark-mode")
    r = subprocess.run([*args, html.as_uri()], capture_output=True, text=True, timeout=90)
    assert r.returncode == 0 and png.exists(), r.stderr[-2000:]
    return r.stderr, Image.open(png).convert("RGB")


def _count(image, colour: str) -> int:
    """Pixels within a small distance of colour (anti-aliasing blends the rest)."""
    want = tuple(int(colour[i:i + 2], 16) for i in (1, 3, 5))
    colours = image.getcolors(maxcolors=1 << 24)
    return sum(n for n, px in colours if sum(abs(a - b) for a, b in zip(px, want, strict=True)) < 40)


@pytest.mark.parametrize("dark", [False, True], ids=["light", "dark"])
def test_the_html_report_renders_with_no_console_errors_and_every_series_drawn(tmp_path, dark):
    stderr, image = _shoot(tmp_path, _page(), dark)
    console = [line for line in stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert console == [], console
    # Data wait and GPU draw in the first colour, the three workers in the first three.
    for colour in COLOURS[:3]:
        assert _count(image, colour) > 150, colour
    background = image.getpixel((5, 5))
    assert (sum(background) < 200) == dark, background  # prefers-color-scheme is followed
