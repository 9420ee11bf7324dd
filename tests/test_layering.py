"""The layering holds: headless modules never load Textual, the monitor never loads torch,
the trainer's side (loadertop/inside/) and the monitor's side do not reach into each other,
and no two modules import each other.

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
IN_THE_TRAINER = {"demo/job.py", "demo/images.py", "tune/examples.py", "tune/trial.py", "inside/lightning.py",
                  "inside/huggingface.py"}
# Packages that load torch when imported.
TORCH = ("torch", "torchdata", "lightning", "pytorch_lightning", "transformers", "accelerate")
# The entry point may start the live view; nothing else outside the TUI may import it.
STARTS_THE_TUI = {"cli/monitor.py", "cli/fleet_command.py", "cli/arguments.py"}  # arguments: the live tick


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


# What the trainer's side may import besides the standard library: the framework each file
# adapts, the hook file's format, itself; and the in-place tuner only where tune=True asks.
INSIDE_MAY = ("loadertop.hookfile", "loadertop.wrapped", "loadertop.inside")
FRAMEWORKS = ("lightning", "pytorch_lightning", "transformers", "accelerate")
ONLY_WITH_TUNE = {"inside/hook.py": "loadertop.autotune.tuner"}
# The package's face re-exports watch(); nothing else on the monitor's side imports inside/.
FACE = {"__init__.py"}


def _top_level_imports(source: str, name: str) -> set[str]:
    """The modules a file imports when it is imported (not inside a function)."""
    tree = ast.parse(source, name)
    module_level = ast.Module(body=[n for n in tree.body if not isinstance(n, (ast.FunctionDef, ast.ClassDef))],
                              type_ignores=[])
    return _imports(ast.unparse(module_level), name)


@pytest.mark.parametrize("path", [p for p in _modules() if _name(p).startswith("inside/") or _name(p) == "hookfile.py"],
                         ids=_name)
def test_the_trainer_side_imports_only_the_standard_library_its_framework_and_the_hook_format(path):
    name = _name(path)
    allowed_lazily = ONLY_WITH_TUNE.get(name)
    for module in _imports(path.read_text(), name):
        top = module.split(".")[0]
        if top in sys.stdlib_module_names or top in FRAMEWORKS and name != "hookfile.py":
            continue
        if module.startswith(INSIDE_MAY) and name != "hookfile.py":
            continue
        if allowed_lazily and module.startswith(allowed_lazily):
            assert module not in _top_level_imports(path.read_text(), name), f"{module} only when tune=True asks"
            continue
        assert module == "loadertop", f"{name} imports {module}: the trainer's side takes nothing from the monitor"


@pytest.mark.parametrize("path", [p for p in _modules() if not _name(p).startswith("inside/")], ids=_name)
def test_the_monitor_side_never_imports_the_trainer_side(path):
    name = _name(path)
    if name in FACE:
        return
    found = {m for m in _imports(path.read_text(), name) if m.startswith("loadertop.inside")}
    assert not found, f"{name} imports {sorted(found)}: what the trainer writes is read through loadertop/hookfile.py"


def _graph() -> dict[str, set[str]]:
    """Which loadertop module imports which (any depth of the code), by module name."""
    names = {".".join(("loadertop", *p.relative_to(PACKAGE).with_suffix("").parts)).removesuffix(".__init__"): p
             for p in _modules()}
    graph = {}
    for module, path in names.items():
        imported = _imports(path.read_text(), _name(path))
        graph[module] = {m for m in imported if m in names and m != module and not module.startswith(m + ".")
                         and m != "loadertop"}
    return graph


def test_no_two_modules_import_each_other():
    graph = _graph()
    circles = sorted({tuple(sorted((a, b))) for a, deps in graph.items() for b in deps if a in graph.get(b, ())})
    assert not circles, f"modules that import each other: {circles}"


def test_no_two_modules_share_a_name():
    """hook.py and probes/hooks.py, picker.py twice, plan.py twice: a reader opened the wrong one."""
    stems: dict[str, list[str]] = {}
    for p in _modules():
        if p.name not in ("__init__.py", "__main__.py"):
            stems.setdefault(p.stem.rstrip("s"), []).append(_name(p))
    assert not {s: ps for s, ps in stems.items() if len(ps) > 1}


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


def test_every_numeric_threshold_is_defined_once():
    """`loadertop tune` once re-declared the monitor's TOLERANCE, SHM_LIMIT, MEMORY_LIMIT and
    MAX_WORKERS: a number changed in one place silently stayed in the other."""
    where: dict[str, list[str]] = {}
    for path in _modules():
        for node in ast.parse(path.read_text()).body:
            target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else \
                node.target if isinstance(node, ast.AnnAssign) else None
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            if isinstance(target, ast.Name) and target.id.isupper() and isinstance(value, ast.Constant) \
                    and isinstance(value.value, (int, float)) and not isinstance(value.value, bool):
                where.setdefault(target.id, []).append(_name(path))
    assert not {name: paths for name, paths in where.items() if len(paths) > 1}


@pytest.mark.parametrize("path", [p for p in _modules() if _name(p).startswith("tui/")], ids=_name)
def test_the_tui_uses_only_textuals_public_api(path):
    """The history line once reached into the Sparkline's renderable (textual.renderables):
    a Textual release could change it under us, and textual>=0.80 has no upper bound."""
    found = {m for m in _imports(path.read_text(), _name(path)) if m.split(".")[0] == "textual"
             and (m.startswith("textual.renderables") or any(part.startswith("_") for part in m.split(".")))}
    assert not found, f"{_name(path)} imports Textual internals: {sorted(found)}"
