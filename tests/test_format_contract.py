"""The engine contract is written once (bessemer/format) and every native reader agrees with
it: the generated header is current, and in each extension (bessemer._C, the cpu target;
bessemer._cuda, the cuda target) the compiled tables, size rule, KV size per token, header
JSON and tensor-table checks and step checks are the contract's, equal to Python's."""

import itertools

import numpy as np

import pytest

from bessemer import _C, _cuda
from bessemer.errors import BessemerError
from bessemer.format import container, cpp, kv, plan
from bessemer.format.dtypes import DTYPES
from bessemer.format.layouts import LAYOUTS, check_tensor, packed_nbytes


def test_generated_header_is_current():
    assert cpp.HEADER.read_text() == cpp.render(), "run `python -m bessemer.format.cpp` and rebuild"


# every extension that links the contract's C++ (setup.py: CONTRACT_SOURCES)
NATIVE = [pytest.param(_C, id="_C"), pytest.param(_cuda, id="_cuda")]


@pytest.mark.parametrize("native", NATIVE)
def test_ids_and_constants_agree(native):
    c = native.format_contract()
    assert c["format"] == (container.FORMAT_MAJOR, container.FORMAT_MINOR)
    assert c["magic"] == container.MAGIC
    assert c["align"] == (container.PREAMBLE.size, container.DATA_ALIGN, container.TENSOR_ALIGN)
    assert c["dtypes"] == [(d.name, d.id, d.bits) for d in DTYPES]
    assert c["layouts"] == [(lay.name, lay.id, lay.ndim, lay.row_align, lay.col_align, lay.k_multiple,
                             list(lay.dtypes)) for lay in LAYOUTS]
    assert c["kv_dtypes"] == [(k.dtype, k.scale_bytes, k.scales) for k in kv.KV_DTYPES]
    assert c["rows"] == (plan.ROWS_TOKENS, plan.ROWS_SELECTED)
    # ids are unique (an id is never reused) and names too
    for table in (DTYPES, LAYOUTS):
        assert len({t.id for t in table}) == len({t.name for t in table}) == len(table)


SHAPES = [(1,), (7,), (3, 5), (16, 8), (17, 40), (40, 96), (33, 44), (2, 3, 4)]


@pytest.mark.parametrize("native", NATIVE)
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda lay: lay.name)
def test_size_rule_agrees_on_every_dtype_and_shape(layout, native):
    for dtype, shape in itertools.product(DTYPES, SHAPES):
        try:
            check_tensor(shape, dtype.name, layout.name)
            expect = packed_nbytes(shape, dtype.name, layout.name)
        except ValueError:
            with pytest.raises(ValueError):
                native.stored_nbytes(dtype.id, layout.id, list(shape))
            continue
        assert native.stored_nbytes(dtype.id, layout.id, list(shape)) == expect, (dtype.name, shape)


@pytest.mark.parametrize("native", NATIVE)
def test_kv_bytes_per_token_agrees(native):
    for k, (layers, heads, d) in itertools.product(kv.KV_DTYPES, [(1, 1, 8), (30, 3, 64), (2, 2, 16)]):
        assert native.kv_bytes_per_token(layers, heads, d, k.dtype) == kv.kv_bytes_per_token(layers, heads, d, k.dtype)
    # the --kv-cache-dtype spelling maps onto the contract's one name
    assert kv.kv_dtype("fp8") == kv.kv_dtype("float8_e4m3")
    with pytest.raises(ValueError):
        native.kv_bytes_per_token(1, 1, 8, "int4")


def test_step_batch_wire_round_trip():
    from bessemer.format.step import StepBatch, is_stop, stop_words

    rng = np.random.default_rng(0)
    tables = rng.integers(-1, 50, (3, 5))
    batch = StepBatch.of(rng.integers(0, 100, 9), rng.integers(0, 30, 9), [0, 4, 5, 9], [10, 2, 30], tables, [3, 4, 8])
    words = batch.encode()
    assert words.dtype == np.int32 and len(words) <= StepBatch.max_words(9, 3, 5) and not is_stop(words)
    back = StepBatch.decode(words)
    for a, b in zip(batch.arrays(), back.arrays()):
        np.testing.assert_array_equal(a, b)
        assert a.shape == b.shape
    assert is_stop(stop_words())
    with pytest.raises(ValueError, match="token_ids: expected an int32 array"):
        StepBatch.of([1.5], [0], [0, 1], [1], [[0]], [0])


