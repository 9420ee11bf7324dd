"""The layering holds: headless modules never load Textual, and the monitor never loads torch.

Two checks: a static one over every module's imports (top level or inside a function, so a
lazy import cannot slip through), and a run that imports every headless module and looks at
what got loaded (so an import through a dependency cannot either)."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import loadertop

PACKAGE = Path(loadertop.__file__).parent
# Code that runs inside a training job or a tune trial, where torch is already loaded.
IN_THE_TRAINER = {"demo_job.py", "demo_images.py", "tune/examples.py", "tune/trial.py", "lightning.py", "huggingface.py"}
# Packages that load torch when imported.
TORCH = ("torch", "torchdata", "lightning", "pytorch_lightning", "transformers", "accelerate")
# The entry point may start the live view; nothing else outside the TUI may import it.
STARTS_THE_TUI = {"cli.py"}


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py"))


def _name(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


def _imports(source: str, name: str) -> set[str]:
    """Absolute names of every module the file `name` (relative to the package) imports, at
    any depth of its code."""
    package = ["loadertop", *Path(name).parent.parts]
    out = set()
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, node.module] if node.module else base)
            out.add(module)
            out |= {f"{module}.{a.name}" for a in node.names}
    return out


def _headless() -> list[str]:
    return [".".join(("loadertop", *p.relative_to(PACKAGE).with_suffix("").parts)).removesuffix(".__init__")
            for p in _modules()
            if p.relative_to(PACKAGE).parts[0] != "tui" or _name(p) == "tui/source.py"
            if _name(p) not in IN_THE_TRAINER and p.name != "__main__.py"]


@pytest.mark.unit
@pytest.mark.parametrize("path", _modules(), ids=_name)
def test_every_module_imports_only_what_its_layer_may(path):
    name = _name(path)
    imports = _imports(path.read_text(), name)
    if not name.startswith("tui/") or name == "tui/source.py":
        assert not {m for m in imports if m.split(".")[0] == "textual"}, "Textual belongs in loadertop/tui/"
    if not name.startswith("tui/") and name not in STARTS_THE_TUI:
        assert not {m for m in imports if m.startswith("loadertop.tui")}, "only the entry point starts the TUI"
    if name not in IN_THE_TRAINER:
        assert not {m for m in imports if m.split(".")[0] in TORCH}, "loadertop observes: no torch"


@pytest.mark.unit
def test_the_static_check_sees_lazy_and_relative_imports():
    source = "def f():\n    from ..tui.app import X\n    import torch.utils\n    from . import gpu\n"
    found = _imports(source, "probes/p.py")
    assert {"loadertop.tui.app", "torch.utils", "loadertop.probes.gpu"} <= found


HEADLESS = _headless()


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
    """A whole `snapshot` run, probes and report included, stays free of torch, and of
    psutil: another user runs it under a bare system Python (test_isolation.py)."""
    code = (
        "import os, sys, runpy\n"
        "sys.argv = ['loadertop', 'snapshot', str(os.getpid()), '--duration', '0.2', '--interval', '0.1',"
        " '--no-stacks', '-o', sys.argv[1]]\n"
        "from loadertop.cli import main\n"
        "rc = main(sys.argv[1:])\n"
        "assert rc == 0, rc\n"
        "assert not [m for m in sys.modules if m.startswith(('torch', 'textual', 'psutil'))]\n"
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "r.json")], check=True)
