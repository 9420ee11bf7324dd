"""The layering holds: headless modules never load Textual, and the monitor never loads torch."""

import subprocess
import sys

HEADLESS = [
    "loadertop.cli",
    "loadertop.model",
    "loadertop.sampler",
    "loadertop.report",
    "loadertop.redact",
    "loadertop.probes.procfs",
    "loadertop.probes.procs",
    "loadertop.probes.host",
    "loadertop.probes.shm",
    "loadertop.probes.gpu",
    "loadertop.tune.plan",
    "loadertop.tune.runner",
    "loadertop.tune.output",
    "loadertop.tune.view",
]


def test_headless_modules_load_neither_textual_nor_torch():
    code = (
        "import sys, importlib\n"
        f"for m in {HEADLESS!r}: importlib.import_module(m)\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('textual', 'torch'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_snapshot_run_does_not_import_torch(tmp_path):
    """A whole `snapshot` run, probes and report included, stays free of torch."""
    code = (
        "import os, sys, runpy\n"
        "sys.argv = ['loadertop', 'snapshot', str(os.getpid()), '--duration', '0.2', '--interval', '0.1',"
        " '--no-stacks', '-o', sys.argv[1]]\n"
        "from loadertop.cli import main\n"
        "rc = main(sys.argv[1:])\n"
        "assert rc == 0, rc\n"
        "assert not [m for m in sys.modules if m.startswith(('torch', 'textual'))]\n"
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "r.json")], check=True)
