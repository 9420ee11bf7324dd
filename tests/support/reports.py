"""Reading a `loadertop snapshot` report (report-2.json) in the tests: taken live of a job, or
of a recorded scenario (support.scenarios), and the helpers that read its findings."""

from __future__ import annotations

import json
from pathlib import Path

from loadertop.rules import thresholds as T
from support.jobs import loadertop

SCHEMA = json.loads((Path(__file__).resolve().parent.parent.parent / "loadertop/schema/report-2.json").read_text())


def validated(report: dict) -> dict:
    import jsonschema

    jsonschema.validate(report, SCHEMA)
    return report


def report(*pids: int, duration: float = 10, interval: float = 0.5, stacks: bool = True) -> dict:
    """A live `loadertop snapshot --json` of the jobs, checked against the schema."""
    args = ["snapshot", *map(str, pids), "--duration", str(duration), "--interval", str(interval), "--json"]
    r = loadertop(*args, *([] if stacks else ["--no-stacks"]))
    assert r.returncode == 0, r.stderr
    return validated(json.loads(r.stdout))


def snapshot(*pids: int, duration: float = 2.0, extra: tuple[str, ...] = ()) -> dict:
    r = loadertop("snapshot", *map(str, pids), "--duration", str(duration), "--interval", "0.5",
                  "--json", "--no-stacks", *extra)
    assert r.returncode == 0, r.stderr
    return validated(json.loads(r.stdout))


def findings(rep: dict) -> dict[str, dict]:
    return {f["id"]: f for f in rep["findings"]}


def only_trainer(rep: dict) -> dict:
    assert len(rep["trainers"]) == 1, rep["trainers"]
    return rep["trainers"][0]


def merged_change(rep: dict) -> dict:
    """Every finding's change merged; a key proposed twice with two values fails."""
    out: dict = {}
    for f in rep["findings"]:
        for section, values in (f["change"] or {}).items():
            if not isinstance(values, dict):
                assert out.setdefault(section, values) == values, (f["id"], section)
                continue
            for k, v in values.items():
                assert out.setdefault(section, {}).setdefault(k, v) == v, (f["id"], section, k)
    return out


def texts(rep: dict) -> str:
    return " ".join(f["title"] + " " + f["suggestion"] for f in rep["findings"])


def busy_host(rep: dict) -> bool:
    """The snapshot found other processes keeping the trainer's CPUs busy (a shared runner)."""
    return only_trainer(rep)["plan"]["evidence"]["cpu_limit"] == "busy_host"


def assert_busy_host_advice(rep: dict, workers: int) -> None:
    """The busy-host advice, where the host really was busy: the host's CPUs were busier than
    the trainer alone makes them (read apart from the plan), and never more workers."""
    evidence = only_trainer(rep)["plan"]["evidence"]
    host = rep["host"]
    others = host["cpu_percent"] / 100 * host["cpu_count"] - (evidence["trainer_cpus_used"] or 0.0)
    assert others >= T.BUSY_HOST_SHARE * evidence["cpu_set"] - 0.15, (host, evidence)
    assert merged_change(rep).get("DataLoader", {}).get("num_workers", workers) <= workers
