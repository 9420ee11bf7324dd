"""loadertop: a live monitor for the input pipeline of running PyTorch training jobs."""

__version__ = "0.1.0"

from .hook import watch  # noqa: E402  (light: no torch, no Textual)

__all__ = ["watch", "__version__"]
