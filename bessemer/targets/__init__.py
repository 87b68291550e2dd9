"""Targets: what is specific to one kind of hardware (lowering choices, kernels, executor)."""
