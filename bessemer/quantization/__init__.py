"""Quantization primitives, configs and algorithms (see issue: quantization passes)."""
