"""AWQ's fake quantization in native code (awq.fake_quant_int4) against its NumPy statement
(awq.fake_quant_int4_reference), bit for bit: both grids, with and without AWQ's column scales,
on the cases where an order or a sign could differ."""

import numpy as np
import pytest

from bessemer.quantization.awq import fake_quant_int4, fake_quant_int4_reference


def _weights(n, k, group, seed):
    """Gaussian rows with the groups that stress the grid: all zero, ties between +v and -v
    for the largest magnitude (either sign first), all positive, all negative, codes exactly
    halfway between two levels, magnitudes near the subnormals and near the fp32 maximum."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, k)).astype(np.float32)
    g = w.reshape(n, k // group, group)
    g[0, 0] = 0.0
    g[1 % n, 0, :] = -0.0
    g[2 % n, 0, 3], g[2 % n, 0, 5] = 4.0, -4.0
    g[3 % n, 0, 3], g[3 % n, 0, 5] = -4.0, 4.0
    g[4 % n, 0] = np.abs(g[4 % n, 0])
    g[5 % n, 0] = -np.abs(g[5 % n, 0])
    g[6 % n, 0] = (rng.integers(-16, 16, group) * 0.5).astype(np.float32)
    g[7 % n, 0] *= np.float32(1e-38)
    g[8 % n, 0] *= np.float32(1e36)
    return w


@pytest.mark.parametrize("zero_point", [False, True])
@pytest.mark.parametrize("group,k", [(32, 96), (64, 576), (128, 256), (20, 60), (576, 576)])
@pytest.mark.parametrize("scaled", [False, True])
def test_fake_quant_int4_matches_its_numpy_statement_bit_for_bit(zero_point, group, k, scaled):
    n = 37  # odd: the rows split unevenly over the threads
    w = _weights(n, k, group, seed=group + k)
    s = None
    if scaled:
        # AWQ's column scales: mean|x|^a / mean|w|^(1-a), normalised around 1
        rng = np.random.default_rng(k)
        s = np.exp(rng.uniform(-3, 3, k)).astype(np.float32)
    got = fake_quant_int4(w, group, zero_point, s)
    want = fake_quant_int4_reference(w, group, zero_point, s)
    assert got.dtype == np.float32 and got.shape == (n, k)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_fake_quant_int4_is_the_same_on_any_number_of_threads():
    from bessemer import _C

    w = _weights(101, 128, 64, seed=3)
    one = _C.int4_fake_quant(w, 64, True, None, 1)
    np.testing.assert_array_equal(one.view(np.uint32), _C.int4_fake_quant(w, 64, True, None, 3).view(np.uint32))
