"""The cuda executor when something fails, against the fake libcuda.so.1 (which can refuse
the Nth kernel run at launch, or let it fault on the device and report that at the next
synchronize, as a real GPU does): a fault names its step and how to localise it, and with
BESSEMER_CUDA_SYNC=1 its node, op and kernel; a failed step waits for its stream and zeroes
the split-K counters, or marks the executor failed when the device is lost; graphs are
captured thread-local; logits come back through a pinned buffer; the KV pool leaves room for
graph instantiation; the test-only Kernel.launch works from any thread."""

from __future__ import annotations

import ctypes
import gc
import re
import struct
import threading

import pytest
# the fake driver's fixtures (imported, not in a conftest.py: see test_cuda_executor.py)
from fake_driver import fake_cuda, fake_libcuda, tiny_cubin  # noqa: F401

from bessemer.errors import DeviceError, EngineLoadError, InvalidOptionError
from bessemer.format.step import StepBatch
from bessemer.runtime.engine import Engine
from bessemer.targets.cuda import step_inputs
from bessemer.targets.cuda import executor as cuda_executor
from bessemer.targets.cuda.device import native, open_device
from bessemer.targets.cuda.executor import CudaExecutor, kv_cache_blocks

pytestmark = pytest.mark.usefixtures("fake_cuda")
KIND = "llama-tied"  # the engine test_cuda_executor.py builds too: built once per session
SYNC = "BESSEMER_CUDA_SYNC"

# two prompts (5 and 3 tokens; blocks of 4), the logits of their last rows
PREFILL = StepBatch.of([11, 12, 13, 14, 15, 21, 22, 23], [0, 1, 2, 3, 4, 0, 1, 2], [0, 5, 8], [5, 3],
                       [[0, 1], [2, -1]], [4, 7])
# one new token for each of two sequences
DECODE = StepBatch.of([16, 24], [5, 3], [0, 1, 2], [6, 4], [[0, 1], [2, -1]], [0, 1])


@pytest.fixture
def engine(cuda_engine):
    return Engine.load(cuda_engine(KIND))


