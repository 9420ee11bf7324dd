"""loadertop's built-in job (`python -m loadertop.demo.job`) with the tuner's least stretch
shortened, for the live tests that watch it tune: a test of seconds, not of the defaults' pace
(a stretch still goes on until its reading is clear of the noise). Run as
`python -m support.fast_tune_job ARGS` with tests/ on PYTHONPATH, under torchrun too."""

from __future__ import annotations

import sys

from loadertop.autotune import tuner as TU
from loadertop.demo.job import main

FAST_STRETCH_S = 0.5


def fast() -> None:
    TU.MIN_STRETCH_S = TU.MID_EPOCH_STRETCH_S = FAST_STRETCH_S


if __name__ == "__main__":
    fast()
    sys.exit(main())
