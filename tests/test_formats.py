"""Stored quantization formats (quantization/formats.py): the parts each one declares are the
parts it produces, a tensor-parallel K shard quantized on whole rows keeps the full rows'
parameters, and the cpu target has a kernel for every format's linear."""

import numpy as np
import pytest

from bessemer.format.dtypes import DTYPE_BITS
from bessemer.format.layouts import check_tensor, packed_nbytes
from bessemer.quantization import primitives as prim
from bessemer.quantization.formats import (Fp8E4M3, Int4Group, Int8PerChannel, StoredFormat, W8A8,
                                           WeightCalibration)
from bessemer.targets.cpu.kernel_table import QUANT_KERNELS

N, K = 40, 128
FORMATS = [Int8PerChannel(), Int4Group(32, False), Int4Group(64, True), W8A8(False), W8A8(True), Fp8E4M3()]
NP_DTYPES = {"int8": np.int8, "int4": np.uint8, "float8_e4m3": np.uint8, "float32": np.float32,
             "int32": np.int32, "bfloat16": np.float32}  # bf16 parameters are bf16 values held as fp32


def _calib():
    rng = np.random.default_rng(1)
    return WeightCalibration(input_amax=3.0, smooth=rng.uniform(0.5, 2.0, K).astype(np.float32))


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.describe())
@pytest.mark.parametrize("cut", [None, (64, 128)])
def test_parts_declared_are_parts_produced(fmt, cut):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((N, K)).astype(np.float32)
    q, used = fmt.store(w, _calib(), cut)
    k = K if cut is None else cut[1] - cut[0]
    assert used.shape == (N, k)
    parts = fmt.parts((N, k))
    for p in parts:
        assert q[p.role].shape == p.shape and q[p.role].dtype == NP_DTYPES[p.dtype], p
    layouts = QUANT_KERNELS[("linear", type(fmt))](fmt, (N, k)).layouts
    for p in parts:  # every part packs into exactly the bytes its layout's size rule says
        layout = layouts.get(p.role, "row_major")
        check_tensor(p.shape, p.dtype, layout)
        assert fmt.pack(p.role, q[p.role], layout).nbytes == packed_nbytes(p.shape, p.dtype, layout)
    assert fmt.stats(used, q)["sqnr_db"] > 15


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f.full_rows_for_k_shard(WeightCalibration())],
                         ids=lambda f: f.describe())
def test_k_shard_keeps_the_full_rows_scales(fmt):
    """A per-channel scale of a K shard is the whole row's (what a TP=1 engine stores)."""
    rng = np.random.default_rng(2)
    w = rng.standard_normal((N, K)).astype(np.float32)
    whole, _ = fmt.store(w, _calib())
    shard, _ = fmt.store(w, _calib(), (64, 128))
    np.testing.assert_array_equal(shard["scales"], whole["scales"])
    np.testing.assert_array_equal(shard["codes"], whole["codes"][:, 64:128])
    if fmt.smooth:
        np.testing.assert_array_equal(shard["smooth"], _calib().smooth[64:128])


def test_int4_column_cuts_follow_groups():
    fmt = Int4Group(64, False)
    assert fmt.column_split_error(128, [(0, 64), (64, 128)], 1) is None
    msg = fmt.column_split_error(96, [(0, 48), (48, 96)], 0)
    assert "inside a 4-bit group of 64" in msg and msg.endswith("; use --group-size 64")  # 64 on K 96 groups by 48
    assert Int8PerChannel().column_split_error(96, [(0, 48), (48, 96)], 0) is None


def test_int4_parameters_must_be_bf16_values():
    with pytest.raises(ValueError, match="bf16 values"):
        Int4Group(32, False).pack("scales", np.full((16, 1), 0.1, np.float32), "panel16")
    ok = prim.round_to_bf16(np.full((16, 1), 0.1, np.float32))
    assert Int4Group(32, False).pack("scales", ok, "panel16").nbytes == 16 * DTYPE_BITS["bfloat16"] // 8


def test_cpu_target_reads_every_format():
    for cls in StoredFormat.__subclasses__():
        assert ("linear", cls) in QUANT_KERNELS or ("moe", cls) in QUANT_KERNELS, cls.__name__  # experts: moe
