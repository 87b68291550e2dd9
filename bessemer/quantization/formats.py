"""Stored quantization formats: one class per way a quantized weight lies in an engine.

A format owns what is true of its stored weight on every target:
- parts(shape): the tensors it is stored as (codes and their parameters), in file and
  kernel order, each with its element type (format/dtypes.py names);
- quantize(rows, calib): fp32 rows (N, K) -> the parts' values (unpacked arrays), with the
  algorithm the build chose (round to nearest, or GPTQ given the input's Hessian);
- tensor-parallel slicing: whether a K shard must be quantized on whole rows, how a K
  shard's parts are cut, and where a K cut is not allowed (the shard pass asks these for
  dense linears and for experts alike);
- pack(role, values, layout): a part's values -> the bytes of the layout a target chose;
- stats(w, q): the build report's error line for the weight.
Which layout each part is stored in and which kernel reads it are the target's choices
(targets/<name>/lowering.py maps each format class to them). The algorithms that pick
scales (RTN, AWQ, GPTQ, SmoothQuant) live beside this module; a format never names one.

    Int8PerChannel  int8 codes + fp32 scale per output channel (w8a16; the int8 lm_head,
                    and the embedding table it shares when tied)
    Int4Group       4-bit codes + bf16 scale (and, asymmetric, offset) per group of K (w4a16*)
    Int4SuperBlock  4-bit codes, an 8-bit scale and minimum per 32 of K under an fp16 scale
                    and minimum per super-block of up to 256 (w4k; quantization/superblock.py)
    Int4GroupA8     Int4Group's symmetric codes and scales for the int4 x int8 kernel: the
                    activations are quantized to int8 per row and group inside it (w4a8)
    W8A8            int8 codes + scales + per-channel code sums (+ SmoothQuant 1/s) for the
                    int8 x int8 kernel (w8a8-sq)
    Fp8E4M3         E4M3 codes + fp32 channel scales (+ the static input scale) (fp8)
    ExpertStack     a mixture of experts' matrices, each expert's (N, K) in a dense format
                    above, stacked as (E*N, K) rows (w8a16, w4a16, fp8 experts: expert_format)
    Mxfp4Experts    experts in MXFP4 as gpt-oss ships them: E2M1 codes + E8M0 scale per 32
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from bessemer.errors import InvalidOptionError
from bessemer.format import layouts
from bessemer.format.dtypes import bfloat16_bits_to_float32, to_bfloat16_bits
from bessemer.quantization import primitives as prim


@dataclass(frozen=True)
class Part:
    role: str  # codes | scales | offsets | wsum | smooth | input_scale
    suffix: str  # appended to the weight's name ("" for the codes: the weight's own name)
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class WeightCalibration:
    """What calibration knows of one weight's input (all optional)."""

    hessian: np.ndarray | None = None  # (K_full, K_full): codes chosen by GPTQ
    act_order: bool = False
    input_amax: float | None = None  # max |x| (fp8's static input scale)
    smooth: np.ndarray | None = None  # (K_full,) SmoothQuant 1/s applied by the kernel
    # (R, K_full) calibration rows the weight reads (an expert's routed tokens): the symmetric
    # 4-bit grid is searched for the output error on them (scale_search.int4_symmetric_scales_for_inputs)
    input_rows: np.ndarray | None = None
    # an ExpertStack's per-expert calibration (expert_calibration.ExpertCalibration:
    # for_expert(i) -> WeightCalibration, token_counts(experts) -> (experts,) ints)
    experts: object | None = None


