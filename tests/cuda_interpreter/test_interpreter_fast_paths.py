"""The fast paths interpreter.enable() installs (bessemer/targets/cuda/interpreter_fast_paths.py)
give what triton 3.6's code gives: the values, the errors and their messages written out here as
triton's code computes them, and an overflow check that still asserts where the interpreter
would assert (debug on). The interpreted kernel tests check the kernels' values through them."""

import dataclasses
import re

import numpy as np
import pytest

from interp_support import torch  # importing it installs the interpreter fixes

import triton
import triton.language as tl
from triton.runtime import interpreter as interp


def _int32(values):
    return tl.tensor(interp.TensorHandle(np.array(values, np.int32), tl.int32), tl.block_type(tl.int32, [len(values)]))


def test_int32_overflow_check_asserts_only_when_the_interpreter_would():
    near = np.iinfo(np.int32).max
    for op in ("add", "sub", "mul"):
        lhs, rhs = _int32([near, 3]), _int32([-near if op == "sub" else near, 4])
        quiet = interp.TritonSemantic(interp.InterpreterBuilder())
        got = getattr(quiet, op)(lhs, rhs, sanitize_overflow=True).handle.data
        want = getattr(np, {"add": "add", "sub": "subtract", "mul": "multiply"}[op])(lhs.handle.data, rhs.handle.data)
        np.testing.assert_array_equal(got, want)  # wrapped, as the GPU's int32 arithmetic
        debug = interp.InterpreterBuilder()
        debug.options = dataclasses.replace(debug.options, debug=True)
        with pytest.raises(AssertionError, match=f"int32 overflow detected for operation {op}"):
            getattr(interp.TritonSemantic(debug), op)(lhs, rhs, sanitize_overflow=True)


def _tensor(shape, dtype=tl.float32, seed=0):
    if shape is None:  # a scalar
        return tl.tensor(interp.TensorHandle(np.array([seed + 0.5], np.float32), dtype), dtype)
    data = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return tl.tensor(interp.TensorHandle(data, dtype), tl.block_type(dtype, list(shape)))


def test_implicit_broadcasts_give_what_tritons_code_gives():
    sem = interp.TritonSemantic(interp.InterpreterBuilder())
    fast = interp.TritonSemantic.broadcast_impl_value
    triton_s = fast.__wrapped__
    shapes = [((4, 8), (4, 8)), ((4, 1), (1, 8)), ((1, 8), (4, 8)), ((4, 8), (4, 1)), ((1, 1), (4, 8)),
              ((8,), (4, 8)), ((4, 8), (8,)), ((2, 4, 8), (4, 1)), ((4, 8), None), (None, (1, 8)), (None, None)]
    for a, b in shapes:
        lhs, rhs = _tensor(a, seed=1), _tensor(b, seed=2)
        for got, want in zip(fast(sem, lhs, rhs), triton_s(sem, lhs, rhs)):
            assert got.type == want.type and got.handle.dtype == want.handle.dtype, (a, b, got.type, want.type)
            np.testing.assert_array_equal(got.handle.data, want.handle.data)
    # a pointer block with an int32 scalar (an address offset)
    ptr = tl.tensor(interp.TensorHandle(np.arange(4, dtype=np.uint64), tl.pointer_type(tl.float32)),
                    tl.block_type(tl.pointer_type(tl.float32), [4]))
    off = tl.tensor(interp.TensorHandle(np.array([3], np.int32), tl.int32), tl.int32)
    for got, want in zip(fast(sem, ptr, off), triton_s(sem, ptr, off)):
        assert got.type == want.type
        np.testing.assert_array_equal(got.handle.data, want.handle.data)
    for a, b in (((4, 8), (8, 4)), ((4, 8), (2, 8))):
        with pytest.raises(ValueError) as want:
            triton_s(sem, _tensor(a), _tensor(b))
        with pytest.raises(ValueError, match=re.escape(str(want.value))):
            fast(sem, _tensor(a), _tensor(b))


