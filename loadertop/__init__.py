"""loadertop: a live monitor for the input pipeline of running PyTorch training jobs."""

__version__ = "0.1.0"

from .hook import watch  # noqa: E402  (light: no torch, no Textual)
from .hook_accelerate import teach as _teach_accelerate  # noqa: E402

_teach_accelerate()  # Accelerate imported first: its prepare() keeps watched loaders watched

__all__ = ["watch", "__version__"]