class StoredFormat(ABC):
    """A stored quantization format (frozen dataclass subclasses; equal formats store alike)."""

    bits: int
    gptq_codes = False  # GPTQ may choose its codes (given the input's Hessian)
    needs_input_amax = False  # a static input scale from the calibrated max |x|
    smooth = False  # the kernel applies a stored SmoothQuant 1/s to its input

    @abstractmethod
    def parts(self, shape: tuple[int, int]) -> tuple[Part, ...]: ...

    @abstractmethod
    def quantize(self, rows: np.ndarray, calib: WeightCalibration) -> dict[str, np.ndarray]:
        """rows: (N, K) fp32 -> {role: values} of every part (codes unpacked, (N, K))."""

    @abstractmethod
    def dequantize(self, q: dict[str, np.ndarray]) -> np.ndarray:
        """The (N, K) weight the stored parts represent."""

    def full_rows_for_k_shard(self, calib: WeightCalibration) -> bool:
        """A K shard is quantized on whole rows (then cut) when its parameters or codes
        depend on the whole row: per-channel scales, GPTQ's error propagation."""
        return True

    def slice_columns(self, q: dict[str, np.ndarray], c0: int, c1: int) -> dict[str, np.ndarray]:
        """The parts of columns [c0, c1) of a weight quantized on whole rows."""
        return {role: (v[:, c0:c1] if role == "codes" else v[c0:c1] if role == "smooth" else v)
                for role, v in q.items()}

    def column_split_error(self, k: int, cuts: list[tuple[int, int]], rank: int) -> str | None:
        """Why rank `rank`'s input columns cuts[rank] of a K-column weight cannot be stored
        on their own (the end of a sentence starting with the node and --tp, naming the
        format's own fix where there is one; the shard pass adds the --tp values that work),
        or None."""
        return None

    def finish(self, q: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Parts computed from the codes as stored, after any K cut (none by default)."""
        return q

    def store(self, rows: np.ndarray, calib: WeightCalibration,
              cut: tuple[int, int] | None = None) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """rows (N, K) -> (every part's values, the (N, k) fp32 weight they stand for). With
        `cut` (c0, c1), `rows` are whole rows and the result is the K shard [c0, c1)."""
        q = self.quantize(rows, calib)
        if cut is not None:
            q = self.slice_columns(q, *cut)
            rows = rows[:, cut[0]:cut[1]]
        return self.finish(q), rows

    def shipped_parts(self, ckpt, parts: tuple[str, ...], slices: tuple) -> dict[str, np.ndarray] | None:
        """The parts' values as the checkpoint already stores them in this format (read, not
        requantized), or None: quantize from the fp32 weight."""
        return None

    def pack(self, role: str, values: np.ndarray, layout: str) -> np.ndarray:
        """A part's values (in its stored dtype) -> the bytes of `layout`."""
        return layouts.pack(values, layout)

    def stats(self, w: np.ndarray, q: dict[str, np.ndarray]) -> dict:
        return {"sqnr_db": round(prim.sqnr_db(w, self.dequantize(q)), 2), "bits": self.bits}

    def describe(self) -> str:
        """Text for graph dumps: `int4_group(group_size=64,zero_point=False)`."""
        fields = ",".join(f"{k}={v}" for k, v in sorted(vars(self).items()))
        return f"{self.key}({fields})"


@dataclass(frozen=True)
class Int8PerChannel(StoredFormat):
    key = "int8_per_channel"
    bits = 8

    def parts(self, shape):
        n, _ = shape
        return (Part("codes", "", tuple(shape), "int8"), Part("scales", ".scales", (n,), "float32"))

    def quantize(self, rows, calib):
        codes, scale = prim.quantize_int8_per_channel(rows)
        return {"codes": codes, "scales": scale}

    def dequantize(self, q):
        return prim.dequantize_int8_per_channel(q["codes"], q["scales"])


@dataclass(frozen=True)
class Int4Group(StoredFormat):
    """4-bit codes per group of K. Asymmetric (zero_point): a bf16 scale and offset per group,
    w = scale * code + offset (4 + 32/G bits per weight). Symmetric: a searched bf16 scale
    only, w = scale * (code - 8) (4 + 16/G bits: g32 is 4.5, as llama.cpp's Q4_0)."""

    group_size: int
    zero_point: bool
    key = "int4_group"
    bits = 4
    gptq_codes = True
    param_dtype = "bfloat16"  # scales and offsets are bf16 values (int4_group_params rounds them)

    def parts(self, shape):
        n, k = shape
        groups = (n, k // self.group_size)
        parts = (Part("codes", "", tuple(shape), "int4"), Part("scales", ".scales", groups, self.param_dtype))
        return parts + ((Part("offsets", ".offsets", groups, self.param_dtype),) if self.zero_point else ())

    def quantize(self, rows, calib):
        from bessemer.quantization.scale_search import int4_grid

        g = self.group_size
        if calib.hessian is not None:
            from bessemer.quantization.gptq import gptq_int4

            codes, scale, offset = gptq_int4(rows, calib.hessian, g, self.zero_point, calib.act_order)
        elif calib.input_rows is not None and not self.zero_point:
            from bessemer.quantization import scale_search as ss

            scale = ss.int4_symmetric_scales_for_inputs(rows, g, ss.group_second_moments(calib.input_rows, g))
            offset = (-ss.SYM_ZERO * scale).astype(np.float32)
            codes = prim.quantize_int4(rows, scale, offset, g)
        else:
            scale, offset = int4_grid(rows, g, self.zero_point)
            codes = prim.quantize_int4(rows, scale, offset, g)
        q = {"codes": codes, "scales": scale}
        if self.zero_point:  # symmetric: offset = -8 * scale, not stored
            q["offsets"] = offset
        return q

    def offsets(self, q: dict[str, np.ndarray]) -> np.ndarray:
        return q["offsets"] if self.zero_point else (-8.0 * q["scales"]).astype(np.float32)

    def dequantize(self, q):
        return prim.dequantize_int4(q["codes"], q["scales"], self.offsets(q), self.group_size)

    def full_rows_for_k_shard(self, calib):
        return calib.hessian is not None  # round to nearest: groups are independent

    def slice_columns(self, q, c0, c1):
        g = self.group_size
        assert c0 % g == 0 and c1 % g == 0, "the shard pass only cuts K on group boundaries"
        return {role: v[:, c0:c1] if role == "codes" else v[:, c0 // g:c1 // g] for role, v in q.items()}

    def column_split_error(self, k, cuts, rank):
        g = self.group_size
        c0, c1 = cuts[rank]
        if c0 % g == 0 and c1 % g == 0:
            return None
        from bessemer.quantization.config import GROUP_SIZES

        # the --group-size values whose group on this K (effective_group_size) every cut respects
        fits = [str(f) for f in GROUP_SIZES
                if all(c % prim.effective_group_size(k, f) == 0 for cut in cuts for c in cut)]
        where = f"cuts its {k} input features at column {c0 if c0 % g else c1}, inside a 4-bit group of {g}"
        return where + (f"; use --group-size {' or '.join(fits)}" if fits else "")

    def pack(self, role, values, layout):
        if role == "codes":
            return layouts.pack_int4_codes(values, layout)
        p = np.asarray(values, dtype=np.float32)
        bits = to_bfloat16_bits(p)
        if not np.array_equal(bfloat16_bits_to_float32(bits), p):
            raise ValueError("int4 group parameters must be bf16 values (primitives.int4_group_params rounds them)")
        return layouts.pack(bits, layout)

    def stats(self, w, q):
        return dict(super().stats(w, q), group_size=self.group_size)


@dataclass(frozen=True)
class Int4SuperBlock(StoredFormat):
    """Two-level 4-bit codes (quantization/superblock.py): per sub-block of 32 columns a
    uint8 scale code and minimum code, per super-block of `super_block` columns an fp16
    super-scale and super-minimum; w = d * sc * code - dmin * m (4 + 16/32 + 32/super_block
    bits per weight)."""

    super_block: int
    key = "int4_superblock"
    bits = 4
    gptq_codes = True

    def parts(self, shape):
        from bessemer.quantization.superblock import SUB

        n, k = shape
        sub, sup = (n, k // SUB), (n, k // self.super_block)
        return (Part("codes", "", tuple(shape), "int4"), Part("scales", ".scales", sub, "uint8"),
                Part("offsets", ".offsets", sub, "uint8"), Part("super_scales", ".super_scales", sup, "float16"),
                Part("super_offsets", ".super_offsets", sup, "float16"))

    def quantize(self, rows, calib):
        from bessemer.quantization import superblock as sb

        if rows.shape[1] % self.super_block:
            raise ValueError(f"int4_superblock: {rows.shape[1]} columns are not whole super-blocks of {self.super_block}")
        importance = None if calib.hessian is None else np.diag(calib.hessian).astype(np.float32)
        grid = sb.superblock_grid(rows, self.super_block, importance)
        if calib.hessian is not None:
            from bessemer.quantization.gptq import gptq_superblock

            codes = gptq_superblock(rows, calib.hessian, grid, calib.act_order)
        else:
            codes = sb.quantize_codes(rows, grid)
        return dict(grid, codes=codes)

    def dequantize(self, q):
        from bessemer.quantization.superblock import dequantize

        return dequantize(q)

    def full_rows_for_k_shard(self, calib):
        return calib.hessian is not None  # round to nearest: super-blocks are independent

    def slice_columns(self, q, c0, c1):
        from bessemer.quantization.superblock import SUB

        b = self.super_block
        assert c0 % b == 0 and c1 % b == 0, "the shard pass only cuts K on super-block boundaries"
        step = {"codes": 1, "scales": SUB, "offsets": SUB, "super_scales": b, "super_offsets": b}
        return {role: v[:, c0 // step[role]:c1 // step[role]] for role, v in q.items()}

    def column_split_error(self, k, cuts, rank):
        b = self.super_block
        c0, c1 = cuts[rank]
        if c0 % b == 0 and c1 % b == 0:
            return None
        return (f"cuts its {k} input features at column {c0 if c0 % b else c1}, inside a super-block of {b} "
                f"(--quant w4k); use --quant w4a16 --group-size 32")

    def pack(self, role, values, layout):
        if role == "codes":
            return layouts.pack_int4_codes(values, layout)
        if role in ("scales", "offsets"):
            return layouts.pack(np.asarray(values, np.uint8), layout)
        p = np.asarray(values, dtype=np.float32)
        half = p.astype(np.float16)
        if not np.array_equal(half.astype(np.float32), p):
            raise ValueError("int4_superblock super-parameters must be fp16 values (superblock.code_under_super rounds them)")
        return layouts.pack(half, layout)

    def stats(self, w, q):
        return dict(super().stats(w, q), super_block=self.super_block, sub_block=32)


@dataclass(frozen=True)
class Int4GroupA8(Int4Group):
    """Symmetric Int4Group weights (the same codes, searched scales and packing) read by a
    kernel that quantizes its activations to int8 per row and per group of group_size
    columns and takes int8 dot products (w4a8): its own class, so that a target reads it
    only with a kernel that does that arithmetic (a target without one refuses the mode)."""

    zero_point: bool = False
    key = "int4_group_a8"

    def __post_init__(self):
        if self.zero_point:
            raise ValueError("int4_group_a8 stores symmetric codes only (no offsets)")


@dataclass(frozen=True)
class W8A8(StoredFormat):
    smooth: bool  # the kernel multiplies its input by a stored 1/s (o_proj, SmoothQuant)
    key = "w8a8"
    bits = 8

    def parts(self, shape):
        n, k = shape
        parts = (Part("codes", "", tuple(shape), "int8"), Part("scales", ".scales", (n,), "float32"),
                 Part("wsum", ".wsum", (n,), "int32"))
        return parts + ((Part("smooth", ".smooth", (k,), "float32"),) if self.smooth else ())

    def quantize(self, rows, calib):
        codes, scale = prim.quantize_int8_per_channel(rows)
        q = {"codes": codes, "scales": scale}
        if self.smooth:
            if calib.smooth is None:
                raise ValueError("w8a8 with kernel smoothing needs the calibrated 1/s of the weight's input")
            q["smooth"] = calib.smooth
        return q

    def dequantize(self, q):
        return prim.dequantize_int8_per_channel(q["codes"], q["scales"])

    def pack(self, role, values, layout):
        if role == "wsum":  # the VNNI kernel feeds u8 = code + 128 and subtracts 128 * wsum
            return layouts.pack(np.asarray(values, np.int32), layout)
        return super().pack(role, values, layout)

    def finish(self, q):
        """Per-channel sums of the codes as stored (after any K cut)."""
        return dict(q, wsum=q["codes"].astype(np.int32).sum(axis=1, dtype=np.int32))


@dataclass(frozen=True)
class Fp8E4M3(StoredFormat):
    """E4M3 codes + fp32 scale per output channel. dynamic: each token's activations are
    scaled by their own max |x| / 448 in the kernel (nothing stored); else one static input
    scale per weight, from the calibrated max |x|, stored as <weight>.input_scale."""

    dynamic: bool = True
    # dynamic only: the kernel refines each token's scale by a power of two per group of this
    # many input columns (linear_fp8@2 attr act_group; quantization/fp8.py group_exponents); 0: none
    act_group: int = 0
    key = "fp8_e4m3"
    bits = 8
    gptq_codes = True

    @property
    def needs_input_amax(self) -> bool:
        return not self.dynamic

    def parts(self, shape):
        n, _ = shape
        parts = (Part("codes", "", tuple(shape), "float8_e4m3"), Part("scales", ".scales", (n,), "float32"))
        return parts + (() if self.dynamic else (Part("input_scale", ".input_scale", (1,), "float32"),))

    def quantize(self, rows, calib):
        from bessemer.quantization import fp8

        if not self.dynamic and calib.input_amax is None:
            raise ValueError("fp8 with static activation scales needs the calibrated max |x| of the weight's input")
        if calib.hessian is not None:
            from bessemer.quantization.gptq import gptq_fp8

            codes, scale = gptq_fp8(rows, calib.hessian, calib.act_order)
        else:
            codes, scale = fp8.quantize_fp8_per_channel(rows)
        q = {"codes": codes, "scales": scale}
        if not self.dynamic:
            q.update(input_scale=np.array([fp8.activation_scale(calib.input_amax)], np.float32),
                     input_amax=np.float32(calib.input_amax))
        return q

    def dequantize(self, q):
        from bessemer.quantization import fp8

        return fp8.dequantize_fp8_per_channel(q["codes"], q["scales"])

    def stats(self, w, q):
        per_token = f"dynamic per token, 2^-e per {self.act_group} columns" if self.act_group else "dynamic per token"
        stats = dict(super().stats(w, q), dtype="float8_e4m3",
                     activation_scales=per_token if self.dynamic else "static")
        if not self.dynamic:
            stats.update(input_amax=float(q["input_amax"]), input_scale=float(q["input_scale"][0]))
        return stats


@dataclass(frozen=True)
class ExpertStack(StoredFormat):
    """A moe node's gate_up or down: `experts` (N, K) matrices, each stored in `inner`'s format,
    one after another as (E*N, K) output rows. input_major: the graph's weight is (E, K, N)
    (gpt-oss's stacked tensors), turned into each expert's output rows when it is quantized
    (gate/up stay interleaved, as the kernel reads them). The codes are chosen an expert at a
    time from what the calibration has for it (WeightCalibration.experts, from the tokens
    routed to the expert; quantization/expert_calibration.py): by GPTQ from its own Hessian
    (w4a16-gptq), or on the grid searched for its output error on them (w4a16-awq); else by
    round to nearest (an expert too few calibration tokens reach, and every other mode).
    Which, per expert, is in the stats."""

    inner: StoredFormat
    experts: int
    input_major: bool = False
    key = "experts"

    @property
    def bits(self) -> int:
        return self.inner.bits

    def rows_shape(self, shape: tuple[int, ...]) -> tuple[int, int]:
        if self.input_major:
            e, k, n = shape
            return (e * n, k)
        return tuple(shape)

    def to_rows(self, w: np.ndarray) -> np.ndarray:
        """The graph's weight -> (E*N, K) rows."""
        if not self.input_major:
            return w
        return np.ascontiguousarray(np.swapaxes(w, -1, -2)).reshape(-1, w.shape[1])

    def parts(self, shape):
        return self.inner.parts(self.rows_shape(shape))

    # q's entries for stats, not stored: each expert's calibration tokens, whether calibration
    # chose its codes, and by which algorithm (ExpertCalibration.algorithm)
    EXPERT_INFO = ("expert_tokens", "expert_calibrated", "expert_algorithm")

    def quantize(self, rows, calib):
        # an expert at a time: the temporaries of one expert's (N, K) (and its Hessian), not the whole stack's
        chunks = ((np.ascontiguousarray(w.T) for w in rows) if self.input_major else np.split(rows, self.experts))
        per_expert = calib.experts
        q, calibrated = [], []
        for i, chunk in enumerate(chunks):
            c = per_expert.for_expert(i) if per_expert else WeightCalibration()
            q.append(self.inner.quantize(chunk, c))
            calibrated.append(c.hessian is not None or c.input_rows is not None)
        out = {role: np.concatenate([x[role] for x in q]) for role in q[0]}
        if per_expert is not None:
            out.update(expert_tokens=per_expert.token_counts(self.experts), expert_calibrated=np.array(calibrated),
                       expert_algorithm=np.array(per_expert.algorithm))
        return out

    def _split_info(self, q: dict) -> tuple[dict, dict]:
        return ({k: v for k, v in q.items() if k not in self.EXPERT_INFO},
                {k: v for k, v in q.items() if k in self.EXPERT_INFO})

    def dequantize(self, q):
        return self.inner.dequantize(q)

    # tensor parallelism (one expert matrix per HF part, layout 0) cuts every expert's down
    # along K at the same columns: the inner format's rules, expert by expert; calibrated codes
    # (GPTQ's error propagated along whole rows; the output error over all K input channels) are
    # chosen on the full matrices, then cut
    def full_rows_for_k_shard(self, calib):
        return calib.experts is not None or self.inner.full_rows_for_k_shard(WeightCalibration())

    def slice_columns(self, q, c0, c1):
        parts, info = self._split_info(q)
        # parameters are per output row: stacking keeps them
        return dict(self.inner.slice_columns(parts, c0, c1), **info)

    def column_split_error(self, k, cuts, rank):
        return self.inner.column_split_error(k, cuts, rank)

    def store(self, rows, calib, cut=None):
        if cut is not None and self.input_major:
            raise ValueError("stacked (input-major) experts are split whole across ranks, never along K")
        q = self.quantize(rows, calib)
        if cut is not None:
            q, rows = self.slice_columns(q, *cut), rows[:, cut[0]:cut[1]]
        parts, info = self._split_info(q)
        return dict(self.inner.finish(parts), **info), self.to_rows(rows)

    def pack(self, role, values, layout):
        return self.inner.pack(role, values, layout)

    def stats(self, w, q):
        parts, info = self._split_info(q)
        stats = dict(self.inner.stats(w, parts), experts=self.experts, algorithm="rtn")
        if info:
            tokens, calibrated = info["expert_tokens"], info["expert_calibrated"]
            by = str(info["expert_algorithm"])
            stats.update(algorithm=by if calibrated.any() else "rtn", calibrated_by=by,
                         experts_calibrated=int(calibrated.sum()),
                         # expert index in the stack -> its calibration tokens, for those stored RTN
                         rtn_fallback={int(i): int(tokens[i]) for i in np.nonzero(~calibrated)[0]},
                         expert_tokens=[int(t) for t in tokens])
        return stats

    def describe(self):
        return f"experts({self.inner.describe()},experts={self.experts},input_major={self.input_major})"


@dataclass(frozen=True)
class Mxfp4Experts(StoredFormat):
    """gpt-oss's experts kept in MXFP4 (quantization/mxfp4.py): per expert output row, blocks
    of 32 E2M1 codes (uint8, two per byte) with one E8M0 scale (uint8) each. The graph's weight
    is (E, K, N) input-major; stored as (E*N, K/2) codes and (E*N, K/32) scales: the checkpoint's
    own bytes when it ships the pair (shipped_parts), else encoded from fp32 values (values that
    came from MXFP4 are encoded exactly: a block's scale is that of its largest value)."""

    key = "mxfp4"
    bits = 4

    def parts(self, shape):
        e, k, n = shape
        return (Part("codes", "", (e * n, k // 2), "uint8"), Part("scales", ".scales", (e * n, k // 32), "uint8"))

    def quantize(self, rows, calib):
        from bessemer.quantization.mxfp4 import encode_mxfp4_rows

        e, k, n = rows.shape
        pairs = [encode_mxfp4_rows(np.ascontiguousarray(rows[i].T)) for i in range(e)]  # an expert at a time
        return {"codes": np.concatenate([c for c, _ in pairs]), "scales": np.concatenate([s for _, s in pairs])}

    def dequantize(self, q):
        from bessemer.quantization.mxfp4 import decode_mxfp4_rows

        return decode_mxfp4_rows(q["codes"], q["scales"])

    def shipped_parts(self, ckpt, parts, slices):
        if len(parts) != 1 or parts[0] not in getattr(ckpt, "mxfp4", {}):
            return None
        blocks, scales = ckpt.mxfp4_pair(parts[0])  # (E, N, K/32, 16), (E, N, K/32): already (E*N) rows
        if slices:  # a tensor-parallel rank's whole experts [e0, e1): (e0, e1, 0, K)
            ((e0, e1, k0, k1),) = slices
            if (k0, k1) != (0, blocks.shape[2] * 32):
                return None
            blocks, scales = blocks[e0:e1], scales[e0:e1]
        e, n, g, b = blocks.shape
        # copies: the weight source keeps a weight's parts until the next one, past the mapping
        return {"codes": blocks.reshape(e * n, g * b).copy(), "scales": scales.reshape(e * n, g).copy()}

    def store(self, rows, calib, cut=None):
        if cut is not None:
            raise ValueError("experts are split whole across ranks, never along K")
        e, k, n = rows.shape
        return self.quantize(rows, calib), np.ascontiguousarray(np.swapaxes(rows, -1, -2)).reshape(e * n, k)


def scheme_format(scheme: str, in_features: int) -> StoredFormat:
    """The stored format of a precision-plan scheme (config.PRECISION_SCHEMES) or of the
    lm_head's "int4"/"int8" for a weight of `in_features` columns."""
    if scheme == "int8":
        return Int8PerChannel()
    if scheme == "int4-k":
        from bessemer.quantization.superblock import super_block_size

        block = super_block_size(in_features)
        if block is None:
            raise ValueError(f"scheme int4-k needs input features that are a multiple of 32, got {in_features}")
        return Int4SuperBlock(block)
    group = 64 if scheme == "int4-g64" else 32
    return Int4Group(prim.effective_group_size(in_features, group), scheme == "int4-g32-asym")


def weight_format(quant, in_features: int, smooth: bool = False) -> StoredFormat:
    """The stored format of a linear weight quantized by `quant` (a QuantConfig): the one
    place a --quant mode becomes a storage format. smooth: w8a8 with the kernel's 1/s."""
    if quant.act_bits == 8 and quant.bits == 8:
        return W8A8(smooth=smooth)
    if quant.weight_dtype == "float8_e4m3":
        return Fp8E4M3(dynamic=quant.fp8_activations == "dynamic", act_group=quant.fp8_act_group or 0)
    if quant.bits == 8:
        return Int8PerChannel()
    if quant.two_level:
        from bessemer.quantization.superblock import super_block_size

        block = super_block_size(in_features)
        if block is None:
            raise InvalidOptionError(f"--quant {quant.mode} needs input features that are a multiple of 32, got "
                                     f"{in_features}; use --quant w4a16")
        return Int4SuperBlock(block)
    group = prim.effective_group_size(in_features, quant.group_size)
    if quant.act_bits == 8:
        return Int4GroupA8(group)
    return Int4Group(group, quant.zero_point)


def expert_format(quant, in_features: int) -> StoredFormat:
    """The format of each expert matrix (ExpertStack's inner) under `quant`: the mode's linear
    format, except that fp8 experts always scale their activations per token in the kernel.
    A static scale is the calibrated max |x| of one linear's input, and calibration reaches
    linears only; so static builds keep it for their linears, and act_group applies to the
    experts only where the linears are dynamic too."""
    fmt = weight_format(quant, in_features)
    if isinstance(fmt, Fp8E4M3) and not fmt.dynamic:
        return Fp8E4M3(dynamic=True)
    return fmt
