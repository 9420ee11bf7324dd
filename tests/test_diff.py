"""`loadertop diff`: two different programs refused; damaged and missing files in one line each.
A real job recorded with 1 worker and then with 2, compared, is in tests/test_scenarios.py."""

from __future__ import annotations

import json

import pytest
from support.jobs import loadertop


def test_two_different_programs_are_refused_in_one_line(tmp_path):
    from support.synth import host, replace, snapshot, story, trainer

    from loadertop.outputs.report import build_report, to_json

    def report(cmdline: tuple[str, ...]) -> str:
        t = replace(trainer(workers=2, wait=0.5), cmdline=cmdline)
        history = story(10, lambda s: snapshot(s, [t], host()))
        path = tmp_path / f"{cmdline[1]}.json"
        path.write_text(to_json(build_report(history)))
        return str(path)

    r = loadertop("diff", report(("python", "train.py")), report(("python", "eval.py")))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "train.py" in r.stderr and "eval.py" in r.stderr and "one job before and after" in r.stderr
    # The same program with other arguments is the same job (the change may be an argument).
    same = loadertop("diff", report(("python", "train.py")), report(("/usr/bin/python3", "-u", "train.py")))
    assert same.returncode == 0, same.stderr


def test_damaged_missing_and_foreign_files_are_one_line_each(tmp_path):
    from support.synth import host, snapshot, story, trainer

    from loadertop.outputs.report import build_report, to_json

    good = tmp_path / "good.json"
    good.write_text(to_json(build_report(story(5, lambda s: snapshot(s, [trainer()], host())))))
    cut = tmp_path / "cut.json"
    cut.write_text(good.read_text()[:300])
    garbage = tmp_path / "garbage.bin"
    garbage.write_bytes(b"\x00\xff" * 100)
    foreign = tmp_path / "foreign.json"
    foreign.write_text('{"schema": "loadertop.report/2", "trainers": [{"pid": "x"}]}')
    cases = {str(cut): "damaged report", str(garbage): "garbage.bin", str(foreign): "not a loadertop report",
             str(tmp_path / "missing.json"): "no such file", str(tmp_path): "folder"}
    for path, words in cases.items():
        r = loadertop("diff", path, str(good))
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and words in r.stderr, (path, r.stderr)
        assert "Traceback" not in r.stderr
    r = loadertop("diff", str(good), str(good), "--fail-if-slower", "x")
    assert r.returncode == 2 and "not a percentage" in r.stderr
    r = loadertop("diff", str(good), str(good), "--fail-if-slower", "10")
    assert r.returncode == 2 and "needs steps/s" in r.stderr


def test_each_figure_s_noise_comes_from_readings_that_do_not_overlap():
    from loadertop.outputs.figures import per_tick, windowed

    # Rates between ticks: the blocks' spread. A steady rate has none; a drifting one has some.
    assert per_tick([10.0] * 20) == {"value": 10.0, "stderr": 0.0, "readings": 20}
    drifting = per_tick([10.0 + i for i in range(20)])
    assert drifting["value"] == 19.5 and drifting["stderr"] > 2.0
    assert per_tick([3.0])["stderr"] is None  # one reading tells no spread
    # Rolling windows: only readings whose windows do not overlap count, walking back from the
    # last. Ticks every second over 10 s windows: the last and the one 10 s before it.
    points = [(float(t), 0.5 if t < 15 else 0.7, 10.0) for t in range(26)]
    w = windowed(points)
    assert w["readings"] == 3 and w["value"] == pytest.approx((0.7 + 0.7 + 0.5) / 3, abs=1e-4)
    assert windowed(points[:1])["stderr"] is None


def test_what_a_report_file_says_reaches_no_output_raw_and_wrong_types_are_one_line(tmp_path, capsys):
    # The fourth review (8, 9): diff printed a report's strings raw (the terminal, .md, .html and
    # its "not comparable" line), and a report with wrong types ended it in a traceback.
    import re
    import signal

    from support.synth import host, snapshot, story, trainer

    from loadertop import cli
    from loadertop.outputs.report import build_report

    evil = "\x1b]52;c;ZXZpbA==\x07\x1b[2J\u202e\n## OK"
    base = build_report(story(5, lambda s: snapshot(s, [trainer()], host())))
    hostile = json.loads(json.dumps(base))
    hostile["trainers"][0]["verdict"] = "HEALTHY" + evil
    hostile["trainers"][0]["loaders"][0]["dataset_class"] = "D" + evil
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(base))
    b.write_text(json.dumps(hostile))
    raw = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e]")
    try:
        for args in ([], ["-o", str(tmp_path / "d.md")], ["-o", str(tmp_path / "d.html")]):
            assert cli.main(["diff", str(a), str(b), *args]) == 0
        out = capsys.readouterr().out
        for text in (out, (tmp_path / "d.md").read_text(), (tmp_path / "d.html").read_text()):
            assert not raw.search(text) and "\\x1b]52" in text
        assert not [line for line in (tmp_path / "d.md").read_text().splitlines() if line.startswith("## OK")]
        # Not comparable: the other program's name, shown printable on the one line.
        other = json.loads(json.dumps(base))
        other["trainers"][0]["cmdline"] = ["evil" + evil]
        c = tmp_path / "c.json"
        c.write_text(json.dumps(other))
        assert cli.main(["diff", str(a), str(c)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and not raw.search(err) and "evil\\x1b]52" in err, err
        # Wrong types deep inside: one line, exit 2.
        for path, value in ((("trainers", 0, "figures"), "x"), (("trainers", 0, "loaders"), [5]),
                            (("trainers", 0, "cmdline"), 5), (("duration_s",), "x")):
            broken = json.loads(json.dumps(base))
            target = broken
            for key in path[:-1]:
                target = target[key]
            target[path[-1]] = value
            d = tmp_path / "d.json"
            d.write_text(json.dumps(broken))
            assert cli.main(["diff", str(a), str(d)]) == 2, path
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and "Traceback" not in err, (path, err)
    finally:
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
