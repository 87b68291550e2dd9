"""What the CPU rehearsal of the GPU check (check.py --rehearse) puts where the GPU would be.

- The fake driver (BESSEMER_LIBCUDA -> tests/cuda_executor/fake_libcuda.cpp) runs the C++
  executor's whole load and step path: cubins loaded and their parameters checked, weights
  uploaded, KV cache allocated, graphs captured and replayed, step inputs uploaded. It
  computes nothing: what it "returns" is whatever its host memory holds.
- Where a comparison needs computed numbers (teacher-forced logits, batch vs alone, prefix
  hit vs miss), the engine's own launch list runs through the Triton interpreter
  (InterpretedExecutor, targets/cuda/interpret.py) behind the executor interface LLM uses:
  the comparison code then runs on CPU-computed logits of the same engine.
- The graph-vs-eager comparison compares what the fake driver records: a replayed decode
  graph must launch exactly what the eager launcher launches for the same step.

Every speed figure is a GPU figure: NOT_MEASURABLE lists them, and the table says so.
"""

from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from bessemer.format.step import StepBatch
from bessemer.runtime.executor import SamplingRows

# The fake driver names a "Fake GPU" (no datasheet entry) and reports its SMs (132) and bus
# width (6144 bits) but no clocks: these stand-ins (an H200's maximum clocks) let the rehearsal
# take gpu_peaks' computed path, 3125 MHz x 2 x 6144 / 8 = 4.8 TB/s.
FAKE_DRIVER_CLOCKS = {"memory_clock_mhz": 3125.0, "sm_clock_mhz": 1980.0}

# result paths (as report.py reads them) that a CPU cannot measure, and why
NOT_MEASURABLE = {
    "decode-8b": "8B batch-1 decode tok/s, bytes/token, % of the device's HBM peak: needs a GPU's HBM",
    "decode-135m": "135M batch-1 ms/token: launch-bound, needs real kernel launches and CUDA graphs",
    "decode-1b": "1B batch-1 decode tok/s (the HF static+compile fallback's reference): needs a GPU",
    "prefill-8b": "8B 2048-token prefill TTFT and its ratio to torch.matmul's GEMM rate: needs a GPU",
    "throughput-8b": "128 x (128 -> 512) output tok/s: needs a GPU",
    "hf-eager-8b": "HF eager bf16 decode rate and the engine's speedup: needs a GPU",
    "hf-compiled": "HF static cache + torch.compile (inductor, CUDA graphs) and the speedup: needs a GPU",
    "graph_vs_eager": "graph == eager logits bit for bit: the fake driver computes nothing; "
                      "on CPU the replayed launches are compared with the eager ones instead",
    "cuda_logits": "the cubins' own numbers (the interpreter runs the kernels' Triton source, not the SASS)",
    # --suite quant
    "decode-8b-w4a16": "8B int4 batch-1 decode tok/s and % of HBM bandwidth: needs a GPU",
    "decode-8b-fp8": "8B fp8 batch-1 decode tok/s and % of HBM bandwidth: needs a GPU",
    "decode-8b-w4k": "8B w4k batch-1 decode tok/s, % of HBM bandwidth and ratio to int4 g128's: needs a GPU",
    "prefill-8b-fp8": "fp8 prefill GEMM rate vs bf16 torch.matmul: needs FP8 tensor cores",
    "decode-batches-8b-w4a16": "int4 decode tok/s at batch 1-32: needs a GPU",
    "decode-batches-8b": "bf16 decode tok/s at batch 1-32 and int4's ratio to it: needs a GPU",
    "throughput-8b-fp8-kvfp8": "fp8-KV vs bf16-KV throughput at 128 requests: needs a GPU",
}


class InterpretedCudaExecutor:
    """The cuda executor's interface (the Executor protocol, with a device sampler) over the
    interpreted launcher: same launch list, same plan, kernels run as Triton source with NumPy."""

    def __init__(self, engine_dir: Path, num_kv_blocks: int):
        from bessemer.targets.cuda.interpret import InterpretedExecutor

        self._ex = InterpretedExecutor(engine_dir, num_kv_blocks, verify_checksum=False)
        self.info = self._ex.info
        self.num_kv_blocks = num_kv_blocks
        self.use_graphs = False
        self.sampler = _InterpretedSampler(self._ex)

    def step(self, batch: StepBatch) -> np.ndarray:
        return self._ex.step(batch)

    def failure(self) -> str | None:
        return None

    def close(self) -> None:
        pass

    def stats(self) -> dict:
        return {"interpreted_launches": self._ex.launches}


class _InterpretedSampler:
    """CudaSampler's sample() over the interpreted launcher: the step, then the plan's sample launch."""

    def __init__(self, interpreted):
        self._ex = interpreted

    def sample(self, batch: StepBatch, rows: SamplingRows, want_logits: bool = False):
        from bessemer.targets.cuda.executor import UNIFORM_MAX

        logits = self._ex.step(batch)
        tokens = self._ex.sample(np.asarray(rows.temperature, np.float32), np.asarray(rows.top_k, np.int32),
                                 np.asarray(rows.top_p, np.float32),
                                 np.minimum(np.asarray(rows.uniform, np.float32), UNIFORM_MAX))
        return tokens, (logits if want_logits else None)


def interpreted(llm) -> None:
    """Replaces the LLM's (fake-driver) executor by the interpreted one, with the same KV
    block count (the block manager stays as it is)."""
    llm.llm_engine.sampling_step.executor = InterpretedCudaExecutor(llm.engine.dir, llm.num_kv_blocks)


def fake_computes_nothing(llm) -> None:
    """On the fake driver the 'sampled' ids are whatever its memory holds: kept inside the
    vocabulary so that the scheduler, detokenizer-free outputs and metrics run as usual."""
    sampler, vocab = llm.executor.sampler, llm.vocab_size
    sample = sampler.sample

    def in_vocab(*args, **kwargs):
        tokens, logits = sample(*args, **kwargs)
        return np.asarray(tokens) % vocab, logits

    sampler.sample = in_vocab


@contextmanager
def fake_launch_log():
    """The launches the fake driver ran inside the block (eager and replayed), as a list
    filled on exit (see launches())."""
    records: list[dict] = []
    previous = os.environ.get("BESSEMER_FAKE_CUDA_LOG")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "calls.jsonl"
        os.environ["BESSEMER_FAKE_CUDA_LOG"] = str(path)
        try:
            yield records
        finally:
            if previous is None:
                os.environ.pop("BESSEMER_FAKE_CUDA_LOG", None)
            else:
                os.environ["BESSEMER_FAKE_CUDA_LOG"] = previous
            rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
            records.extend(launches(rows))


def launches(records: list[dict]) -> list[dict]:
    """What ran, eager or replayed from a graph: each kernel launch (kernel, grid, block,
    shared bytes, packed parameters) without the marks that say how it was issued."""
    return [{k: v for k, v in r.items() if k not in ("capture", "replay", "fn", "stream")}
            for r in records if r["fn"] == "cuLaunchKernelEx" and not r.get("capture")]
