"""Faster equivalents of triton 3.6's interpreter and language internals (setup.py pins that
version), installed by interpreter.enable(): each computes what the code it replaces computes,
with less Python per interpreted operation. An interpreted kernel runs every tl operation of
every program through triton's semantic layer, so its type and shape bookkeeping, not NumPy,
is most of an interpreted test's time.
"""

from __future__ import annotations

import math

# marks on triton's modules (see _patch_each_language_once_a_launch)
_IN_LAUNCH = "_bessemer_in_launch"
_LAUNCH_PATCHED = "_bessemer_launch_patched"
_HELPER_PATCHED = "_bessemer_helper_patched"


def install(interp, tl) -> None:
    core = tl.core
    _skip_unasserted_overflow_checks(interp)
    _faster_broadcasts(interp, core)
    _same_type_operands_checked_once(interp, tl)
    _builtins_called_directly(interp, core)
    _patch_each_language_once_a_launch(interp, tl)
    _faster_block_types(core)
    _faster_dtype_equality(core)
    _tensor_shapes_when_read(core)


def _skip_unasserted_overflow_checks(interp) -> None:
    """TritonSemantic.binary_op_sanitize_overflow_impl, run on every int32 add, sub and mul,
    redoes the operation in int64, compares it with the type's range and hands the result to
    device_assert, which does nothing unless options.debug (the interpreter's options: debug
    off, as in the engines' compiled kernels). Nothing it computes can raise (both operands
    already have the same int type), so when the assert would be dropped, the check is skipped."""
    semantic_cls = interp.TritonSemantic
    original = semantic_cls.binary_op_sanitize_overflow_impl
    builder_cls = interp.InterpreterBuilder

    def binary_op_sanitize_overflow_impl(self, lhs, rhs, binary_op):
        if isinstance(self.builder, builder_cls) and not self.builder.options.debug:
            return None
        return original(self, lhs, rhs, binary_op)

    semantic_cls.binary_op_sanitize_overflow_impl = binary_op_sanitize_overflow_impl


def _faster_broadcasts(interp, core) -> None:
    """TritonSemantic.broadcast_impl_value, the implicit broadcast of every binary operation's
    operands, compares shapes as tl.tuples (each comparison normalises both sides and wraps its
    answer in a constexpr) and builds a splat's IR type only for create_splat to read its shape:
    a fifth of an interpreted kernel's time. Here, under the interpreter's builder, two blocks of
    one rank compare their shapes as the int lists they hold, and a splat gets its block type
    directly; blocks of different ranks, and every other builder (the compiler's), take
    triton's code. The values, types and error messages are triton's."""
    semantic_cls, builder_cls, block_type = interp.TritonSemantic, interp.InterpreterBuilder, core.block_type
    original = semantic_cls.broadcast_impl_value

    def broadcast_impl_value(self, lhs, rhs):
        if not isinstance(self.builder, builder_cls):
            return original(self, lhs, rhs)
        lhs_ty, rhs_ty = lhs.type, rhs.type
        lhs_block, rhs_block = lhs_ty.is_block(), rhs_ty.is_block()
        if lhs_block and rhs_block:
            lhs_shape, rhs_shape = lhs_ty.shape.values, rhs_ty.shape.values
            if lhs_shape == rhs_shape:
                return lhs, rhs
            if len(lhs_shape) != len(rhs_shape):
                return original(self, lhs, rhs)
            shape = []
            for i, (left, right) in enumerate(zip(lhs_shape, rhs_shape)):
                if left == 1:
                    shape.append(right)
                elif right == 1 or right == left:
                    shape.append(left)
                else:
                    raise ValueError("Cannot make_shape_compatible: incompatible dimensions "
                                     "at index " + str(i) + ": " + str(left) + " and " + str(right))
            if lhs_shape != shape:
                lhs = self.tensor(self.builder.create_broadcast(lhs.handle, shape), block_type(lhs_ty.scalar, shape))
            if rhs_shape != shape:
                rhs = self.tensor(self.builder.create_broadcast(rhs.handle, shape), block_type(rhs_ty.scalar, shape))
            return lhs, rhs
        if lhs_block:  # make_shape_compatible(block, scalar): the interpreter's splat reads the shape
            ty = block_type(rhs_ty.scalar, lhs_ty.shape)
            return lhs, self.tensor(self.builder.create_splat(ty, rhs.handle), ty)
        if rhs_block:
            ty = block_type(lhs_ty.scalar, rhs_ty.shape)
            return self.tensor(self.builder.create_splat(ty, lhs.handle), ty), rhs
        return lhs, rhs

    broadcast_impl_value.__wrapped__ = original  # triton's, the oracle of its test
    semantic_cls.broadcast_impl_value = broadcast_impl_value


