"""Small numeric helpers every layer uses: pure, no I/O."""

from __future__ import annotations

from collections.abc import Iterable
from statistics import fmean

# Figures a file handed to loadertop may hold (a recording, a hook's file): finite, and small
# enough that arithmetic and dates on them stay sane (epoch seconds, byte counts, rates).
LARGEST = 1e15


def mean_of(values: Iterable[float | None]) -> float | None:
    """The mean of the values that were measured; None when none was."""
    present = [v for v in values if v is not None]
    return fmean(present) if present else None


def int_or_none(text: str | None) -> int | None:
    """A decimal integer read from text, or None where there is none."""
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None