def _rank_file(tmp_path, header: bytes, data: bytes = b""):
    path = tmp_path / "h.engine"
    pad = (-(container.PREAMBLE.size + len(header))) % container.DATA_ALIGN
    path.write_bytes(container.PREAMBLE.pack(container.MAGIC, 1, 1, 0, len(header)) + header + b"\0" * pad + data)
    return path


# Each native reader of a whole rank file: the cpu executor's and the cuda plan reader (which
# needs no GPU); both read the file, the header JSON and the tensor table with the contract.
READERS = [pytest.param(lambda path: _C.Executor(_C.EngineFile(str(path)), 1, 16, 1), id="_C"),
           pytest.param(lambda path: _cuda.read_launch_plan(str(path)), id="_cuda")]


@pytest.mark.parametrize("read", READERS)
@pytest.mark.parametrize("text, match", [
    (b"{", "header JSON: expected a string key at byte 1"),
    (b"[1, ", "header JSON: unexpected end"),
    (b'{"plan": 1} x', "trailing bytes"),
    (b'{"tensors": [{"name": "\\ud800"}], "plan": {}}', "lone surrogate"),
    (b"[" * 100, "nesting deeper than 64"),
])
def test_native_header_readers_refuse_malformed_json(tmp_path, read, text, match):
    with pytest.raises(ValueError, match=match):
        read(_rank_file(tmp_path, text))


def test_cpp_header_reader_refuses_a_plan_without_vocab_size(tmp_path):
    f = _C.EngineFile(str(_rank_file(tmp_path, b'{"tensors": [], "plan": {"buffers": [], "steps": []}}')))
    with pytest.raises(ValueError, match="missing 'vocab_size'"):
        _C.Executor(f, 1, 16, 1)


@pytest.mark.parametrize("read", READERS)
@pytest.mark.parametrize("kv_cache, match", [
    (dict(dtype="int8"), "kv_cache: dtype int8 needs scales 'dynamic_per_token_head_float32', got ''"),
    (dict(dtype="bfloat16", scales=kv.SCALES_DYNAMIC), "kv_cache: dtype bfloat16 has no scales, the plan gives some"),
    (dict(dtype="int4"), "kv_cache: dtype 'int4' not supported"),
])
def test_native_readers_hold_the_kv_scale_rule_of_format_kv(tmp_path, read, kv_cache, match):
    """The one KV rule (format/kv.py: scales only, and always, for one-byte codes) every native
    reader parses the kv_cache section with (plan.h parse_kv_cache)."""
    import json

    section = dict(num_layers=1, num_kv_heads=1, head_dim=8, **kv_cache)
    plan_ = {"schema": "cuda-launch", "version": 1, "buffers": [], "kv_cache": section}  # read by both
    header = json.dumps({"target": "cuda", "tensors": [], "plan": plan_}).encode()
    with pytest.raises(ValueError, match=match):
        read(_rank_file(tmp_path, header))


def _tensor(name, offset, nbytes=16, dtype=0, shape=(4,)):
    return {"name": name, "dtype": dtype, "layout": 0, "shape": list(shape), "offset": offset, "nbytes": nbytes}


@pytest.mark.parametrize("read", READERS)
@pytest.mark.parametrize("tensors, match", [
    ([_tensor("w", 0, dtype=99)], r"^tensor w: unknown dtype id 99$"),
    ([_tensor("w", 0, nbytes=8)], r"tensor w: nbytes 8 does not match its dtype/layout/shape \(16 bytes expected\)"),
    ([_tensor("w", 32)], r"tensor w: offset 32 is not a non-negative multiple of 64"),
    ([_tensor("w", 128)], r"tensor w: data \[128, \+16\) runs past the end of the file"),
    ([_tensor("a", 0, 128, shape=(32,)), _tensor("b", 64)], r"tensor b: data at offset 64 overlaps tensor a"),
    ([_tensor("w", 0), _tensor("w", 64)], r"tensor w: duplicate name in the tensor table"),
])
def test_native_readers_check_the_tensor_table_as_the_contract(tmp_path, read, tensors, match):
    """The cuda reader (target "cuda") refuses exactly what the cpu one does: one table check."""
    import json

    header = json.dumps({"target": "cuda", "tensors": tensors, "plan": {}}).encode()
    with pytest.raises(ValueError, match=match):
        read(_rank_file(tmp_path, header, data=b"\0" * 128))


