"""An in-place tuner's states as the hook file carries them, for the views' tests."""

from __future__ import annotations

from loadertop.model import Decision, Knobs, TuneState

TWO, FOUR = Knobs(2, 2), Knobs(4, 2)
TRYING = TuneState("trying", FOUR, TWO, 3, 12.5, 0.004, "",
                   (Decision("try", TWO, FOUR, reason="the model predicts +80% steps/s", epoch=3, batch=90, at=1e9),))
SETTLED = TuneState("settled", FOUR, TWO, 6, 21.0, 0.01, "", (
    *TRYING.decisions, Decision("keep", TWO, FOUR, 0.66, 0.05, epoch=5, batch=150, at=1e9 + 20),
    Decision("settle", FOUR, FOUR, reason="num_workers=6 measured no faster", epoch=6, batch=180, at=1e9 + 30)))
