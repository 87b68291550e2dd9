"""Running the cuda target's Triton kernels on CPU with the Triton interpreter.

The interpreter (TRITON_INTERPRET=1, read when a kernel module is imported) executes
`@triton.jit` functions with NumPy on CPU torch tensors. Triton 3.6's interpreter differs
from the GPU in four ways this module fixes:
- tl.dot on bf16 operands multiplies their 16-bit patterns as integers: operands are
  widened to fp32 first (a tensor core multiplies bf16 exactly and accumulates in fp32);
  and an fp32 tl.dot is NumPy's fp32 matmul, whose BLAS picks its kernel (and so the order
  of an element's sums) by the tile's shape: a row's value then depends on how many rows the
  tile has, which on a GPU it does not. fp32 tiles are multiplied in fp64 and rounded once;
- fp32 -> bf16 conversion truncates (and its "round to nearest" loses the carry): the GPU
  rounds to nearest even (cvt.rn.bf16.f32), which is what it does here now;
- fp32 -> fp8 E4M3 conversion misrounds ~3-5% of values by one step: the GPU rounds to
  nearest even and saturates (cvt.rn.satfinite.e4m3x2.f32), as quantization/fp8.py does;
- with NumPy >= 2.4 a loop bound or index loaded from memory fails to convert to int.
And one guard: bf16 arithmetic, which it computes on bit patterns, raises instead of
giving silent garbage (the kernels convert loads to fp32 before any arithmetic).
Speed fixes (what is computed stays the same): the interpreter patches triton.language's
builtins before every launch and every call of a @triton.jit helper inside a kernel, finding
them each time with inspect.getmembers over the language modules, a fifth of an interpreted
plan's time; the names of the builtins are found once here (what is patched, and in which
order, is the same). Its NumPy dtype of a Triton type builds a dict of every type on each of
its tens of thousands of calls a step, and every tl.tuple (each tensor's shape is one) formats
its type's name eagerly: together about a sixth of an interpreted step; the dtypes are
remembered per element type here, and a tuple type's name is formatted when it is read. A
tl.tuple's type and a block type's name, built eagerly for each of an op's several tensors and
rarely read, are built when read (about a tenth less CPU on an interpreted test file). These
replace triton 3.6's own __init__s (setup.py pins that version). interpreter_fast_paths.py holds
the rest: the int32 overflow checks whose assert is dropped, a helper call's re-patching of the
language inside a launch, and block types', dtypes' and tensors' bookkeeping.

Bit for bit, then, the interpreter computes what the GPU computes where the kernels use
only exactly rounded fp32 operations in a fixed order: loads, stores, conversions,
max/min, tl.math.div_rn, and multiply-then-add in the kernels compiled without FMA fusion
(kernels/__init__.py: the one-byte KV writes, the fp8 activation codes). Elsewhere the
GPU's fp32 differs by rounding, and the tests give a tolerance for it: fp32 `/` is
div.full.f32 (up to 2 ulp), tl.exp/exp2 ex2.approx, tl.rsqrt rsqrt.approx, tl.cos/sin
libdevice's (each a few ulp), a * b + c in the other kernels one FMA, and tl.sum and tl.dot
accumulate in another order.

enable() must run in a process whose TRITON_INTERPRET=1 was set before any kernel module
was imported; AOT compilation (compile.py) cannot run in such a process, which is why
it runs in worker processes started without it.
"""

from __future__ import annotations

import os

import numpy as np

from bessemer.errors import BessemerError
from bessemer.targets.cuda import interpreter_fast_paths

