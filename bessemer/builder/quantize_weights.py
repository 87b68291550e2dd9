"""Quantizes one weight while it is packed: fp32 array -> stored parts + its SQNR.

One weight at a time (the builder streams), with the round-to-nearest scales of
quantization/primitives.py; the stored layouts are those of quantization/packing.py.
"""

from __future__ import annotations

import numpy as np

from bessemer.builder.engine_format import pack_panel16
from bessemer.quantization import primitives as prim
from bessemer.quantization.packing import pack_group_params, pack_panel16_int4


def quantize_weight(w: np.ndarray, quant: tuple) -> tuple[dict[str, np.ndarray], dict]:
    """w: (N, K) fp32. Returns ({role: packed array}, {"sqnr_db": ..., ...})."""
    q = dict(quant)
    if q["bits"] == 8:
        codes, scale = prim.quantize_int8_per_channel(w)
        approx = prim.dequantize_int8_per_channel(codes, scale)
        parts = {"codes": pack_panel16(codes), "scales": scale}
    else:
        g = q["group_size"]
        scale, offset = prim.int4_group_params(w, g, q["zero_point"])
        codes = prim.quantize_int4(w, scale, offset, g)
        approx = prim.dequantize_int4(codes, scale, offset, g)
        parts = {"codes": pack_panel16_int4(codes), "scales": pack_group_params(scale),
                 "offsets": pack_group_params(offset)}
    stats = {"sqnr_db": round(prim.sqnr_db(w, approx), 2), "bits": q["bits"]}
    if q["bits"] == 4:
        stats["group_size"] = q["group_size"]
    return parts, stats
