"""Record the replay tier's scenarios (tests/support/scenarios.py) into tests/data/scenarios/:
`python3 tests/record_scenarios.py [NAME ...]` (all of them without a name). Run it when a
probe changes what it reads, on a host with nothing else running, then run the replay tests
(`pytest -m replay`) and commit the recordings with the change."""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]

from support.scenarios import SCENARIOS, record  # noqa: E402


def main(names: list[str]) -> int:
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        print(f"record_scenarios: no scenario {', '.join(unknown)}; known: {', '.join(SCENARIOS)}", file=sys.stderr)
        return 2
    for name in names or list(SCENARIOS):
        started = time.monotonic()
        record(name)
        print(f"{name}: recorded in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