def _same_type_operands_checked_once(interp, tl) -> None:
    """TritonSemantic.binary_op_type_checking_impl for two tensors of one non-pointer scalar
    type, the common case: neither is a Python number (no constant to build or range-check)
    and neither a pointer (nothing for check_ptr_type_impl to refuse), so what remains is the
    computation type (remembered per operand type: a pure function of it, computed by
    triton's own code the first time), the casts to it when it differs, and the broadcast.
    Other operands, and every other builder, take triton's code."""
    semantic_cls, builder_cls, tensor_cls = interp.TritonSemantic, interp.InterpreterBuilder, tl.core.tensor
    original = semantic_cls.binary_op_type_checking_impl
    computation_types: dict = {}  # (scalar type, div_or_mod) -> computation type

    def binary_op_type_checking_impl(self, lhs, rhs, allow_lhs_ptr=False, allow_rhs_ptr=False,
                                     arithmetic_check=True, div_or_mod=False):
        if not (isinstance(self.builder, builder_cls) and isinstance(lhs, tensor_cls) and isinstance(rhs, tensor_cls)):
            return original(self, lhs, rhs, allow_lhs_ptr, allow_rhs_ptr, arithmetic_check, div_or_mod)
        scalar = lhs.type.scalar
        if scalar.is_ptr() or rhs.type.scalar != scalar:
            return original(self, lhs, rhs, allow_lhs_ptr, allow_rhs_ptr, arithmetic_check, div_or_mod)
        if arithmetic_check:
            key = (scalar, div_or_mod)
            ret = computation_types.get(key)
            if ret is None:
                ret = computation_types[key] = self.computation_type_impl(scalar, False, scalar, False, div_or_mod)
            if ret != scalar:
                lhs, rhs = self.cast(lhs, ret), self.cast(rhs, ret)
        return self.broadcast_impl_value(lhs, rhs)

    binary_op_type_checking_impl.__wrapped__ = original  # triton's, the oracle of its test
    semantic_cls.binary_op_type_checking_impl = binary_op_type_checking_impl


def _builtins_called_directly(interp, core) -> None:
    """A launch replaces each tl builtin with a lambda that copies the call's keyword arguments
    without `_semantic`, adds its own TritonSemantic, and calls the builtin's wrapper, which
    checks that `_semantic` is there and calls the function. For the builtins made by
    core.builtin (all but a few), the replacement here sets `_semantic` in the call's own
    keyword dict (a fresh one each call) and calls the function the wrapper wraps: the same
    call, one frame and one dict copy fewer, on every interpreted operation."""
    original = interp._patch_attr
    wrapper_code = core.builtin(lambda: None).__code__

    def _patch_attr(obj, name, member, builder, scope):
        fn = getattr(member, "__wrapped__", None)
        if getattr(member, "__code__", None) is not wrapper_code or fn is None:
            return original(obj, name, member, builder, scope)
        semantic = interp.TritonSemantic(builder)

        def new_member(*args, **kwargs):
            kwargs["_semantic"] = semantic
            return fn(*args, **kwargs)

        scope.set_attr(obj, name, new_member)

    interp._patch_attr = _patch_attr


