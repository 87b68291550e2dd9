"""cuda kernels that work row by row, under the Triton interpreter, vs the op set's NumPy
references (bessemer/plugins/ops.py) on the same rounded inputs: embedding, gather_rows,
rms_norm, add_rms_norm, rms_norm_heads, add, silu_mul, gelu_tanh_mul, scale, sigmoid_gate_mul,
rope fused with the KV-cache write, the plain KV-cache write of NoPE layers, and the GEMM (K in
parts: split-K, and a row's bits alone and among 16, 64 and 128 rows).

Shapes are small and ragged on purpose: widths that are not powers of two or tile
multiples, views with row strides wider than their width, in-place outputs.
"""

import numpy as np
import pytest

from interp_support import assert_rounded_close, assert_row_bits_in_every_bucket, device_tensor, host, \
    split_k_workspace, torch

from bessemer.format.dtypes import bfloat16_bits_to_float32, to_bfloat16_bits
from bessemer.plugins import ops
from bessemer.quantization import kv_cache as kvq
from bessemer.targets.cuda.kernels import elementwise, embedding, gemm, norm, rope

DTYPES = ["bfloat16", "float16"]


def rounded(x, dtype):
    """x as the activation dtype stores it, back in float64."""
    x = np.asarray(x, np.float32)
    if dtype == "bfloat16":
        return bfloat16_bits_to_float32(to_bfloat16_bits(x)).reshape(x.shape).astype(np.float64)
    return x.astype(np.float16).astype(np.float64)


@pytest.mark.parametrize("dtype", DTYPES)
def test_embedding_and_gather_rows_copy_rows_exactly(dtype):
    rng = np.random.default_rng(0)
    table = device_tensor(rng.normal(size=(50, 40)), dtype)
    ids = torch.tensor([3, 0, 49, 3, 17], dtype=torch.int32)
    out = torch.zeros(5, 48, dtype=table.dtype)  # row stride 48 > width 40
    embedding.embedding_kernel[(5, 3)](ids, table, out, HIDDEN=40, OUT_STRIDE=48, BLOCK=16)
    assert torch.equal(out[:, :40], table[ids.long()])
    assert not out[:, 40:].any()
    picked = torch.zeros(2, 40, dtype=table.dtype)
    rows = torch.tensor([4, 1], dtype=torch.int32)
    embedding.gather_rows_kernel[(2, 1)](rows, out, picked, WIDTH=40, X_STRIDE=48, OUT_STRIDE=40, BLOCK=64)
    assert torch.equal(picked, out[rows.long(), :40])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [88, 64])
def test_rms_norm(dtype, width):
    rng = np.random.default_rng(1)
    x = device_tensor(3 * rng.normal(size=(5, width)), dtype)
    w = torch.from_numpy(rng.normal(1.0, 0.2, size=width).astype(np.float32))
    y = torch.empty(5, width, dtype=x.dtype)
    block = 1 << (width - 1).bit_length()
    norm.rms_norm_kernel[(5,)](x, w, y, 1e-5, 0.5, N=width, X_STRIDE=width, Y_STRIDE=width, BLOCK=block)
    ref = ops.ref_rms_norm(host(x), w.numpy(), 1e-5, 0.5)
    assert_rounded_close(host(y), ref, dtype, "rms_norm")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("in_place", [True, False])