_MARK = "_bessemer_patched"


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def enable() -> None:
    """Checks the process interprets Triton and installs the fixes (idempotent)."""
    if not interpreting():
        raise BessemerError("the Triton interpreter is off; set TRITON_INTERPRET=1 before starting Python "
                            "to run cuda kernels on CPU")
    from triton.runtime import interpreter as interp

    if getattr(interp, _MARK, False):
        return
    import triton.language as tl

    builder = interp.InterpreterBuilder
    original_dot = builder.create_dot

    def widened(h):
        if h.dtype.scalar == tl.bfloat16:
            return interp.TensorHandle(_bf16_bits_to_f32(h.data), tl.float32)
        return h

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        a, b = widened(a), widened(b)
        if a.dtype.scalar == tl.float32 and b.dtype.scalar == tl.float32 and d.dtype.scalar == tl.float32:
            # Each product of two fp32 values is exact in fp64 and a tile's K (<= 256) adds no
            # error that survives the rounding to fp32: an element's value does not depend on
            # how NumPy's BLAS blocks the tile, which it chooses by the tile's shape
            tile = np.matmul(a.data.astype(np.float64), b.data.astype(np.float64)).astype(np.float32)
            return interp.TensorHandle(tile + d.data, d.dtype.scalar)
        return original_dot(self, a, b, d, input_precision, max_num_imprecise_acc)

    original_convert = interp._convert_float

    def convert_float(data, src, dst, rounding_mode):
        if src == tl.float32 and dst == tl.bfloat16:
            return _f32_to_bf16_bits(np.asarray(data, dtype=np.float32))
        if src == tl.float32 and dst == tl.float8e4nv:  # the interpreter's own cast misrounds ~3%
            return _f32_to_e4m3_bits(np.asarray(data, dtype=np.float32))
        return original_convert(data, src, dst, rounding_mode)

    original_binary = builder.binary_op

    def binary_op(self, lhs, rhs, op):
        if lhs.dtype.scalar == tl.bfloat16 or rhs.dtype.scalar == tl.bfloat16:
            raise TypeError("bf16 arithmetic in a kernel: the interpreter computes it on bit patterns; "
                            "convert loads to fp32 first (.to(tl.float32))")
        return original_binary(self, lhs, rhs, op)

    original_patch_tensor = interp._patch_lang_tensor

    def patch_lang_tensor(tensor, scope):
        original_patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).reshape(-1)[0]))

    import inspect

    # the names of each language module's (or class's) builtins, in getmembers' order, found
    # before any launch has patched them (a patched builtin is a plain function)
    packages = (tl, tl.core, tl.core.tensor, tl.math, tl.core.tensor_descriptor_base)
    builtin_names = {id(pkg): [name for name, member in inspect.getmembers(pkg) if tl.core.is_builtin(member)]
                     for pkg in packages}
    original_patch_builtin = interp._patch_builtin

    def patch_builtin(pkg, builder, scope):
        names = builtin_names.get(id(pkg))
        if names is None:
            return original_patch_builtin(pkg, builder, scope)
        for name in names:
            member = getattr(pkg, name)
            if tl.core.is_builtin(member):  # as the original: what an enclosing launch patched stays
                interp._patch_attr(pkg, name, member, builder, scope)

    builder.create_dot = create_dot
    builder.binary_op = binary_op
    interp._patch_builtin = patch_builtin
    interp._get_np_dtype = _remembered_np_dtypes(interp._get_np_dtype, tl)
    _format_tuple_type_names_when_read(tl.core.tuple_type)
    _type_tuples_when_read(tl.core)
    interpreter_fast_paths.install(interp, tl)
    interp._convert_float = convert_float
    interp._patch_lang_tensor = patch_lang_tensor
    setattr(interp, _MARK, True)


def _remembered_np_dtypes(np_dtype_of, tl):
    """np_dtype_of (the interpreter's Triton type -> NumPy storage dtype), remembered per
    element type: a block's dtype is its element's, a pointer's uint64 (unhashable: not kept)."""
    import functools

    known: dict = {}

    @functools.wraps(np_dtype_of)
    def remembered(tt_dtype):
        element = tt_dtype.element_ty if isinstance(tt_dtype, tl.block_type) else tt_dtype
        if isinstance(element, tl.pointer_type):
            return np_dtype_of(element)
        if element not in known:
            known[element] = np_dtype_of(element)
        return known[element]

    return remembered


def _format_tuple_type_names_when_read(tuple_type) -> None:
    """tuple_type.name as triton formats it, computed on each read instead of in __init__."""
    def __init__(self, types, fields=None):
        self.types = types
        self.fields = fields or [''] * len(types)

    tuple_type.__init__ = __init__
    tuple_type.name = property(lambda self: '[' + ','.join([f"{k}:{v}" for k, v in zip(self.fields, self.types)]) + ']')


def _type_tuples_when_read(core) -> None:
    """tl.tuple's type (a tuple_type of its values' types) built on first read instead of in
    __init__: every tensor's shape is a tl.tuple, and few of them have their type read. The
    values of a tl.tuple change only through _setitem, which sets the type it computes."""
    tuple_cls, tuple_type = core.tuple, core.tuple_type

    def __init__(self, args, type=None):
        self.values = [i for i in args]
        if isinstance(type, tuple_type):
            self._type = type
        elif type is not None:  # make_template in ASTFunction.deserialize may pass a list/tuple
            self._type = tuple_type(type)
        else:
            self._type = None

    def get_type(self):
        if self._type is None:
            self._type = core._type_for_tuple_values(self.values)
        return self._type

    def set_type(self, value):
        self._type = value

    tuple_cls.__init__ = __init__
    tuple_cls.type = property(get_type, set_type)


def _bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits).astype(np.uint32) << 16).view(np.float32)


def _f32_to_e4m3_bits(x: np.ndarray) -> np.ndarray:
    """Round to nearest even, saturating at +-448: what sm_90's cvt.rn.satfinite.e4m3x2.f32 does."""
    from bessemer.quantization.fp8 import encode_e4m3

    return encode_e4m3(x).reshape(np.shape(x))


def _f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    from bessemer.format.dtypes import to_bfloat16_bits

    return to_bfloat16_bits(x).reshape(np.shape(x))
