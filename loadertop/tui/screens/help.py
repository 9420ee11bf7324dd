"""? : the keys, and what each column means (from loadertop.fields)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from ...fields import TRAINER_FIELDS, WORKER_FIELDS
from ...probes.stacks import LIVE

KEYS = (
    ("q", "quit (the job keeps running; `loadertop demo` stops its own job)"),
    ("?", "this help"),
    ("p", "pause / resume sampling"),
    ("s", "save a snapshot report (JSON and Markdown) in the current folder"),
    ("+ / -", "slower / faster sampling"),
    ("tab, 1-9", "next trainer / trainer N"),
    ("o", "sort workers by id, CPU, USS, RSS"),
    ("w", "history over the last 1, 5 or 15 minutes"),
    ("← / →", "replay: back / forward 10 s"),
    (".", "replay: one snapshot forward (pauses)"),
    ("[ / ]", "replay: slower / faster"),
)


class HelpScreen(ModalScreen):
    BINDINGS = [("escape,q,question_mark", "app.pop_screen", "close")]

    def compose(self) -> ComposeResult:
        lines = ["[b]Keys[/b]"]
        lines += [f"  [b]{k:<9}[/b] {v}" for k, v in KEYS]
        lines += ["", "[b]Workers table[/b]"]
        lines += [f"  [b]{f.header:<7}[/b] {f.help}" for f in WORKER_FIELDS]
        lines += ["", "[b]Header and history[/b]"]
        lines += [f"  [b]{f.header:<9}[/b] {f.help}" for f in TRAINER_FIELDS]
        lines += ["", f"Data wait is sampled by py-spy from outside: a first {LIVE.first_look_s} s look (the verdict "
                  "it gives is marked provisional",
                  f"until the {LIVE.window_s} s window right after it confirms it), then a {LIVE.window_s} s window "
                  f"every {LIVE.window_s + LIVE.gap_s:g} s,",
                  "the figure covering the last two (`loadertop.watch(loader)` in the script makes it exact).",
                  "What each worker is DOING comes from py-spy dumps: new workers within seconds, then one",
                  f"worker every {LIVE.dump_interval_s:g} s, in turn.",
                  "", "Findings say what to change; `n/a` values come with a notice saying why.",
                  "Full reference: docs/RULES.md.  Press escape to close."]
        with VerticalScroll(id="help-body"):
            yield Static("\n".join(lines))
