"""Probes read the system (processes, shared memory, GPUs, stacks); they never import the UI."""
