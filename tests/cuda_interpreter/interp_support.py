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