def test_add_rms_norm_normalizes_the_stored_residual(dtype, in_place):
    rng = np.random.default_rng(2)
    n = 72
    x = device_tensor(rng.normal(size=(4, n)), dtype)
    res = device_tensor(4 * rng.normal(size=(4, 96)), dtype)[:, :n]  # a view, row stride 96
    res_in = host(res)
    w = torch.from_numpy(rng.normal(1.0, 0.2, size=n).astype(np.float32))
    y = torch.empty(4, n, dtype=x.dtype)
    res_out = res if in_place else torch.empty(4, n, dtype=x.dtype)
    norm.add_rms_norm_kernel[(4,)](x, res, w, y, res_out, 1e-6, 0.0, N=n, X_STRIDE=n, RES_STRIDE=96, Y_STRIDE=n,
                                   RES_OUT_STRIDE=96 if in_place else n, BLOCK=128)
    stored = rounded(host(x) + res_in, dtype)  # one rounding of the exact (fp32-exact) sum
    np.testing.assert_array_equal(host(res_out), stored)
    assert_rounded_close(host(y), ops.ref_rms_norm(stored, w.numpy(), 1e-6), dtype, "add_rms_norm")


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_and_silu_mul(dtype):
    rng = np.random.default_rng(3)
    gate_up = device_tensor(2 * rng.normal(size=(3, 2 * 44)), dtype)  # fused gate_up: two column views
    out = torch.empty(3, 44, dtype=gate_up.dtype)
    g, u = gate_up[:, :44], gate_up[:, 44:]
    elementwise.silu_mul_kernel[(3, 3)](g, u, out, WIDTH=44, GATE_STRIDE=88, UP_STRIDE=88, OUT_STRIDE=44, BLOCK=16)
    assert_rounded_close(host(out), ops.ref_silu_mul(host(g), host(u)), dtype, "silu_mul")
    a = device_tensor(rng.normal(size=(3, 44)), dtype)
    expected = rounded(host(a) + host(out), dtype)
    elementwise.add_kernel[(3, 1)](a, out, a, WIDTH=44, A_STRIDE=44, B_STRIDE=44, OUT_STRIDE=44, BLOCK=64)
    np.testing.assert_array_equal(host(a), expected)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,head_dim,offset", [(4, 16, 0.0), (3, 24, 1.0)])  # Qwen3; Gemma's 1 + w
def test_rms_norm_heads_in_place_on_a_view(dtype, heads, head_dim, offset):
    rng = np.random.default_rng(5)
    width = heads * head_dim
    qkv = device_tensor(3 * rng.normal(size=(5, width + 40)), dtype)  # q: the first columns of a row
    q = qkv[:, :width]
    x_in = host(q)
    w = torch.from_numpy(rng.normal(0.2, 0.3, size=head_dim).astype(np.float32))
    norm.rms_norm_heads_kernel[(5,)](q, w, q, 1e-6, offset, NUM_HEADS=heads, HEAD_DIM=head_dim,
                                     X_STRIDE=width + 40, Y_STRIDE=width + 40,
                                     BLOCK_HEADS=1 << (heads - 1).bit_length(),
                                     BLOCK_D=1 << (head_dim - 1).bit_length())
    ref = ops.ref_rms_norm_heads(x_in, w.numpy(), heads, head_dim, 1e-6, offset)
    assert_rounded_close(host(q), ref, dtype, "rms_norm_heads")


@pytest.mark.parametrize("dtype", DTYPES)
def test_gelu_tanh_mul_and_scale(dtype):
    rng = np.random.default_rng(6)
    gate_up = device_tensor(3 * rng.normal(size=(3, 2 * 44)), dtype)
    g, u = gate_up[:, :44], gate_up[:, 44:]
    out = torch.empty(3, 44, dtype=gate_up.dtype)
    elementwise.gelu_tanh_mul_kernel[(3, 3)](g, u, out, WIDTH=44, GATE_STRIDE=88, UP_STRIDE=88, OUT_STRIDE=44,
                                             BLOCK=16)
    assert_rounded_close(host(out), ops.ref_gelu_tanh_mul(host(g), host(u)), dtype, "gelu_tanh_mul")
    x_in = host(out)
    elementwise.scale_kernel[(3, 1)](out, out, 8.0 ** 0.5, WIDTH=44, X_STRIDE=44, OUT_STRIDE=44, BLOCK=64)
    assert_rounded_close(host(out), ops.ref_scale(x_in, 8.0 ** 0.5), dtype, "scale")


@pytest.mark.parametrize("dtype", DTYPES)
def test_sigmoid_gate_mul(dtype):
    """Qwen2-MoE's shared-expert gate: y * sigmoid(g), g one column of a wider view, in place."""
    rng = np.random.default_rng(8)
    y = device_tensor(2 * rng.normal(size=(3, 44)), dtype)
    gate = device_tensor(3 * rng.normal(size=(3, 5)), dtype)[:, 2:3]  # row stride 5
    y_in = host(y)
    elementwise.sigmoid_gate_mul_kernel[(3, 3)](y, gate, y, WIDTH=44, Y_STRIDE=44, GATE_STRIDE=5, OUT_STRIDE=44,
                                                BLOCK=16)
    assert_rounded_close(host(y), ops.ref_sigmoid_gate_mul(y_in, host(gate)), dtype, "sigmoid_gate_mul")