def _launched(header: dict, batch: StepBatch) -> list[tuple[str, str, str]]:
    """(node, op, kernel entry) of each launch an eager step of `batch` makes, in order: the
    plan's forward items whose picked case has a non-empty grid (as the interpreted launcher
    of targets/cuda/interpret.py picks and skips them)."""
    plan = header["plan"]
    _, counts = step_inputs.derive(*batch.arrays(), block_size=plan["limits"]["kv_block_size"],
                                   tile_tokens=plan["attention"]["tile_tokens"],
                                   max_blocks_per_seq=plan["limits"]["max_blocks_per_seq"], num_blocks=64)
    out = []
    for item in plan["forward"]:
        launch = item
        if "cases" in item:
            rows = counts[item["by"]]
            launch = next(c for c in item["cases"] if c["max_rows"] is None or rows <= c["max_rows"])
        grid = [g if isinstance(g, int) else -(-counts[g["count"]] // g["per"]) * g["times"] for g in launch["grid"]]
        if 0 not in grid:
            out.append((item["node"], item["op"], header["kernels"][launch["kernel"]]["entry"]))
    return out


def _fn_order(fake_cuda) -> list[str]:
    return [r["fn"] for r in fake_cuda.records() if r["fn"] in ("cuLaunchKernelEx", "cuStreamSynchronize")]


def test_sync_mode_names_the_node_op_and_kernel_that_faulted(engine, fake_cuda, monkeypatch):
    expected = _launched(engine.header, PREFILL)
    n = len(expected) // 2  # a kernel in the middle of the step
    node, op, entry = expected[n - 1]
    monkeypatch.setenv(SYNC, "1")
    fake_cuda.set(fault_launch=n)
    ex = CudaExecutor(engine, kv_cache_gib=0.01)
    assert ex._ex.sync_launches and ex.graph_buckets == [] and not fake_cuda.records("cuStreamBeginCapture")
    fake_cuda.clear()
    with pytest.raises(DeviceError) as failed:
        ex.step(PREFILL)
    message = str(failed.value)
    assert message == (f"CUDA error: CUDA_ERROR_ILLEGAL_ADDRESS (an illegal memory access was encountered) in node "
                       f"{node} (op {op}, kernel {entry}), launch {n} of step 1 (eager: 8 tokens, 2 sequences, "
                       f"{n} launches), found by the synchronize after it ({SYNC}=1)")
    # every launch was followed by its synchronize, and none came after the faulting one
    order = _fn_order(fake_cuda)
    assert order[:2 * n] == ["cuLaunchKernelEx", "cuStreamSynchronize"] * n
    assert order.count("cuLaunchKernelEx") == n
    # a context does not recover from a fault: the executor says so, and refuses further steps
    assert ex.failure() == message.removeprefix("CUDA error: ")
    with pytest.raises(DeviceError, match=r"the GPU failed in an earlier step .* restart the process \(the failure: "
                                          r"CUDA_ERROR_ILLEGAL_ADDRESS .* in node "):
        ex.step(PREFILL)


def test_without_sync_mode_a_fault_names_the_step_and_how_to_localise_it(engine, fake_cuda, monkeypatch):
    monkeypatch.delenv(SYNC, raising=False)
    launches = len(_launched(engine.header, PREFILL))
    fake_cuda.set(fault_launch=3)
    ex = CudaExecutor(engine, kv_cache_gib=0.01, enforce_eager=True)
    with pytest.raises(DeviceError, match=re.escape(
            "CUDA error: cuStreamSynchronize (step) failed: CUDA_ERROR_ILLEGAL_ADDRESS (an illegal memory access was "
            f"encountered) in step 1 (eager: 8 tokens, 2 sequences, {launches} launches); rerun with {SYNC}=1 to "
            "name the node and kernel that faulted") + "$"):
        ex.step(PREFILL)
    assert len(fake_cuda.records("cuLaunchKernelEx")) == launches  # the fault stopped nothing: it was not seen
    assert ex.failure() is not None
    # a fault inside a graph replay names the graph
    ex = CudaExecutor(engine, kv_cache_gib=0.01)  # a fresh context (cuInit resets the fake)
    with pytest.raises(DeviceError, match=r"CUDA_ERROR_ILLEGAL_ADDRESS .* in step 1 \(decode graph of batch 2 for 2 "
                                          rf"sequences\); rerun with {SYNC}=1"):
        ex.step(DECODE)
    monkeypatch.setenv(SYNC, "yes")
    with pytest.raises(EngineLoadError, match=rf"^{SYNC}='yes' is not a flag: set it to 1"):
        CudaExecutor(engine, kv_cache_gib=0.01)


def test_a_refused_launch_names_its_node_and_the_executor_goes_on(engine, fake_cuda, monkeypatch):
    monkeypatch.delenv(SYNC, raising=False)
    expected = _launched(engine.header, PREFILL)
    node, op, entry = expected[4]
    fake_cuda.set(fail_launch=5)
    ex = CudaExecutor(engine, kv_cache_gib=0.01, enforce_eager=True)
    fake_cuda.clear()
    with pytest.raises(DeviceError, match=re.escape(
            f"CUDA error: cuLaunchKernelEx({entry}) failed: CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES (too many resources "
            f"requested for launch) in node {node} (op {op}, kernel {entry}), launch 5 of step 1 (eager: 8 tokens, "
            "2 sequences, 5 launches)") + "$"):  # about this launch: no hint to rerun
        ex.step(PREFILL)
    # the failed step waited for what it had enqueued before returning
    assert _fn_order(fake_cuda)[-1] == "cuStreamSynchronize"
    assert ex.failure() is None
    logits = ex.step(PREFILL)  # the next step runs
    assert logits.shape == (2, engine.header["plan"]["vocab_size"]) and ex.stats()["steps"] == 1


@pytest.mark.slow  # the w4a16 engine; test_cuda_executor.py's slow w4a16 case builds the same one
def test_a_failed_step_zeroes_the_split_k_counters(quant_cuda_engine, fake_cuda, monkeypatch):
    monkeypatch.delenv(SYNC, raising=False)
    engine = Engine.load(quant_cuda_engine(KIND, "w4a16"))
    fake_cuda.set(fail_launch=len(_launched(engine.header, PREFILL)))  # the last launch (the logits GEMM)
    ex = CudaExecutor(engine, kv_cache_gib=0.01, enforce_eager=True)
    ptr, nbytes = ex.memory_map()["workspace:split_k_counters"]
    assert nbytes > 0
    # what a GEMM stopped part way leaves (the fake's device memory is this process's memory)
    ctypes.memset(ptr, 1, nbytes)
    fake_cuda.clear()
    with pytest.raises(DeviceError, match="CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"):
        ex.step(PREFILL)
    assert ex.read_device(ptr, nbytes) == bytes(nbytes)
    resets = [r for r in fake_cuda.records("cuMemsetD8Async") if r["dst"] == ptr]
    assert resets == [{"fn": "cuMemsetD8Async", "dst": ptr, "bytes": nbytes, "value": 0}]
    assert ex.failure() is None


def test_graphs_are_captured_thread_local(engine, fake_cuda, monkeypatch):
    monkeypatch.delenv(SYNC, raising=False)
    ex = CudaExecutor(engine, kv_cache_gib=0.01)
    captures = fake_cuda.records("cuStreamBeginCapture")
    assert len(captures) == len(ex.graph_buckets) == 5
    assert {c["mode"] for c in captures} == {1}  # CU_STREAM_CAPTURE_MODE_THREAD_LOCAL


def test_logits_come_back_through_a_pinned_buffer_the_view_holds(engine, fake_cuda):
    ex = CudaExecutor(engine, kv_cache_gib=0.01, enforce_eager=True)
    limits, vocab = engine.header["plan"]["limits"], engine.header["plan"]["vocab_size"]
    pinned = [r for r in fake_cuda.records("cuMemHostAlloc") if r["bytes"] == 4 * limits["max_batch_size"] * vocab]
    assert len(pinned) == 1 and ex._ex.host_logits_rows == limits["max_batch_size"]
    fake_cuda.clear()
    first = ex.step(PREFILL)
    (copy,) = fake_cuda.records("cuMemcpyDtoHAsync")
    assert copy["pinned"] == 1 and copy["dst"] == pinned[0]["ptr"] == first.ctypes.data
    assert copy["bytes"] == first.nbytes == 2 * 4 * vocab
    # while the first logits are held, the next step copies into new memory and leaves them be
    first[:] = 7.0
    fake_cuda.clear()
    second = ex.step(DECODE)
    (copy,) = fake_cuda.records("cuMemcpyDtoHAsync")
    assert copy["pinned"] == 0 and copy["dst"] == second.ctypes.data != first.ctypes.data
    assert (first == 7.0).all()
    del first, second  # released: the buffer is handed out again
    fake_cuda.clear()
    third = ex.step(DECODE)
    assert fake_cuda.records("cuMemcpyDtoHAsync")[0]["pinned"] == 1 and third.ctypes.data == pinned[0]["ptr"]
    # more rows than a decode step has (every row of a long prompt): pageable memory
    n = limits["max_batch_size"] + 2
    many = StepBatch.of(list(range(1, n + 1)), list(range(n)), [0, n], [n], [list(range(-(-n // 4)))], list(range(n)))
    del third
    fake_cuda.clear()
    logits = ex.step(many)
    assert logits.shape == (n, vocab) and fake_cuda.records("cuMemcpyDtoHAsync")[0]["pinned"] == 0


def test_kv_cache_leaves_room_to_instantiate_the_graphs(engine, fake_cuda, monkeypatch):
    per_block, gib, mib = 1 << 20, 1 << 30, 1 << 20
    reserve = 256 * mib
    # utilization: the reserve stays free; an explicit size that does not leave it is refused,
    # naming the size that fits (which then loads)
    assert kv_cache_blocks(per_block, 10 * gib, 80 * gib, None, 1.0, 8, 10**9, reserve) == 10 * 1024 - 256 - 1
    assert kv_cache_blocks(per_block, 10 * gib, 80 * gib, 9.5, None, 8, 10**9, reserve) == 9.5 * 1024
    with pytest.raises(InvalidOptionError, match=r"^--kv-cache-gib 9\.9 does not fit: 10\.00 GiB is free after the "
                                                 r"weights, 0\.25 GiB of it kept for CUDA graphs; give --kv-cache-gib "
                                                 r"9\.74 or less \(or --enforce-eager\)$"):
        kv_cache_blocks(per_block, 10 * gib, 80 * gib, 9.9, None, 8, 10**9, reserve)
    assert kv_cache_blocks(per_block, 10 * gib, 80 * gib, 9.74, None, 8, 10**9, reserve) <= 10 * 1024 - 256 - 1
    # on the fake GPU, whose 5 graphs take 80% of the reserve (scaled to this tiny engine: a
    # quarter of what its KV cache could use): memory for the weights, the reserve and half of
    # that cache. Without the reserve the cache would take all but a block and the first graph
    # would not instantiate.
    gc.collect()  # executors of earlier tests: their memory is freed now, not while this one measures
    ex = CudaExecutor(engine, kv_cache_gib=0, enforce_eager=True)
    loaded = ex.device.info()["total_bytes"] - ex.device.info()["free_bytes"] - ex.kv_cache_bytes
    per_block = ex._ex.kv_bytes_per_block
    usable = -(-engine.build["max_seq_len"] // engine.build["kv_block_size"]) * engine.build["max_batch_size"]
    del ex
    reserve = usable * per_block // 4
    monkeypatch.setattr(cuda_executor, "GRAPH_RESERVE_BYTES", reserve)
    fake_cuda.set(memory_mib=(loaded + reserve + usable * per_block // 2) / mib, graph_mib=0.8 * reserve / 5 / mib)
    ex = CudaExecutor(engine, gpu_memory_utilization=1.0)
    assert ex.graph_buckets == [1, 2, 4, 8, 16]
    assert usable // 2 - 2 <= ex.num_kv_blocks <= usable // 2  # the cache took what it could
    del ex
    gc.collect()
    with pytest.raises(InvalidOptionError, match=r"give --kv-cache-gib (0\.\d{4}) or less") as refused:
        CudaExecutor(engine, kv_cache_gib=usable * per_block / gib)
    fitting = float(re.search(r"give --kv-cache-gib (\S+)", str(refused.value)).group(1))
    del refused  # its traceback holds the refused executor's device memory
    gc.collect()
    assert CudaExecutor(engine, kv_cache_gib=fitting).graph_buckets == [1, 2, 4, 8, 16]


def test_kernel_launch_binding_makes_the_context_current(fake_cuda, tiny_cubin):
    """The fake driver, like a real one, refuses a launch from a thread with no current context."""
    cubin, meta = tiny_cubin
    kernel = native().Kernel(open_device(0, "sm_90a"), cubin, meta)
    errors = []

    def launch():
        try:
            # the tiny kernel's table: x_ptr, y_ptr, n_rows (i32), scale (fp32), two scratch pointers
            kernel.launch([2, 1, 1], struct.pack("<QQifQQ", 0, 0, 2, 1.0, 0, 0))
        except Exception as e:  # noqa: BLE001 - reported to the test thread
            errors.append(e)

    thread = threading.Thread(target=launch)
    thread.start()
    thread.join()
    assert errors == [] and len(fake_cuda.records("cuLaunchKernelEx")) == 1
    refused = [r for r in fake_cuda.records() if r.get("error") == 201]  # CUDA_ERROR_INVALID_CONTEXT
    assert refused == []
