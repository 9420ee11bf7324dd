"""Who waits for whom is one rule (rules/ranks.py): the monitor's attribution, the tuner's roles
and the Prometheus alert all say it by it. Held together here as properties over generated data
waits: the tuner names the straggler and the waiting ranks the monitor names, and the alert's
data-wait branch fires only on a rank the rule names as standing out, with the rule's own
thresholds (issue 41)."""

from __future__ import annotations

import re
import statistics
from pathlib import Path

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from loadertop.autotune.rank_roles import role_of
from loadertop.autotune.ranks_board import Entry
from loadertop.model import Knobs
from loadertop.rules import thresholds as T
from loadertop.rules.ranks import RankFigures, attribute, stands_out

ALERTS = Path(__file__).resolve().parent.parent / "docs" / "prometheus" / "alerts.yml"
waits = st.lists(st.floats(0.0, 0.95).map(lambda w: round(w, 3)), min_size=2, max_size=8)


def straggler_expr() -> str:
    (rule,) = [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]
               if r.get("alert") == "TrainingRankStraggler"]
    return rule["expr"]


def test_the_alert_reads_the_rules_own_thresholds_and_its_judgement():
    expr = straggler_expr()
    assert "loadertop_straggler == 1" in expr  # where a node compared ranks: its judgement, as said
    (gap,) = re.findall(r"\)\s*>=\s*([0-9.]+)", expr)
    (critical,) = re.findall(r'loadertop_data_wait_ratio\{rank!=""\}\s*>=\s*([0-9.]+)', expr)
    assert (float(gap), float(critical)) == (T.RANK_GAP, T.DATA_WAIT_CRITICAL)


def alert_fires(ws: list[float], r: int) -> bool:
    """The alert's data-wait branch as Prometheus evaluates it (quantile 0.5 interpolates: the
    median of all of the job's ranks), with the thresholds read from alerts.yml."""
    expr = straggler_expr()
    gap = float(re.findall(r"\)\s*>=\s*([0-9.]+)", expr)[0])
    critical = float(re.findall(r'loadertop_data_wait_ratio\{rank!=""\}\s*>=\s*([0-9.]+)', expr)[0])
    return len(ws) > 1 and ws[r] - statistics.median(ws) >= gap and ws[r] >= critical


@settings(max_examples=300, deadline=None)
@given(waits)
def test_the_alert_fires_only_on_a_rank_the_rule_names(ws):
    for r, w in enumerate(ws):
        if alert_fires(ws, r):
            assert stands_out(w, ws[:r] + ws[r + 1:]), (ws, r)


def figures(ws: list[float]) -> list[RankFigures]:
    """Ranks in lockstep: what one does not wait for data it waits in the sync (py-spy's frames)."""
    return [RankFigures(r, "node-a", 100 + r, w, sync_frames=0.95 - w) for r, w in enumerate(ws)]


@settings(max_examples=300, deadline=None)
@given(waits)
def test_the_tuner_takes_the_roles_the_monitor_names(ws):
    said = attribute(figures(ws))
    straggler = said.straggler.rank if said.straggler is not None and said.straggler.cause == "input" else None
    one = Knobs(1, 2)
    for me, mine in enumerate(ws):
        peers = [Entry(r, 3, w, one) for r, w in enumerate(ws) if r != me]
        role = role_of(me, mine, 3, peers)
        assert (role.role == "straggler") == (me == straggler), (ws, me, role, said)
        assert (role.role == "waiting") == (straggler is not None and me in said.waiting), (ws, me, role, said)
        if role.role == "waiting":
            assert role.peer == straggler
