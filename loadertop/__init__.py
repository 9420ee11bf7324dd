"""loadertop: a live monitor for the input pipeline of running PyTorch training jobs."""

__version__ = "0.1.0"

import importlib  # noqa: E402

from .inside import watch  # noqa: E402  (light: no torch, no Textual)
from .inside.accelerate import teach as _teach_accelerate  # noqa: E402

_teach_accelerate()  # Accelerate imported first: its prepare() keeps watched loaders watched

# The framework callbacks by their short names, as the README writes them:
# `loadertop.lightning.LoadertopCallback()`. Loaded on first use (each imports its framework).
_FRAMEWORKS = {"lightning": "loadertop.inside.lightning", "huggingface": "loadertop.inside.huggingface"}


def __getattr__(name: str):
    if name in _FRAMEWORKS:
        return importlib.import_module(_FRAMEWORKS[name])
    raise AttributeError(f"module 'loadertop' has no attribute {name!r}")


__all__ = ["watch", "__version__"]
