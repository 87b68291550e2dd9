"""Fused ops: declarations, NumPy references, and their C++ kernels (csrc/)."""
