"""The engine contract is written once (bessemer/format) and the C++ runtime agrees with it:
the generated header is current, and the compiled tables, size rule and KV size per token
equal Python's for every id."""

import itertools

import numpy as np

import pytest

from bessemer import _C
from bessemer.format import container, cpp, kv, plan
from bessemer.format.dtypes import DTYPES
from bessemer.format.layouts import LAYOUTS, check_tensor, packed_nbytes


def test_generated_header_is_current():
    assert cpp.HEADER.read_text() == cpp.render(), "run `python -m bessemer.format.cpp` and rebuild"


def test_ids_and_constants_agree():
    c = _C.format_contract()
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


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda lay: lay.name)
def test_size_rule_agrees_on_every_dtype_and_shape(layout):
    for dtype, shape in itertools.product(DTYPES, SHAPES):
        try:
            check_tensor(shape, dtype.name, layout.name)
            expect = packed_nbytes(shape, dtype.name, layout.name)
        except ValueError:
            with pytest.raises(ValueError):
                _C.stored_nbytes(dtype.id, layout.id, list(shape))
            continue
        assert _C.stored_nbytes(dtype.id, layout.id, list(shape)) == expect, (dtype.name, shape)


def test_kv_bytes_per_token_agrees():
    for k, (layers, heads, d) in itertools.product(kv.KV_DTYPES, [(1, 1, 8), (30, 3, 64), (2, 2, 16)]):
        assert _C.kv_bytes_per_token(layers, heads, d, k.dtype) == kv.kv_bytes_per_token(layers, heads, d, k.dtype)
    # the --kv-cache-dtype spelling maps onto the contract's one name
    assert kv.kv_dtype("fp8") == kv.kv_dtype("float8_e4m3")
    with pytest.raises(ValueError):
        _C.kv_bytes_per_token(1, 1, 8, "int4")


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


def _rank_file(tmp_path, header: bytes):
    path = tmp_path / "h.engine"
    pad = (-(container.PREAMBLE.size + len(header))) % container.DATA_ALIGN
    path.write_bytes(container.PREAMBLE.pack(container.MAGIC, 1, 1, 0, len(header)) + header + b"\0" * pad)
    return path


@pytest.mark.parametrize("text, match", [
    (b"{", "header JSON: expected a string key at byte 1"),
    (b"[1, ", "header JSON: unexpected end"),
    (b'{"plan": 1} x', "trailing bytes"),
    (b'{"tensors": [], "plan": {"buffers": [], "steps": []}}', "missing 'vocab_size'"),
    (b'{"tensors": [{"name": "\\ud800"}], "plan": {}}', "lone surrogate"),
    (b"[" * 100, "nesting deeper than 64"),
])
def test_cpp_header_reader_refuses_malformed_json(tmp_path, text, match):
    f = _C.EngineFile(str(_rank_file(tmp_path, text)))
    with pytest.raises(ValueError, match=match):
        _C.Executor(f, 1, 16, 1)


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