def test_operands_of_one_type_are_checked_as_tritons_code_checks_them():
    """Same-type tensors (the fast path): the computation type's casts (fp16 and bf16 divide
    in fp32) and the broadcast; numbers, pointers and mixed types (triton's own code)."""
    sem = interp.TritonSemantic(interp.InterpreterBuilder())
    fast = interp.TritonSemantic.binary_op_type_checking_impl
    triton_s = fast.__wrapped__
    f16 = lambda shape: tl.tensor(interp.TensorHandle(np.full(shape, 1.5, np.float16), tl.float16),  # noqa: E731
                                  tl.block_type(tl.float16, list(shape)))
    i32 = lambda shape: tl.tensor(interp.TensorHandle(np.arange(np.prod(shape), dtype=np.int32).reshape(shape),  # noqa: E731
                                                      tl.int32), tl.block_type(tl.int32, list(shape)))
    cases = [(f16((4, 8)), f16((4, 1)), {}), (f16((4, 8)), f16((4, 8)), {"div_or_mod": True}),
             (i32((4, 1)), i32((1, 8)), {"div_or_mod": True}), (i32((4, 8)), i32((4, 8)), {"arithmetic_check": False}),
             (_tensor((4, 8)), _tensor(None), {}), (_tensor((4, 8)), 2, {}), (3.0, i32((4,)), {}),
             (_tensor((4, 8)), i32((4, 8)), {}), (f16((2,)), _tensor((2,)), {"div_or_mod": True})]
    for lhs, rhs, kwargs in cases:
        for got, want in zip(fast(sem, lhs, rhs, **kwargs), triton_s(sem, lhs, rhs, **kwargs)):
            assert got.type == want.type, (kwargs, got.type, want.type)
            np.testing.assert_array_equal(got.handle.data, want.handle.data)
    ptr = tl.tensor(interp.TensorHandle(np.arange(4, dtype=np.uint64), tl.pointer_type(tl.float32)),
                    tl.block_type(tl.pointer_type(tl.float32), [4]))
    for call in (fast, triton_s):  # pointer + pointer refused unless the caller allows it
        with pytest.raises(triton.language.semantic.IncompatibleTypeErrorImpl):
            call(sem, ptr, ptr)


def test_block_types_are_built_checked_named_and_compared_as_triton_does():
    for shape in ([4, 8], [tl.constexpr(4), 8], tl.tuple([4, tl.constexpr(8)])):
        ty = tl.block_type(tl.float32, shape)
        assert ty.shape.values == [4, 8] and isinstance(ty.shape, tl.tuple) and ty.numel == 32
        assert ty.name == str(ty) == "<['4', '8'], fp32>"
    with pytest.raises(TypeError, match="0d block_type is forbidden"):
        tl.block_type(tl.float32, [])
    with pytest.raises(ValueError, match="Shape element 1 must be a power of 2"):
        tl.block_type(tl.float32, [4, 6])
    with pytest.raises(TypeError, match="Shape element 0 must have type"):
        tl.block_type(tl.float32, [4.0])
    a = tl.block_type(tl.float32, [4, 8])
    assert a == tl.block_type(tl.float32, [tl.constexpr(4), 8])
    assert a != tl.block_type(tl.float32, [8, 4]) and a != tl.block_type(tl.int32, [4, 8])
    assert a != tl.block_type(tl.float32, [4, 8, 1]) and a != tl.float32 and not a == [4, 8]


def test_dtype_equality_as_triton_compares():
    assert tl.float32 == tl.float32 and tl.float32 == tl.constexpr(tl.float32)
    assert tl.float32 != tl.int32 and tl.float32 != tl.constexpr(tl.int32)
    assert not tl.float32 == "fp32" and not tl.float32 == [tl.float32] and not tl.float32 == (tl.float32, )
    assert tl.float32 != tl.pointer_type(tl.float32) and tl.float32 != tl.block_type(tl.float32, [4])


def test_tensor_shape_and_numel_as_triton_builds_them():
    block = tl.tensor(interp.TensorHandle(np.zeros((4, 8), np.float32), tl.float32), tl.block_type(tl.float32, [4, 8]))
    assert isinstance(block.shape, tl.tuple) and block.shape.values == [tl.constexpr(4), tl.constexpr(8)]
    assert all(isinstance(s, tl.constexpr) for s in block.shape) and block.numel == tl.constexpr(32)
    assert block.dtype == tl.float32 and block.type == tl.block_type(tl.float32, [4, 8])
    scalar = tl.tensor(interp.TensorHandle(np.zeros(1, np.int32), tl.int32), tl.int32)
    assert isinstance(scalar.shape, tl.tuple) and len(scalar.shape) == 0 and scalar.numel == tl.constexpr(1)
    block.shape = tl.tuple([tl.constexpr(32)])  # assignable, as triton's attribute
    assert block.shape.values == [tl.constexpr(32)]


@triton.jit
def _row_sums(x_ptr, out_ptr, N: tl.constexpr):
    # a helper (tl.sum, itself a jitted function that sees tl.core) inside a launch
    rows = tl.program_id(0)
    out = tl.sum(tl.load(x_ptr + rows * N + tl.arange(0, N)).to(tl.float32), axis=0)
    tl.store(out_ptr + rows, out)


def test_a_launch_patches_the_language_and_restores_it():
    builtins_before = {name for name in dir(tl) if tl.core.is_builtin(getattr(tl, name))}
    x = torch.arange(24, dtype=torch.float32).reshape(3, 8)
    out = torch.zeros(3)
    for _ in range(2):  # the second launch: tl.core's helper patches already in place
        _row_sums[(3, )](x, out, N=8)
        np.testing.assert_array_equal(out.numpy(), x.numpy().sum(axis=1))
    assert {name for name in dir(tl) if tl.core.is_builtin(getattr(tl, name))} == builtins_before
    assert not getattr(interp, "_bessemer_in_launch", False) and not getattr(tl, "_bessemer_launch_patched", False)