def _patch_each_language_once_a_launch(interp, tl) -> None:
    """The interpreter patches the language modules a jitted function sees (its globals' tl and
    tl.core) before every launch, restoring them after, and again at every call of a @triton.jit
    helper inside the kernel (tl.sum, a kernel module's helpers), never restoring those. A
    helper call's patching changes nothing inside a launch for a module that is already patched:
    one the launch patched (until it restores it), or one an earlier helper call patched (its
    patches are never restored; what it shares with the launches, the tensor and dtype classes
    and tl.reduce, every launch patches itself). It still scans the helper's globals and every
    builtin's name to find that out, a seventh of an interpreted test. Here a launch marks, in
    its own patch scope (so the marks go when it restores), that it runs and which modules it
    patched; a helper call patching a module outside them marks that module for good, as its
    patches are; a helper call inside a launch whose modules are all marked skips the patching,
    any other call patches as the interpreter does."""
    original_patch_lang = interp._patch_lang
    core = tl.core

    def languages_of(fn):
        # the interpreter's own test (modules compare by identity): fn's globals that are tl or tl.core
        return [value for value in fn.__globals__.values() if value is tl or value is core]

    def patch_lang(fn):
        scope = original_patch_lang(fn)
        scope.set_attr(interp, _IN_LAUNCH, True)
        for lang in languages_of(fn):
            scope.set_attr(lang, _LAUNCH_PATCHED, True)
        return scope

    def patched(lang) -> bool:
        return getattr(lang, _LAUNCH_PATCHED, False) or getattr(lang, _HELPER_PATCHED, False)

    def __call__(self, *args, **kwargs):
        langs = languages_of(self.fn)
        if not (getattr(interp, _IN_LAUNCH, False) and all(patched(lang) for lang in langs)):
            unpatched = [lang for lang in langs if not getattr(lang, _LAUNCH_PATCHED, False)]
            original_patch_lang(self.fn)
            for lang in unpatched:
                setattr(lang, _HELPER_PATCHED, True)
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise interp.InterpreterError(repr(e)) from e

    interp._patch_lang = patch_lang  # GridExecutor.__call__, a launch, looks it up at each call
    interp.InterpretedFunction.__call__ = __call__


def _faster_block_types(core) -> None:
    """block_type.__init__ and __eq__ without the generic constexpr unwrapping where the shape
    holds plain ints (always, but for shapes written with tl.constexpr values): the same shape
    list, validated by the same function, and the same comparison. The name is formatted on
    read (str reads it; most of the interpreter's block types are never printed)."""
    block_type, tl_tuple = core.block_type, core.tuple
    validate, unwrap = core.validate_block_shape, core._unwrap_shape

    def plain_ints(shape):
        values = shape.values if isinstance(shape, tl_tuple) else shape
        for s in values:
            if type(s) is not int:
                return unwrap(shape)
        return list(values)

    def __init__(self, element_ty, shape):
        self.element_ty = element_ty
        # `tuple` in triton's core.py is its own tl.tuple, which shadows the builtin
        assert isinstance(shape, (list, tl_tuple))
        shape = plain_ints(shape)
        if not shape:
            self.shape = tl_tuple(shape)
            raise TypeError('0d block_type is forbidden')
        self.numel = validate(shape)
        self.shape = tl_tuple(shape)

    def __eq__(self, other):
        # triton's compares the shapes' tl.tuples: their values (ints) as lists
        if not isinstance(other, block_type):
            return False
        return self.element_ty == other.element_ty and self.shape.values == other.shape.values

    block_type.__init__ = __init__
    block_type.__eq__ = __eq__
    block_type.name = property(lambda self: f'<{self.shape}, {self.element_ty}>')


def _faster_dtype_equality(core) -> None:
    """dtype.__eq__ (scalar types, and the types that do not define their own) unwraps `other`
    with _unwrap_if_constexpr, whose list and tuple cases give a list or tuple, never a dtype:
    only a constexpr's value can be one, so only a constexpr is unwrapped here."""
    dtype, constexpr = core.dtype, core.constexpr

    def __eq__(self, other):
        if isinstance(other, constexpr):
            other = other.value
        return isinstance(other, dtype) and self.name == other.name

    dtype.__eq__ = __eq__


def _tensor_shapes_when_read(core) -> None:
    """tl.tensor's shape (a tl.tuple of constexprs) and numel (a constexpr), built in __init__
    for every tensor and read for few, built from the tensor's type on first read instead."""
    tensor, constexpr, tl_tuple = core.tensor, core.constexpr, core.tuple

    def __init__(self, handle, type):
        self.handle = handle
        self.type = type
        self.dtype = type.scalar
        self._shape_type = type

    def block_shape(self):
        ty = self._shape_type
        return ty.shape if ty.is_block() else ()

    def get_shape(self):
        shape = self.__dict__.get("_shape")
        if shape is None:
            shape = self._shape = tl_tuple([constexpr(s) for s in block_shape(self)])
        return shape

    def set_shape(self, value):
        self._shape = value

    def get_numel(self):
        numel = self.__dict__.get("_numel")
        if numel is None:
            numel = self._numel = constexpr(math.prod(block_shape(self)))
        return numel

    def set_numel(self, value):
        self._numel = value

    tensor.__init__ = __init__
    tensor.shape = property(get_shape, set_shape)
    tensor.numel = property(get_numel, set_numel)
