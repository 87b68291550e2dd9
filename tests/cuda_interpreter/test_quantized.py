"""Weight-only quantized cuda engines (issue 22, w8a16 and w4a16; issue 39, w4k), under the
Triton interpreter.

Kernels: gemm_w8 / gemm_w4 (symmetric and asymmetric), gemm_w4k (two-level) and the int8
embedding against the quantization primitives' (the format's) dequantized weights on the same
rounded activations. Plans: a tiny
Llama built with --quant for --target cuda, logits vs HF fp32 whose linears hold the same
dequantized weights (the format's own quantize/dequantize), within CUDA_BF16_ERROR_RATIO of
HF bf16's error on those weights (the engine's activations are bf16). And the codes: the cuda
and the cpu engine of the same checkpoint and mode store the same codes and scales (the
algorithms are target-neutral; only the layouts differ).
"""

import copy
import json

import numpy as np
import pytest

from interp_support import assert_rounded_close, assert_row_bits_in_every_bucket, device_tensor, host, \
    split_k_workspace, torch

from conftest import _hf_model
from tolerances import CUDA_BF16_ERROR_RATIO

from bessemer.builder.build import build_engine
from bessemer.builder.config import BuildConfig
from bessemer.format import layouts
from bessemer.format.container import read_rank_header
from bessemer.format.dtypes import bfloat16_bits_to_float32
from bessemer.quantization import primitives as prim
from bessemer.quantization.config import QuantConfig
from bessemer.quantization.formats import WeightCalibration, weight_format
from bessemer.runtime.llm import LLM
from bessemer.targets.cuda.kernels import gemm_quant

DTYPES = ["bfloat16", "float16"]


def _int4_bytes(codes):
    return torch.from_numpy(layouts.pack_int4_row_major(codes).reshape(codes.shape[0], -1))


def _bf16(a):
    return torch.from_numpy(np.asarray(a, np.float32)).bfloat16()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,tile,split", [(3, (16, 32, 64), 1), (40, (32, 64, 64), 1), (3, (16, 32, 64), 3),
                                         (3, (16, 32, 32), 3)])  # parts of 2 K blocks