def test_cuda_reader_reads_a_built_engine_as_python_does(cuda_engine):
    """A real cuda rank file through the contract's reader and the cuda plan schema on top."""
    from pathlib import Path

    path = Path(cuda_engine("llama-tied")) / "rank0.engine"
    _, _, header, _ = container.read_rank_header(path)
    plan_ = header["plan"]
    weights = [t for t in header["tensors"] if not t["name"].startswith("cubin/")]
    assert _cuda.read_launch_plan(str(path)) == dict(
        kernels=len(header["kernels"]), weights=len(weights),
        forward=len(plan_["forward"]), sample=len(plan_["sample"]), vocab_size=plan_["vocab_size"],
        kv_bytes_per_token=kv.section_bytes_per_token(plan_["kv_cache"]))


BAD_STEPS = [  # (changes to a valid two-sequence step, the contract's message)
    (dict(token_ids=[1, 2, 100, 4]), r"^token_ids\[2\]=100 outside \[0, 100\)$"),
    (dict(block_tables=[[0, 9], [2, -1]]), r"^block_tables entry 9 outside \[-1, 8\)$"),
    (dict(block_tables=[[0, -1], [2, -1]]), r"^block_tables\[0\]\[1\] is -1 but the step reads or writes that block$"),
    (dict(context_lens=[9, 1]), r"^context_lens\[0\]=9 outside \[0, 8\]"),
    (dict(logits_indices=[2, 4]), r"^logits_indices\[1\]=4 outside \[0, 4\)$"),
    (dict(cu_seqlens=[0, 3, 3]), r"^cu_seqlens must start at 0 and end at T=4$"),
]


def _step(**changes):
    """Two sequences (3 rows at positions 2..4 and 1 row at position 0; blocks of 4)."""
    step = dict(token_ids=[1, 2, 3, 4], positions=[2, 3, 4, 0], cu_seqlens=[0, 3, 4], context_lens=[5, 1],
                block_tables=[[0, 1], [2, -1]], logits_indices=[2, 3])
    step.update(changes)
    return step


@pytest.mark.parametrize("native", NATIVE)
@pytest.mark.parametrize("changes, match", BAD_STEPS)
def test_step_checks_are_the_contracts_in_every_extension(native, changes, match):
    from bessemer.format.step import StepBatch

    limits = dict(token_limit=100, num_kv_blocks=8, block_size=4)
    assert native.check_step_batch(StepBatch.of(**_step()), **limits) == 5
    with pytest.raises(ValueError, match=match):
        native.check_step_batch(StepBatch.of(**_step(**changes)), **limits)


@pytest.mark.parametrize("changes, match", BAD_STEPS)
def test_the_cuda_reference_derivation_runs_the_contracts_step_checks(changes, match):
    from bessemer.targets.cuda import step_inputs

    geometry = dict(block_size=4, tile_tokens=16, max_blocks_per_seq=4, num_blocks=8, vocab_size=100)
    arrays, counts = step_inputs.derive(**_step(), **geometry)
    assert counts == dict(tokens=4, selected=2, seqs=2, prefill_tiles=1, decode_seqs=1)
    with pytest.raises(BessemerError, match=match):
        step_inputs.derive(**_step(**changes), **geometry)


def test_cpp_header_reader_decodes_escapes(tmp_path):
    """The C++ reader gets the same strings Python wrote (\\u escapes, quotes, backslashes):
    a node name comes back in a kernel's load error."""
    import json

    node = 'layers.0.\u00e9\u4e2d\U0001F600 "q"\\n'
    plan = {"buffers": [{"id": 0, "width": 4, "rows": "tokens"}],
            "steps": [{"op": "rms_norm", "version": 1, "node": node, "ins": [[0, 0, 4]], "outs": [[0, 0, 4]],
                       "weights": [], "attrs": {}}],
            "logits": [0, 0, 4], "vocab_size": 4}
    header = json.dumps({"tensors": [], "plan": plan}, sort_keys=True, separators=(",", ":")).encode()
    assert b"\\u" in header  # Python escapes non-ASCII
    with pytest.raises(ValueError) as e:
        _C.Executor(_C.EngineFile(str(_rank_file(tmp_path, header))), 1, 16, 1)
    assert f"({node})" in str(e.value)