@pytest.mark.parametrize("dtype", DTYPES)
def test_kv_write_copies_k_and_v_unrotated_to_their_slots(dtype):
    rng = np.random.default_rng(7)
    t, kv_heads, head_dim = 4, 2, 24
    kw = kv_heads * head_dim
    kv = device_tensor(rng.normal(size=(t, 2 * kw + 8)), dtype)
    k, v = kv[:, :kw], kv[:, kw:2 * kw]
    slots = np.array([3, 0, 9, 4], dtype=np.int32)
    shape = (12, kv_heads, head_dim)
    k_cache, v_cache = device_tensor(np.full(shape, 7.0), dtype), device_tensor(np.full(shape, 7.0), dtype)
    rope.kv_write_kernel[(t,)](k, v, torch.from_numpy(slots), k_cache, v_cache, NO_SCALES, NO_SCALES,
                               NUM_KV_HEADS=kv_heads, HEAD_DIM=head_dim, K_STRIDE=2 * kw + 8, V_STRIDE=2 * kw + 8,
                               BLOCK_KV_HEADS=2, BLOCK_D=32, KV_BLOCK_SIZE=4, KV_CODES=0)
    for cache, src in ((k_cache, k), (v_cache, v)):
        assert torch.equal(cache[torch.from_numpy(slots).long()].reshape(t, kw), src)
        untouched = [s for s in range(12) if s not in slots]
        assert bool((cache[untouched] == 7.0).all())


NO_SCALES = torch.empty(0, dtype=torch.float32)  # the scale pointers of a cache without codes