def test_gemm_w8(dtype, m, tile, split):
    rng = np.random.default_rng(0)
    n, k = 72, 192
    x = device_tensor(rng.normal(size=(m, k)), dtype)
    codes, scales = prim.quantize_int8_per_channel(rng.normal(size=(n, k)).astype(np.float32))
    bias = rng.normal(size=n).astype(np.float32)
    y = torch.zeros(m, n, dtype=x.dtype)
    bm, bn, bk = tile
    tiles = -(-m // bm) * -(-n // bn)
    partials, counters = split_k_workspace(tiles, split, bm, bn)
    gemm_quant.gemm_w8_kernel[(tiles, split)](
        x, torch.from_numpy(codes), torch.from_numpy(scales), torch.from_numpy(bias), y, partials, counters, m,
        N=n, K=k, X_STRIDE=k, Y_STRIDE=n, HAS_BIAS=True, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, SPLIT_K=split,
        K_PARTS=split)
    ref = host(x) @ prim.dequantize_int8_per_channel(codes, scales).astype(np.float64).T + bias
    assert_rounded_close(host(y), ref, dtype, f"gemm_w8 split {split}")
    assert not counters.any()  # reset by each tile's last program, ready for the next linear

    xs = device_tensor(rng.normal(size=(128, k)), dtype)

    def launch(rows, bm, one_program_a_part):
        programs = split if one_program_a_part else 1
        out = torch.zeros(rows, n, dtype=torch.float32)
        tiles = -(-rows // bm) * -(-n // bn)
        gemm_quant.gemm_w8_kernel[(tiles, programs)](
            xs, torch.from_numpy(codes), torch.from_numpy(scales), torch.from_numpy(bias), out,
            *split_k_workspace(tiles, programs, bm, bn), rows, N=n, K=k, X_STRIDE=k, Y_STRIDE=n, HAS_BIAS=True,
            BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, SPLIT_K=programs, K_PARTS=split)
        return out

    assert_row_bits_in_every_bucket(launch, f"gemm_w8 in {split} parts")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("zero_point", [False, True])
@pytest.mark.parametrize("group,split", [(32, 1), (64, 1), (32, 4), (64, 2)])
def test_gemm_w4(dtype, zero_point, group, split):
    from bessemer.quantization.scale_search import int4_grid

    rng = np.random.default_rng(1)
    m, n, k = 5, 40, 256
    x = device_tensor(rng.normal(size=(m, k + 8)), dtype)[:, :k]  # a view: row stride k + 8
    w = rng.normal(size=(n, k)).astype(np.float32)
    scale, offset = int4_grid(w, group, zero_point)
    codes = prim.quantize_int4(w, scale, offset, group)
    y = torch.zeros(m, n, dtype=x.dtype)
    offsets = _bf16(offset) if zero_point else torch.empty(0, dtype=torch.bfloat16)
    block_k = min(64, group)
    tiles = -(-n // 32)
    partials, counters = split_k_workspace(tiles, split, 16, 32)
    gemm_quant.gemm_w4_kernel[(tiles, split)](
        x, _int4_bytes(codes), _bf16(scale), offsets, torch.empty(0), y, partials, counters, m, N=n, K=k, GROUP=group,
        X_STRIDE=k + 8, Y_STRIDE=n, SYMMETRIC=not zero_point, HAS_BIAS=False, BLOCK_M=16, BLOCK_N=32, BLOCK_K=block_k,
        GROUP_M=8, SPLIT_K=split, K_PARTS=split)
    ref = host(x) @ prim.dequantize_int4(codes, scale, offset, group).astype(np.float64).T
    assert_rounded_close(host(y), ref, dtype, f"gemm_w4 split {split}")
    assert not counters.any()

    xs = device_tensor(rng.normal(size=(128, k + 8)), dtype)[:, :k]

    def launch(rows, bm, one_program_a_part):
        programs = split if one_program_a_part else 1
        out = torch.zeros(rows, n, dtype=torch.float32)
        tiles = -(-rows // bm) * -(-n // 32)
        gemm_quant.gemm_w4_kernel[(tiles, programs)](
            xs, _int4_bytes(codes), _bf16(scale), offsets, torch.empty(0), out,
            *split_k_workspace(tiles, programs, bm, 32), rows, N=n, K=k, GROUP=group, X_STRIDE=k + 8, Y_STRIDE=n,
            SYMMETRIC=not zero_point, HAS_BIAS=False, BLOCK_M=bm, BLOCK_N=32, BLOCK_K=block_k, GROUP_M=8,
            SPLIT_K=programs, K_PARTS=split)
        return out

    assert_row_bits_in_every_bucket(launch, f"gemm_w4 in {split} parts")


def _w4k_launch(x, q, n, k, super_block, y, rows, tile, split, one_program_a_part=True):
    """gemm_w4k_kernel on the stored parts q (the format's values) of an (n, k) weight."""
    from bessemer.targets.cuda.kernels import gemm_w4k

    bm, bn = tile
    programs = split if one_program_a_part else 1
    tiles = -(-rows // bm) * -(-n // bn)
    partials, counters = split_k_workspace(tiles, programs, bm, bn)
    gemm_w4k.gemm_w4k_kernel[(tiles, programs)](
        x, _int4_bytes(q["codes"]), torch.from_numpy(q["scales"]), torch.from_numpy(q["offsets"]),
        torch.from_numpy(q["super_scales"].astype(np.float16)), torch.from_numpy(q["super_offsets"].astype(np.float16)),
        torch.empty(0), y, partials, counters, rows, N=n, K=k, SUB_BLOCK=32, SUPER_BLOCK=super_block,
        X_STRIDE=x.stride(0), Y_STRIDE=n, HAS_BIAS=False, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=32, GROUP_M=8,
        SPLIT_K=programs, K_PARTS=split)
    return counters


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,tile,split", [(1, (16, 64), 1), (5, (16, 32), 3), (70, (64, 32), 2),
                                         (130, (128, 32), 1)])
def test_gemm_w4k(dtype, m, tile, split):
    """Two-level codes (w4k): against the format's reference dequantization (superblock.
    dequantize: s = fp32(d sc), o = fp32(-(dmin m)) per 32 columns) and an fp64 matmul of the
    same rounded x, within one output rounding + fp32 arithmetic. K = 384: two super-blocks of
    192, cut by 3 split-K parts at column 128 (inside a super-block); N = 40 leaves a part tile;
    M from a decode row to a prefill of two 128-row tiles with a part tile."""
    from bessemer.quantization.formats import Int4SuperBlock

    rng = np.random.default_rng(4)
    n, k = 40, 384
    fmt = weight_format(QuantConfig("w4k"), k)
    assert fmt == Int4SuperBlock(192)
    w = rng.normal(size=(n, k)).astype(np.float32)
    w[3, :32] = 0.0  # a sub-block of zeros: scale and minimum codes 0
    q = fmt.quantize(w, WeightCalibration())
    assert q["offsets"].any() and q["super_offsets"].any()  # the minimum term is exercised
    x = device_tensor(rng.normal(size=(m, k + 8)), dtype)[:, :k]  # a view: row stride k + 8
    y = torch.zeros(m, n, dtype=x.dtype)
    counters = _w4k_launch(x, q, n, k, 192, y, m, tile, split)
    ref = host(x) @ fmt.dequantize(q).astype(np.float64).T
    assert_rounded_close(host(y), ref, dtype, f"gemm_w4k m {m} split {split}")
    assert not counters.any()
    if m == 5:  # batch invariance: row 0 alone and among 16, 64, 128 rows, bit for bit
        xs = device_tensor(rng.normal(size=(128, k)), dtype)

        def launch(rows, bm, one_program_a_part):
            out = torch.zeros(rows, n, dtype=torch.float32)
            _w4k_launch(xs, q, n, k, 192, out, rows, (bm, 32), split, one_program_a_part)
            return out

        assert_row_bits_in_every_bucket(launch, f"gemm_w4k in {split} parts")


def test_embedding_w8_reads_the_int8_table():
    rng = np.random.default_rng(2)
    codes, scales = prim.quantize_int8_per_channel(rng.normal(size=(30, 48)).astype(np.float32))
    ids = torch.tensor([4, 0, 29, 4], dtype=torch.int32)
    out = torch.zeros(4, 48, dtype=torch.float32)
    gemm_quant.embedding_w8_kernel[(4, 1)](ids, torch.from_numpy(codes), torch.from_numpy(scales), out, HIDDEN=48,
                                           OUT_STRIDE=48, BLOCK=64)
    ref = prim.dequantize_int8_per_channel(codes, scales)[ids.numpy()]
    np.testing.assert_array_equal(out.numpy(), ref.astype(np.float32))


# ---------------------------------------------------------------- engines

QUANT_CASES = [QuantConfig("w8a16"), QuantConfig("w4a16", group_size=32),
               QuantConfig("w4a16", group_size=64, zero_point=True), QuantConfig("w4k")]
IDS = ["w8a16", "w4a16-g32", "w4a16-g64-asym", "w4k"]


@pytest.fixture(scope="module")
def quant_checkpoint(tiny_checkpoint_i128):
    # intermediate 128: every K (64, 128) a whole number of 32- and 64-wide groups
    return tiny_checkpoint_i128("llama-untied")


def _fake_quantized_hf(ckpt, quant: QuantConfig, dtype: str):
    """HF whose linears (lm_head: int8, as the build's default) hold the format's dequantized weights."""
    model = copy.deepcopy(_hf_model(str(ckpt), "float32"))
    with torch.no_grad():
        for name, mod in model.named_modules():
            if isinstance(mod, torch.nn.Linear):
                w = mod.weight.detach().numpy().astype(np.float32)
                fmt = weight_format(QuantConfig("w8a16") if name == "lm_head" else quant, w.shape[1])
                mod.weight.copy_(torch.from_numpy(fmt.dequantize(fmt.quantize(w, WeightCalibration()))))
    return model.to(getattr(torch, dtype))


@pytest.mark.parametrize("quant", QUANT_CASES, ids=IDS)
def test_quantized_cuda_plan_matches_fake_quantized_hf(quant, quant_checkpoint, tmp_path):
    engine = build_engine(quant_checkpoint, tmp_path / "e", BuildConfig(
        target="cuda", dtype="bfloat16", quant=quant, kv_block_size=4, max_num_tokens=24, max_seq_len=128))
    llm = LLM(engine, interpret=True)
    ref32, ref16 = (_fake_quantized_hf(quant_checkpoint, quant, d) for d in ("float32", "bfloat16"))
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, 250, n).tolist() for n in (7, 19)]
    for ids, got in zip(prompts, llm.score(prompts, num_prefill=12)):
        with torch.no_grad():
            want = ref32(torch.tensor([ids])).logits[0].numpy()
            theirs = np.abs(ref16(torch.tensor([ids])).logits[0].float().numpy() - want).max()
        err = np.abs(got - want).max()
        groups = f" g{quant.group_size}" if quant.bits == 4 and not quant.two_level else ""
        print(f"cuda {quant.mode}{groups}: max |engine - HF| = {err:.4g}, "
              f"{err / (CUDA_BF16_ERROR_RATIO * theirs):.2f} of the bound")
        assert err <= CUDA_BF16_ERROR_RATIO * theirs


def _stored(engine, name, shape, target):
    """(codes, scales) of one quantized weight as values, from either target's layouts."""
    _, _, header, data_offset = read_rank_header(engine / "rank0.engine")
    raw = (engine / "rank0.engine").read_bytes()
    tensors = {t["name"]: t for t in header["tensors"]}

    def data(t):
        return np.frombuffer(raw, np.uint8, tensors[t]["nbytes"], data_offset + tensors[t]["offset"])

    n, k = shape
    scales_t = tensors[name + ".scales"]
    groups = scales_t["shape"][1]
    if target == "cuda":  # row-major: two codes a byte, k even low
        b = data(name).reshape(n, k // 2)
        codes = np.stack([b & 15, b >> 4], axis=-1).reshape(n, k)
        scales = bfloat16_bits_to_float32(data(name + ".scales").view(np.uint16)).reshape(n, groups)
    else:  # panel16_int4_k8 codes, panel16 bf16 scales
        codes = layouts.unpack_panel16_int4_k8(data(name), n, k)
        p = bfloat16_bits_to_float32(data(name + ".scales").view(np.uint16)).reshape(-1, groups, 16)
        scales = p.transpose(0, 2, 1).reshape(-1, groups)[:n]
    return codes, scales


def test_cuda_and_cpu_engines_store_the_same_codes(quant_checkpoint, tmp_path):
    quant = QuantConfig("w4a16", group_size=32)
    engines = {t: build_engine(quant_checkpoint, tmp_path / t, BuildConfig(
        target=t, dtype="bfloat16", quant=quant, max_seq_len=128)) for t in ("cpu", "cuda")}
    config = json.loads((quant_checkpoint / "config.json").read_text())
    n, k = config["intermediate_size"], config["hidden_size"]
    for name in ("model.layers.0.mlp.gate_up_proj.weight", "model.layers.1.mlp.down_proj.weight"):
        shape = (2 * n, k) if "gate_up" in name else (k, n)
        cpu, cuda = (_stored(engines[t], name, shape, t) for t in ("cpu", "cuda"))
        np.testing.assert_array_equal(cpu[0], cuda[0])
        np.testing.assert_array_equal(cpu[1], cuda[1])
