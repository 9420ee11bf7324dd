"""Screenshots of the real TUI on the demo scenarios: each runs the built-in job, attaches
the real app headless at a fixed size, waits until its finding shows (or a timeout), and
saves an SVG; at 120x36 it also writes the HTML report of what the app sampled and renders it
in headless Chromium to report-<name>.png (where chromium is installed).
Run: python screenshots/make.py [scenario ...]"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from loadertop.demo import start_job, stop_job  # noqa: E402
from loadertop.tui.app import LoadertopApp  # noqa: E402
from loadertop.tui.source import LiveSource  # noqa: E402

SETTLED = "tune settled"
FIRST_LOOK = "provisional"  # the verdict of py-spy's first 3 s look, before a full window confirms it
SHOTS = {
    # name: (scenario, size, the finding to wait for, or None for "none at all")
    "starved": ("starved", (120, 36), "input_bound"),
    "healthy": ("healthy", (120, 36), None),
    "oversubscribed": ("threads", (120, 36), "worker_threads"),
    "ranks": ("ranks", (120, 36), "waits_for_rank"),
    "starved-80x24": ("starved", (80, 24), "input_bound"),
    # The starved demo with watch(tune=True): shot once the tuner settled.
    "tuned": ("starved", (120, 36), SETTLED),
    # The first seconds: the provisional verdict.
    "first-look": ("starved", (120, 36), FIRST_LOOK),
}


async def shoot(name: str, scenario: str, size: tuple[int, int], wait_for: str | None) -> None:
    tune = wait_for == SETTLED
    # argv0: no path of the machine they were made on
    proc, _ = start_job(scenario, argv0="python3", tune=tune)
    app = LoadertopApp(LiveSource([proc.pid]))
    try:
        async with app.run_test(size=size) as pilot:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + (150 if tune else 60)
            settled_at = None
            while loop.time() < deadline:
                await pilot.pause(0.5)
                ids = {f.id for f in app.findings}
                if tune:
                    last = app.history[-1] if app.history else None
                    states = {lo.tune.state for t in (last.trainers if last else ()) for lo in t.loaders if lo.tune}
                    if "settled" in states and settled_at is None:
                        settled_at = loop.time()
                    # Once the monitor's 30 s window holds the new setting alone.
                    ready = settled_at is not None and loop.time() - settled_at >= 35
                elif wait_for == FIRST_LOOK:
                    from loadertop.tui.widgets.header import HeaderPanel

                    if FIRST_LOOK in str(app.query_one(HeaderPanel).render()):
                        break
                    continue
                else:
                    ready = (wait_for in ids) if wait_for else (app.ticks_shown >= 25 and not ids)
                if ready and app.ticks_shown >= 12:
                    break
            app.save_screenshot(str(HERE / f"{name}.svg"))
            print(f"{name}: {sorted({f.id for f in app.findings}) or 'no findings'}")
            if size == (120, 36) and wait_for != FIRST_LOOK:
                render_report(name, app)
    finally:
        stop_job(proc)


def render_report(name: str, app: LoadertopApp) -> None:
    """The HTML report of what the app sampled, as headless Chromium draws it."""
    from loadertop.outputs import report, report_html

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None or not app.history:
        return
    snaps = list(app.history)
    page = report_html.render(report.build_report(snaps, app.diagnosis), snaps)
    with tempfile.TemporaryDirectory() as tmp:
        html = Path(tmp) / "report.html"
        html.write_text(page)
        subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        f"--screenshot={HERE / f'report-{name}.png'}", "--window-size=820,1700", html.as_uri()],
                       check=True, capture_output=True, timeout=120)


async def shoot_fleet() -> None:
    """The fleet view over a real agent and Debian's prometheus scraping it, beside the ranks
    demo (two DDP ranks, rank 1 reading a slow shard)."""
    import socket

    from loadertop.outputs import fleet
    from loadertop.probes.prometheus import FleetError, Prometheus
    from loadertop.tui.fleet_view import FleetApp

    def free_port() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    prometheus = shutil.which("prometheus")
    if prometheus is None:
        print("fleet: needs prometheus (apt-get install prometheus)")
        return
    agent_port, prom_port = free_port(), free_port()
    proc, _ = start_job("ranks", argv0="python3")
    agent = subprocess.Popen([sys.executable, "-m", "loadertop", "export", "--all", "--listen",
                              f"127.0.0.1:{agent_port}", "--interval", "1"], stderr=subprocess.DEVNULL)
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "prometheus.yml"
        config.write_text("global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: loadertop\n"
                          f"    static_configs:\n      - targets: ['127.0.0.1:{agent_port}']\n")
        prom = subprocess.Popen([prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp}/tsdb",
                                 f"--web.listen-address=127.0.0.1:{prom_port}"], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        reader = Prometheus(f"http://127.0.0.1:{prom_port}")
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                await asyncio.sleep(2)
                try:
                    if any(j["straggler"] for j in fleet.read(reader)["jobs"]):
                        break
                except FleetError:
                    continue
            app = FleetApp(reader, interval_s=5)
            async with app.run_test(size=(120, 24)) as pilot:
                while app.reads == 0:
                    await pilot.pause(0.2)
                await pilot.pause(0.5)
                app.save_screenshot(str(HERE / "fleet.svg"))
                print("fleet: saved")
        finally:
            for p in (prom, agent):
                p.terminate()
                p.wait()
            stop_job(proc)


def main() -> None:
    names = sys.argv[1:] or [*SHOTS, "fleet"]
    for name in names:
        asyncio.run(shoot_fleet() if name == "fleet" else shoot(name, *SHOTS[name]))


if __name__ == "__main__":
    main()