def _rope_constexprs(heads, kv_heads, head_dim, rotary_dim, stride):
    pow2 = lambda n: 1 << (n - 1).bit_length()  # noqa: E731
    return dict(NUM_HEADS=heads, NUM_KV_HEADS=kv_heads, HEAD_DIM=head_dim, ROTARY_DIM=rotary_dim, Q_STRIDE=stride,
                K_STRIDE=stride, V_STRIDE=stride, BLOCK_HEADS=pow2(heads), BLOCK_KV_HEADS=pow2(kv_heads),
                BLOCK_HALF=pow2(rotary_dim // 2), BLOCK_D=pow2(head_dim))


ROPE_CASES = [  # (heads, kv heads, head_dim, rotary_dim, attention_scaling)
    (4, 2, 16, 16, 1.0),
    (6, 2, 32, 16, 1.0),  # partial rotary: the tail of each head passes through
    (3, 3, 24, 24, 0.8),  # head_dim not a power of two; scaled cos/sin (YaRN-style factor)
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads,head_dim,rotary_dim,scaling", ROPE_CASES)
def test_rope_rotates_q_in_place_and_writes_k_v_to_their_cache_slots(dtype, heads, kv_heads, head_dim,
                                                                      rotary_dim, scaling):
    rng = np.random.default_rng(4)
    t, block_size, num_blocks = 5, 4, 6
    qw, kw = heads * head_dim, kv_heads * head_dim
    qkv = device_tensor(rng.normal(size=(t, qw + 2 * kw)), dtype)
    q, k, v = qkv[:, :qw], qkv[:, qw:qw + kw], qkv[:, qw + kw:]
    q_in, k_in, v_in = host(q), host(k), host(v)
    positions = np.array([0, 1, 7, 8, 2000], dtype=np.int32)
    slots = np.array([5, 6, 22, 0, 13], dtype=np.int32)
    inv_freq = (1.0 / 10000 ** (np.arange(0, rotary_dim, 2) / rotary_dim)).astype(np.float32)
    shape = (num_blocks * block_size, kv_heads, head_dim)
    k_cache = device_tensor(np.full(shape, 7.0), dtype)  # sentinel: untouched slots keep it
    v_cache = device_tensor(np.full(shape, 7.0), dtype)
    rope.rope_kv_write_kernel[(t,)](
        q, k, v, torch.from_numpy(positions), torch.from_numpy(slots), torch.from_numpy(inv_freq), k_cache, v_cache,
        NO_SCALES, NO_SCALES, scaling, KV_BLOCK_SIZE=block_size, KV_CODES=0,
        **_rope_constexprs(heads, kv_heads, head_dim, rotary_dim, qkv.shape[1]))
    ref_q = ops.ref_rope(q_in, positions, inv_freq, heads, head_dim, rotary_dim, scaling)
    ref_k = ops.ref_rope(k_in, positions, inv_freq, kv_heads, head_dim, rotary_dim, scaling)
    assert_rounded_close(host(q), ref_q, dtype, "rotated q")
    assert_rounded_close(host(k_cache)[slots].reshape(t, -1), ref_k, dtype, "k cache rows")
    np.testing.assert_array_equal(host(v_cache)[slots].reshape(t, -1), v_in)
    np.testing.assert_array_equal(host(k), k_in)  # k itself is only read
    others = np.setdiff1d(np.arange(shape[0]), slots)
    assert (host(k_cache)[others] == 7.0).all() and (host(v_cache)[others] == 7.0).all()


GEMM_CASES = [  # (M, N, K, bias, tile (BLOCK_M, BLOCK_N, BLOCK_K), parts of K)
    (1, 40, 88, False, (16, 16, 32), 1),   # a decode row; N, K not tile multiples
    (5, 64, 64, True, (16, 32, 32), 1),
    (37, 48, 40, True, (16, 16, 16), 1),   # several M tiles and GROUP_M swizzle
    (20, 24, 136, False, (32, 16, 64), 1),
    (3, 72, 192, True, (16, 32, 64), 3),   # split-K: one program a part of one K block
    (5, 40, 256, False, (16, 16, 32), 4),  # parts of 2 K blocks (parts of one sum as one chain would)
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n,k,bias,tile,split", GEMM_CASES)
def test_gemm(dtype, m, n, k, bias, tile, split):
    rng = np.random.default_rng(5)
    x = device_tensor(rng.normal(size=(m, k + 8)), dtype)[:, :k]  # a view: row stride k + 8
    w = device_tensor(rng.normal(size=(n, k)) / np.sqrt(k), dtype)
    b = torch.from_numpy(rng.normal(size=n).astype(np.float32))
    ref = host(x) @ host(w).T + (b.numpy() if bias else 0.0)
    bm, bn, bk = tile
    tiles = -(-m // bm) * -(-n // bn)
    for out_dtype in (torch.float32, x.dtype):  # logits are fp32; other outputs the act dtype
        y = torch.zeros(m, n + 4, dtype=out_dtype)
        partials, counters = split_k_workspace(tiles, split, bm, bn)
        gemm.gemm_kernel[(tiles, split)](x, w, b, y, partials, counters, m, N=n, K=k, X_STRIDE=k + 8, Y_STRIDE=n + 4,
                                         HAS_BIAS=bias, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=2, SPLIT_K=split,
                                         K_PARTS=split)
        assert not y[:, n:].any()
        assert not counters.any()  # reset by each tile's last program, ready for the next linear
        if out_dtype == torch.float32:
            from tolerances import CUDA_GEMM_FP32_RTOL

            err = np.abs(host(y[:, :n]) - ref).max()
            assert err <= CUDA_GEMM_FP32_RTOL * np.abs(ref).max(), f"fp32 gemm error {err:.3g}"
        else:
            assert_rounded_close(host(y[:, :n]), ref, dtype, "gemm")
    if split == 1:
        return
    xs = device_tensor(rng.normal(size=(128, k + 8)), dtype)[:, :k]

    def launch(rows, bm, one_program_a_part):
        programs = split if one_program_a_part else 1
        out = torch.zeros(rows, n, dtype=torch.float32)
        tiles = -(-rows // bm) * -(-n // bn)
        gemm.gemm_kernel[(tiles, programs)](xs, w, b, out, *split_k_workspace(tiles, programs, bm, bn), rows, N=n, K=k,
                                            X_STRIDE=k + 8, Y_STRIDE=n, HAS_BIAS=bias, BLOCK_M=bm, BLOCK_N=bn,
                                            BLOCK_K=bk, GROUP_M=2, SPLIT_K=programs, K_PARTS=split)
        return out

    assert_row_bits_in_every_bucket(launch, f"gemm in {split} parts")


def _read_quantized_cache(mem: np.ndarray, kind: str, block_size: int, kv_heads: int, head_dim: int):
    """A one-byte cache region (kernels/__init__.py) -> (codes (slots, kv_heads, head_dim),
    scales (slots, kv_heads))."""
    rows = block_size * kv_heads
    blocks = mem.reshape(-1, rows * (head_dim + 4))
    codes = blocks[:, :rows * head_dim].reshape(-1, kv_heads, head_dim)
    scales = np.ascontiguousarray(blocks[:, rows * head_dim:]).view(np.float32).reshape(-1, kv_heads)
    return (codes.view(np.int8) if kind == "int8" else codes), scales


@pytest.mark.parametrize("kind", ["int8", "fp8"])
@pytest.mark.parametrize("heads,kv_heads,head_dim,rotary_dim,scaling", ROPE_CASES)
def test_rope_writes_k_and_v_as_codes_and_scales(kind, heads, kv_heads, head_dim, rotary_dim, scaling):
    """--kv-cache-dtype int8 | fp8: the cache receives quantization/kv_cache.py's codes and
    scales of the rotated K and of V; q is rotated in place as without codes. V (unrotated)
    must match exactly; K is rotated in fp32 (ops.ref_rope in float64), so a K element whose
    scaled value lies within an fp32 rounding of a code boundary may take the neighbouring
    code: at most one step, rarely."""
    rng = np.random.default_rng(8)
    t, block_size, num_blocks = 5, 4, 6
    qw, kw = heads * head_dim, kv_heads * head_dim
    qkv = device_tensor(rng.normal(size=(t, qw + 2 * kw)), "bfloat16")
    q, k, v = qkv[:, :qw], qkv[:, qw:qw + kw], qkv[:, qw + kw:]
    q_in, k_in, v_in = host(q), host(k), host(v)
    positions = np.array([0, 1, 7, 8, 2000], dtype=np.int32)
    slots = np.array([5, 6, 22, 0, 13], dtype=np.int32)
    inv_freq = (1.0 / 10000 ** (np.arange(0, rotary_dim, 2) / rotary_dim)).astype(np.float32)
    caches = [torch.full((num_blocks * block_size * kv_heads * (head_dim + 4),), 0x55, dtype=torch.uint8)
              for _ in range(2)]
    code_type = torch.int8 if kind == "int8" else torch.float8_e4m3fn
    rope.rope_kv_write_kernel[(t,)](
        q, k, v, torch.from_numpy(positions), torch.from_numpy(slots), torch.from_numpy(inv_freq),
        caches[0].view(code_type), caches[1].view(code_type), caches[0].view(torch.float32),
        caches[1].view(torch.float32), scaling, KV_BLOCK_SIZE=block_size, KV_CODES=1 if kind == "int8" else 2,
        **_rope_constexprs(heads, kv_heads, head_dim, rotary_dim, qkv.shape[1]))
    assert_rounded_close(host(q), ops.ref_rope(q_in, positions, inv_freq, heads, head_dim, rotary_dim, scaling),
                         "bfloat16", "rotated q")
    quantize = kvq.quantize_int8 if kind == "int8" else kvq.quantize_fp8
    dequantize = kvq.dequantize_int8 if kind == "int8" else kvq.dequantize_fp8
    ref_k = ops.ref_rope(k_in, positions, inv_freq, kv_heads, head_dim, rotary_dim, scaling)
    for cache, ref, exact in ((caches[0], ref_k, False), (caches[1], v_in, True)):
        codes, scales = _read_quantized_cache(cache.numpy(), kind, block_size, kv_heads, head_dim)
        want_codes, want_scales = quantize(np.asarray(ref, np.float32).reshape(t, kv_heads, head_dim))
        np.testing.assert_allclose(scales[slots], want_scales, rtol=1e-6)
        got, want = dequantize(codes[slots], scales[slots]), dequantize(want_codes, want_scales)
        if exact:
            np.testing.assert_array_equal(codes[slots], want_codes)
        else:  # one step at most: int8 one scale; E4M3 3 mantissa bits (2^-3 relative, or a subnormal step)
            step = want_scales[..., None] * (1.0 if kind == "int8" else np.maximum(np.abs(want) / want_scales[..., None]
                                                                                   * 2.0 ** -3, 2.0 ** -9))
            assert np.all(np.abs(got - want) <= step * (1 + 1e-6))
            assert np.mean(codes[slots] == want_codes) >= 0.98
        untouched = np.setdiff1d(np.arange(num_blocks * block_size), slots)
        assert (codes.view(np.uint8)[untouched] == 0x55).all()


@pytest.mark.parametrize("kind", ["int8", "fp8"])
def test_kv_write_stores_codes_and_scales(kind):
    rng = np.random.default_rng(9)
    t, kv_heads, head_dim, block_size = 4, 2, 24, 4
    kw = kv_heads * head_dim
    kv = device_tensor(rng.normal(size=(t, 2 * kw)) * 3, "bfloat16")
    kv[2, :head_dim] = 0  # a zero row: scale 0, codes 0
    k, v = kv[:, :kw], kv[:, kw:]
    slots = np.array([3, 0, 9, 4], dtype=np.int32)
    caches = [torch.zeros(3 * block_size * kv_heads * (head_dim + 4), dtype=torch.uint8) for _ in range(2)]
    code_type = torch.int8 if kind == "int8" else torch.float8_e4m3fn
    rope.kv_write_kernel[(t,)](k, v, torch.from_numpy(slots), caches[0].view(code_type), caches[1].view(code_type),
                               caches[0].view(torch.float32), caches[1].view(torch.float32), NUM_KV_HEADS=kv_heads,
                               HEAD_DIM=head_dim, K_STRIDE=2 * kw, V_STRIDE=2 * kw, BLOCK_KV_HEADS=2, BLOCK_D=32,
                               KV_BLOCK_SIZE=block_size, KV_CODES=1 if kind == "int8" else 2)
    quantize = kvq.quantize_int8 if kind == "int8" else kvq.quantize_fp8
    for cache, src in zip(caches, (k, v)):
        codes, scales = _read_quantized_cache(cache.numpy(), kind, block_size, kv_heads, head_dim)
        want_codes, want_scales = quantize(host(src).astype(np.float32).reshape(t, kv_heads, head_dim))
        np.testing.assert_array_equal(codes[slots], want_codes)
        np.testing.assert_array_equal(scales[slots], want_scales)


def test_builtins_found_once_are_patched_as_the_interpreter_finds_them():
    """interpreter.enable() finds the language's builtins once instead of before every launch
    and helper call: the attributes it patches, in order, are those the interpreter's own
    inspect.getmembers scan finds at that moment, before any launch and inside one (where the
    enclosing launch has patched triton.language and its tensor, and tl.core's rest remains)."""
    import inspect

    import triton.language as tl
    from triton.runtime import interpreter as interp

    packages = (tl, tl.core, tl.tensor, tl.math, tl.core.tensor_descriptor_base)

    def patched(enclosing: bool) -> tuple[list, list]:
        outer, scope, want = interp._LangPatchScope(), interp._LangPatchScope(), []
        if enclosing:
            for pkg in (tl, tl.tensor):
                interp._patch_builtin(pkg, interp.interpreter_builder, outer)
        try:
            for pkg in packages:
                want += [(id(pkg), name) for name, member in inspect.getmembers(pkg) if tl.core.is_builtin(member)]
                interp._patch_builtin(pkg, interp.interpreter_builder, scope)
            return [(id(obj), name) for obj, name, _ in scope._changes], want
        finally:
            scope.restore()
            outer.restore()

    for enclosing in (False, True):
        got, want = patched(enclosing)
        assert got == want and len(got) > (0 if enclosing else 100), enclosing


def test_remembered_np_dtypes_and_lazy_tuple_names_equal_the_interpreters():
    """The other speed fixes of interpreter.enable(): the NumPy dtype of every scalar, block
    and pointer type is the one the interpreter's own function (kept as __wrapped__) gives,
    asked twice (computed, then remembered); a tuple type's name is the one triton 3.6 formats
    in tuple_type.__init__ (these strings, a block's shape as its tl.tuple prints)."""
    import triton.language as tl
    from triton.runtime import interpreter as interp

    original = interp._get_np_dtype.__wrapped__
    scalars = [tl.int1, tl.int8, tl.uint8, tl.int16, tl.uint16, tl.int32, tl.uint32, tl.int64, tl.uint64,
               tl.float16, tl.bfloat16, tl.float32, tl.float64, tl.float8e5, tl.float8e4nv, tl.float8e4b15]
    types = scalars + [tl.block_type(s, [4, 8]) for s in scalars] + [tl.pointer_type(tl.float32),
                                                                     tl.block_type(tl.pointer_type(tl.bfloat16), [16])]
    for _ in range(2):
        assert [interp._get_np_dtype(t) for t in types] == [original(t) for t in types]
    shape = tl.tuple([tl.constexpr(4), tl.constexpr(8)])
    assert shape.type.name == str(shape.type) == "[:constexpr_type[4],:constexpr_type[8]]"
    named = tl.core.tuple_type([tl.float32, tl.block_type(tl.int8, [2])], ["a", "b"])
    assert named.name == str(named) == "[a:fp32,b:<['2'], int8>]"
