"""The engine contract is written once (bessemer/format) and the C++ runtime agrees with it:
the generated header is current, and the compiled tables, size rule and KV size per token
equal Python's for every id."""

import itertools

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
