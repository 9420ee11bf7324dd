"""The live view (Textual). This module stays empty of imports: the command line reads the
tick from here before deciding to load Textual."""

# Every 2 s, as glances, btop and nvitop refresh (what a tick costs: docs/BENCHMARKS.md §3).
# A snapshot or a recording keeps 1 s: it is read afterwards, not watched.
LIVE_INTERVAL_S = 2.0
