"""Shared by the interpreter tests: they run only in a process started with TRITON_INTERPRET=1
(tests/test_cuda_interpreter.py starts it), and need the interpreter fixes installed."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton", reason="pip install 'bessemer[cuda]' to test the cuda target")

from bessemer.targets.cuda import interpreter  # noqa: E402

interpreter.enable()

TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def device_tensor(x, dtype: str):
    """A CPU torch tensor in the activation dtype (values rounded as the GPU stores them)."""
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(TORCH_DTYPES[dtype])


def host(t) -> np.ndarray:
    return t.to(torch.float64).numpy()


def assert_rounded_close(out, ref, dtype: str, what: str, extra=0.0):
    """|out - ref| <= one output rounding of |ref| + fp32 arithmetic + `extra` (absolute)."""
    from tolerances import CUDA_FP32_RTOL, CUDA_OUTPUT_ROUNDING

    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    bound = CUDA_OUTPUT_ROUNDING[dtype] * np.abs(ref) + CUDA_FP32_RTOL * np.abs(ref).max() + extra
    worst = np.argmax(np.abs(out - ref) - bound)
    assert np.all(np.abs(out - ref) <= bound), (
        f"{what}: |out - ref| = {np.abs(out - ref).flat[worst]:.3g} > {bound.flat[worst]:.3g} "
        f"at {np.unravel_index(worst, ref.shape)}")


def split_k_workspace(tiles: int, split: int, bm: int, bn: int):
    """(partials, counters) for a split-K launch: partials NaN (a part read before it is
    written shows), counters zero, as the executor leaves them."""
    return torch.full((tiles * split * bm * bn,), float("nan")), torch.zeros(tiles, dtype=torch.int32)


# (rows of the step, BLOCK_M, one program a part of K): the decode bucket's 16-row tiles
# alone and full, then the 64- and 128-row buckets' tiles (one program looping over the parts)
GEMM_BUCKETS = ((1, 16, True), (16, 16, True), (64, 64, False), (128, 128, False))


def assert_row_bits_in_every_bucket(launch, what: str):
    """Batch invariance of a GEMM with K in parts (lower.py: split_k): launch(rows, block_m,
    one_program_a_part) runs the kernel on the first `rows` rows of the same x into an fp32
    output (as the logits are: no rounding hides a difference) and returns it; row 0 must be
    bit-identical alone and among 16, 64 and 128 rows."""
    alone, *others = [launch(rows, bm, split).numpy()[0] for rows, bm, split in GEMM_BUCKETS]
    for (rows, bm, _), row in zip(GEMM_BUCKETS[1:], others):
        np.testing.assert_array_equal(row, alone, err_msg=f"{what}: a row alone vs among {rows} ({bm}-row tiles)")
