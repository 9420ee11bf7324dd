"""Cost of loadertop.watch per next(): a trivial in-memory loader iterated with and without
the wrapper, and with tune=True (the tuner times every batch and reads /proc every few
seconds), interleaved, best of 7 runs of 200k batches each.

Run: python bench/hook_overhead.py
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadertop.inside.hook import watch  # noqa: E402


class Loader:
    batch_size, num_workers, prefetch_factor, pin_memory, persistent_workers = 1, 0, None, False, False
    dataset = None

    def __init__(self, n: int) -> None:
        self.items = list(range(n))

    def __iter__(self):
        return iter(self.items)


def per_batch(loader, n: int) -> float:
    t0 = time.perf_counter()
    for _ in loader:
        pass
    return (time.perf_counter() - t0) / n


def main() -> None:
    n = 200_000
    plain = Loader(n)
    watched = watch(Loader(n), name="bench", directory=tempfile.mkdtemp())
    tuned = watch(Loader(n), name="tuned", directory=tempfile.mkdtemp(), tune=True)
    base, hooked, tuning = [], [], []
    for _ in range(7):
        base.append(per_batch(plain, n))
        hooked.append(per_batch(watched, n))
        tuning.append(per_batch(tuned, n))
    b, h, t = min(base), min(hooked), min(tuning)
    print(f"| plain next() | {b * 1e6:.3f} µs |\n| with loadertop.watch | {h * 1e6:.3f} µs |"
          f"\n| with loadertop.watch(tune=True) | {t * 1e6:.3f} µs |"
          f"\n| cost of the hook | {(h - b) * 1e6:.2f} µs per batch |"
          f"\n| cost of the hook and the tuner | {(t - b) * 1e6:.2f} µs per batch |"
          f"\n| the tuner's state | {tuned._tuner.state}, {len(tuned._tuner.decisions)} decisions |")


if __name__ == "__main__":
    main()
