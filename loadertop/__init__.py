"""loadertop: a live monitor for the input pipeline of running PyTorch training jobs."""

__version__ = "0.1.0"
