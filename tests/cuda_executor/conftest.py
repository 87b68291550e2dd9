"""Fixtures of the cuda executor tests (defined in fake_driver.py)."""

from fake_driver import fake_cuda, fake_libcuda, tiny_cubin  # noqa: F401
