"""A job of the fleet judged across its nodes by the same rules as on one node (rules/ranks.py):
who waits for whom, the straggler and what it costs, each rank's verdict and the job's. Each
rank's own verdict is the one its node judged (`loadertop_verdict`); only what needs every
node is worked out here."""

from __future__ import annotations

from ..model import Finding
from ..text import count
from .ranks import Attribution, RankFigures, attribute
from .verdict import job_verdict, undecided, word_of


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def judge_job(name: str, rows: list[dict]) -> dict:
    """One job's report entry from its joined rows (collect/fleet_figures.py): each rank's wait for the
    others and verdict, the straggler, the job's verdict."""
    rows.sort(key=lambda r: (r["rank"] is None, r["rank"] or 0, r["node"]))
    live = [r for r in rows if not r["stale"] and not r.get("ended") and r["rank"] is not None]
    figures = [RankFigures(r["rank"], r["node"], None, r["data_wait_fraction"], r["sync_frames_fraction"],
                           r["sync_blocked_fraction"], r["steps_per_s"], r["world_size"],
                           frames_error=r.get("sync_frames_stderr") or 0.0,
                           blocked_error=r.get("sync_blocked_stderr") or 0.0) for r in live]
    att = attribute(figures)
    waits = dict(att.waits)
    for r in rows:
        r["wait_for_ranks_fraction"] = _r(waits.get(r["rank"])) if not r["stale"] and not r.get("ended") else None
        r["verdict"] = rank_verdict(r, att)
    size = max((r["world_size"] or 0 for r in rows), default=0) or None
    seen = len({r["rank"] for r in rows if r["rank"] is not None}) or len(rows)
    over = bool(rows) and all(r.get("ended") for r in rows)
    text, _ = job_verdict(att if len(live) >= 2 else None,
                          [(r["rank"], r["verdict"], "") for r in rows if not r["stale"] and not r.get("ended")])
    if over:
        text = "ENDED"
    straggler = att.straggler
    stale = sorted({r["node"] for r in rows if r["stale"]})
    return {
        "job": name, "verdict": text, "nodes": sorted({r["node"] for r in rows}), "world_size": size,
        "ranks_seen": seen, "seen": f"{seen} of {size} ranks seen" if size and size != seen else count(seen, "rank"),
        "stale_nodes": stale, "ended": over,
        "straggler": None if straggler is None else {
            "rank": straggler.rank, "node": straggler.node, "cause": straggler.cause,
            "cost_fraction": _r(att.cost)},
        "ranks": sorted(rows, key=lambda r: (straggler is None or r["rank"] != straggler.rank,
                                             -(r["wait_for_ranks_fraction"] or 0.0), r["rank"] or 0)),
    }


def rank_verdict(r: dict, att: Attribution) -> str:
    """A rank's verdict: who it waits for across nodes (only the fleet sees every node), else
    what its own node judged. An agent from before it exported verdicts: from its findings."""
    if r["stale"]:
        return "STALE"
    if r.get("ended"):
        return "ENDED"
    straggler = att.straggler
    if straggler is not None and r["rank"] in att.waiting:
        return f"WAITS FOR RANK {straggler.rank}"
    if straggler is not None and r["rank"] == straggler.rank and straggler.cause == "step":
        return "SLOWEST RANK"
    if r.get("node_verdict"):
        return str(r["node_verdict"])
    wait = r["data_wait_fraction"]
    findings = [Finding(i, "warning", None, "", {}) for i in r["findings"]]
    found = word_of(set(r["findings"]), findings, wait)
    if found is not None:
        return found[0]
    if wait is None:
        return "WATCHING"
    return (undecided(wait) or ("HEALTHY", ""))[0]
