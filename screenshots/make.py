"""Screenshots of the real TUI on the demo scenarios: each runs the built-in job, attaches
the real app headless at a fixed size, waits until its finding shows (or a timeout), and
saves an SVG. Run: python screenshots/make.py [scenario ...]"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from loadertop.demo import start_job, stop_job  # noqa: E402
from loadertop.tui.app import LoadertopApp  # noqa: E402
from loadertop.tui.source import LiveSource  # noqa: E402

SHOTS = {
    # name: (scenario, size, the finding to wait for, or None for "none at all")
    "starved": ("starved", (120, 36), "input_bound"),
    "healthy": ("healthy", (120, 36), None),
    "oversubscribed": ("threads", (120, 36), "worker_threads"),
    "starved-80x24": ("starved", (80, 24), "input_bound"),
}


async def shoot(name: str, scenario: str, size: tuple[int, int], wait_for: str | None) -> None:
    proc, _ = start_job(scenario)
    app = LoadertopApp(LiveSource([proc.pid]))
    try:
        async with app.run_test(size=size) as pilot:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 60
            while loop.time() < deadline:
                await pilot.pause(0.5)
                ids = {f.id for f in app.findings}
                ready = (wait_for in ids) if wait_for else (app.ticks_shown >= 25 and not ids)
                if ready and app.ticks_shown >= 12:
                    break
            app.save_screenshot(str(HERE / f"{name}.svg"))
            print(f"{name}: {sorted({f.id for f in app.findings}) or 'no findings'}")
    finally:
        stop_job(proc)


def main() -> None:
    names = sys.argv[1:] or list(SHOTS)
    for name in names:
        asyncio.run(shoot(name, *SHOTS[name]))


if __name__ == "__main__":
    main()
