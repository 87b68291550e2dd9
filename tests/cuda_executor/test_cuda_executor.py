"""The C++ cuda executor end to end on CPU, against the fake libcuda.so.1: a tiny cuda engine
loaded (weights uploaded exactly, through bounded pinned staging; every cubin loaded and
checked), steps run (inputs derived as targets/cuda/step_inputs.py does, uploaded in one
copy, nothing allocated on the device), decode steps replayed from CUDA graphs (padded to a
bucket), and every launch of a prefill and of decode steps compared with the interpreted
launcher of targets/cuda/interpret.py: same kernels in the same order, same grids, same
arguments. The kernels themselves do not run here (the fake driver has no GPU); the GPU
script (tests/gpu/check.sh) measures what they compute."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from edit_loop import check_subset
from fake_driver import HERE
# the fake driver's fixtures (imported here, not in a conftest.py: a second module named
# conftest would shadow tests/conftest.py for the tests that import from it)
from fake_driver import fake_cuda, fake_libcuda, tiny_cubin  # noqa: F401
from launches import PointerMap, from_fake_log

from bessemer.errors import DeviceError, InvalidOptionError, RequestError
from bessemer.format.step import FIELDS, StepBatch
from bessemer.format.kv import section_bytes_per_token
from bessemer.runtime.engine import Engine
from bessemer.runtime.executor import SamplingRows
from bessemer.targets.cuda import step_inputs
from bessemer.targets.cuda.executor import CudaExecutor, graph_buckets, kv_cache_blocks

pytestmark = pytest.mark.usefixtures("fake_cuda")
KIND = "llama-tied"  # the engine part 1's tests build too: compiled once per session


@pytest.fixture
def engine(cuda_engine):
    return Engine.load(cuda_engine(KIND))


def _prefill():
    """Two prompts (5 and 3 tokens; blocks of 4) in one step, logits of their last rows."""
    return dict(token_ids=[11, 12, 13, 14, 15, 21, 22, 23], positions=[0, 1, 2, 3, 4, 0, 1, 2],
                cu_seqlens=[0, 5, 8], context_lens=[5, 3], block_tables=[[0, 1], [2, -1]], logits_indices=[4, 7])


def _decode(n: int):
    """One new token for each of n sequences (the first two continue _prefill's prompts)."""
    ctx = [6, 4, 2, 9][:n]
    tables = [[0, 1, -1], [2, -1, -1], [3, -1, -1], [4, 5, 6]][:n]
    return dict(token_ids=[16, 24, 31, 41][:n], positions=[c - 1 for c in ctx], cu_seqlens=list(range(n + 1)),
                context_lens=ctx, block_tables=tables, logits_indices=list(range(n)))


def _batch(step: dict) -> StepBatch:
    return StepBatch.of(*(step[k] for k in FIELDS))


def _sampling(n: int):
    return [0.0, 0.8, 0.0, 1.3][:n], [0, 5, 0, 0][:n], [1.0, 0.9, 1.0, 0.5][:n], [0.0, 0.3, 0.0, 0.7][:n]


def _rows(n: int) -> SamplingRows:
    return SamplingRows(*(np.asarray(a) for a in _sampling(n)))


def _loaded(engine, fake_cuda, **options) -> tuple[CudaExecutor, int]:
    """An executor on the fake GPU, and the fake driver's module index of its kernel 0."""
    ex = CudaExecutor(engine, **options)
    return ex, fake_cuda.records("cuModuleLoadData")[-len(engine.header["kernels"])]["module"]


def _step_region(ex: CudaExecutor, counts: dict) -> dict:
    """The step arrays as they are on the device now, laid out for `counts`."""
    base, _ = ex.memory_map()["step"]
    layout = ex.step_layout(counts)
    out = {}
    for name, (off, elems) in ((n, v) for n, v in layout.items() if n != "upload_bytes"):
        dtype = np.float32 if name in ("temperature", "top_p", "uniform") else np.int32
        out[name] = np.frombuffer(ex.read_device(base + off, 4 * elems), dtype=dtype) if elems else np.zeros(0, dtype)
    return out


def test_load_uploads_every_weight_exactly_through_bounded_pinned_staging(engine, fake_cuda):
    chunk = 32 << 10
    ex = CudaExecutor(engine, kv_cache_gib=0.01, upload_chunk_bytes=chunk)
    data = (engine.dir / "rank0.engine").read_bytes()[engine.data_offset:]
    weights = [t for t in engine.header["tensors"] if not t["name"].startswith("cubin/")]
    regions = ex.memory_map()
    for t in weights:
        ptr, nbytes = regions["weight:" + t["name"]]
        assert nbytes == t["nbytes"] and ptr % 64 == 0
        assert ex.read_device(ptr, nbytes) == data[t["offset"]: t["offset"] + t["nbytes"]], t["name"]
    span = max(t["offset"] + t["nbytes"] for t in weights) - min(t["offset"] for t in weights)
    copies = [r for r in fake_cuda.records("cuMemcpyHtoDAsync") if r["dst"] >= regions["weight:" + weights[0]["name"]][0]]
    assert len([r for r in copies if r["bytes"] <= chunk]) >= -(-span // chunk) > 2  # chunked, several chunks
    # pinned host memory never exceeds the two staging buffers plus the step buffers (inputs,
    # sampled tokens, a decode step's logits)
    step_bytes = regions["step"][1]
    limits = engine.header["plan"]["limits"]
    logits_bytes = 4 * limits["max_batch_size"] * engine.header["plan"]["vocab_size"]
    peak = max(r["pinned"] for r in fake_cuda.records("cuMemHostAlloc"))
    assert peak <= 2 * chunk + step_bytes + 4 * limits["max_num_tokens"] + logits_bytes
    # every cubin loaded (its parameter table checked: a mismatch fails the load, see
    # test_cuda_driver), and >48 KiB of shared memory opted in for exactly the kernels that need it
    kernels = engine.header["kernels"]
    assert len(fake_cuda.records("cuModuleLoadData")) == len(kernels)
    opted = sorted((r["entry"], r["value"]) for r in fake_cuda.records("cuFuncSetAttribute"))
    assert opted == sorted((k["entry"], k["shared"]) for k in kernels if k["shared"] > 48 * 1024)


def test_steps_upload_inputs_in_one_copy_as_the_reference_derives_them(engine, fake_cuda):
    ex = CudaExecutor(engine, kv_cache_gib=0.01)
    plan = engine.header["plan"]
    limits = plan["limits"]
    fake_cuda.clear()
    step = _prefill()
    logits = ex.step(_batch(step))
    assert logits.shape == (2, plan["vocab_size"]) and logits.dtype == np.float32
    ref, counts = step_inputs.derive(*_batch(step).arrays(), block_size=limits["kv_block_size"],
                                     tile_tokens=plan["attention"]["tile_tokens"],
                                     max_blocks_per_seq=limits["max_blocks_per_seq"], num_blocks=ex.num_kv_blocks)
    on_device = _step_region(ex, counts)
    for name, values in ref.items():
        np.testing.assert_array_equal(on_device[name], np.asarray(values).ravel(), err_msg=name)
    (upload,) = fake_cuda.records("cuMemcpyHtoDAsync")
    assert upload["dst"] == ex.memory_map()["step"][0] and upload["bytes"] == ex.step_layout(counts)["upload_bytes"]
    # a second (sampled, eager) step: again one upload; nothing is allocated during steps
    ex.use_graphs = False
    fake_cuda.clear()
    temperature, top_k, top_p, uniform = _sampling(2)
    tokens, _ = ex.sampler.sample(_batch(_decode(2)), _rows(2))
    assert tokens.shape == (2,) and tokens.dtype == np.int32
    calls = [r["fn"] for r in fake_cuda.records()]
    assert calls.count("cuMemcpyHtoDAsync") == 1 and calls.count("cuMemcpyDtoHAsync") == 1  # tokens only
    assert not {"cuMemAlloc", "cuMemHostAlloc", "cuMemFree", "cuMemFreeHost", "cuModuleLoadData"} & set(calls)
    dec = _step_region(ex, dict(tokens=2, selected=2, seqs=2, prefill_tiles=0, decode_seqs=2))
    np.testing.assert_array_equal(dec["temperature"], np.float32(temperature))
    np.testing.assert_array_equal(dec["top_k"], top_k)
    np.testing.assert_array_equal(dec["top_p"], np.float32(top_p))
    np.testing.assert_array_equal(dec["uniform"], np.float32(uniform))


def test_decode_steps_replay_cuda_graphs_padded_to_a_bucket(engine, fake_cuda):
    ex, first = _loaded(engine, fake_cuda, kv_cache_gib=0.01)
    limits = engine.header["plan"]["limits"]
    assert ex.graph_buckets == graph_buckets(limits["max_batch_size"], limits["max_num_tokens"]) == [1, 2, 4, 8, 16]
    captures = fake_cuda.records("cuStreamEndCapture")
    assert len(captures) == 5 and all(c["nodes"] > 0 for c in captures)
    fake_cuda.clear()
    ex.sampler.sample(_batch(_decode(3)), _rows(3))  # 3 sequences: the graph of 4
    (replay,) = fake_cuda.records("cuGraphLaunch")
    assert ex.stats()["graph_steps"] == 1
    launches = fake_cuda.records("cuLaunchKernelEx")
    assert len(launches) == replay["nodes"] and all(r["replay"] == replay["graph"] for r in launches)
    # the padding sequence: one token at position 0, its KV in the block no sequence owns
    pad = ex.num_kv_blocks
    region = _step_region(ex, dict(tokens=4, selected=4, seqs=4, prefill_tiles=0, decode_seqs=4))
    bs, width = limits["kv_block_size"], limits["max_blocks_per_seq"]
    np.testing.assert_array_equal(region["token_ids"], [16, 24, 31, 0])
    np.testing.assert_array_equal(region["positions"], [5, 3, 1, 0])
    np.testing.assert_array_equal(region["context_lens"], [6, 4, 2, 1])
    np.testing.assert_array_equal(region["slot_mapping"], [1 * bs + 1, 2 * bs + 3, 3 * bs + 1, pad * bs])
    np.testing.assert_array_equal(region["block_tables"].reshape(4, width)[3], [pad] + [-1] * (width - 1))
    np.testing.assert_array_equal(region["decode_seqs"], [0, 1, 2, 3])
    np.testing.assert_array_equal(region["temperature"], np.float32([0.0, 0.8, 0.0, 0.0]))
    # a graph replays exactly what the eager launcher launches for the same step
    pointers = PointerMap(ex.memory_map(), ex.step_layout(dict(tokens=4, selected=4, seqs=4, prefill_tiles=0,
                                                                decode_seqs=4)))
    fake_cuda.clear()
    ex.sampler.sample(_batch(_decode(4)), _rows(4))
    graph = from_fake_log(fake_cuda.records(), engine.header, pointers, first)
    ex.use_graphs = False
    fake_cuda.clear()
    ex.sampler.sample(_batch(_decode(4)), _rows(4))
    eager = from_fake_log(fake_cuda.records(), engine.header, pointers, first)
    assert [dict(g, replay=0) for g in graph] == eager and all(g["replay"] for g in graph)


@pytest.fixture(scope="session")
def interpreted():
    """The interpreted launcher's launches for a list of steps: a function of (engine_dir,
    num_kv_blocks, steps, tmp_path), answered by one child process started with
    TRITON_INTERPRET=1 (the interpreter must be on before any kernel module is imported) and
    kept for the session (interpreted_launches.py --serve), each engine in its own executor."""
    # started inside the first test that asks, whose fake driver it must not take with it
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BESSEMER_LIBCUDA", "BESSEMER_FAKE_CUDA"))}
    child = subprocess.Popen([sys.executable, str(HERE / "interpreted_launches.py"), "--serve"],
                             env=dict(env, TRITON_INTERPRET="1"), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)

    def launches(engine_dir, num_kv_blocks: int, steps: list, tmp_path) -> list:
        (tmp_path / "steps.json").write_text(json.dumps(steps))
        request = [str(engine_dir), num_kv_blocks, str(tmp_path / "steps.json"), str(tmp_path / "out.json")]
        child.stdin.write(json.dumps(request) + "\n")
        child.stdin.flush()
        reply = child.stdout.readline()
        assert reply.startswith("ok"), json.loads(reply[len("error "):]) if reply.startswith("error ") else \
            f"the interpreted launcher exited ({child.poll()})"
        return json.loads((tmp_path / "out.json").read_text())

    yield launches
    child.stdin.close()
    child.wait()


@pytest.mark.parametrize("kind,kv,quant", check_subset(
    [(KIND, None, None), (KIND, "int8", None), (KIND, None, "w4a16"), (KIND, None, "none"), ("gpt-oss", None, None),
     ("gpt-oss", None, "w4a16")],
    keep=[(KIND, None, None), (KIND, "int8", None)]))
def test_every_launch_matches_the_interpreted_launcher(kind, kv, quant, cuda_engine, quant_cuda_engine, fake_cuda,
                                                      interpreted, tmp_path):
    """A prefill of two prompts, a decode step of two sequences with sampling (a graph
    replay), and a decode step of three with graphs off: kernel, grid and every argument of
    every launch equal the interpreted launcher's; block = 32 x compiled num_warps, shared
    bytes = the kernel's, Triton's scratch pointers NULL (no kernel asks for scratch).
    kv int8: a one-byte cache whose scales follow each block's codes; the runtime sizes a
    block as format/kv.py counts it, and the scale pointers are the cache regions. w4a16 g32,
    and bf16 ("none") at intermediate 128: the decode GEMMs split K over a second grid axis,
    with the split-K workspace. gpt-oss: the moe launches (3-D grids, int32 and fp32
    workspace arrays) and attention with sinks; with w4a16 its experts' grouped launches (the
    sort's count argument, bf16 workspace arrays)."""
    if quant:  # widths that are whole numbers of 32-wide groups
        engine = Engine.load(quant_cuda_engine(kind, quant))
        workspace = {w["name"]: w["dtype"] for w in engine.header["plan"]["workspace"]}
        assert workspace.keys() >= {"split_k_partials", "split_k_counters"}
        if quant == "none":  # the dense down_proj (K 128: two blocks of 64) splits K
            assert any(k["function"] == "gemm_kernel" and k["constexprs"]["SPLIT_K"] == 2
                       for k in engine.header["kernels"])
        if kind == "gpt-oss":  # int4 experts: the grouped launches and their bf16 / int32 arrays
            assert workspace["moe_h_grouped"] == "bfloat16" and workspace["moe_sorted"] == "int32"
    else:
        engine = Engine.load(cuda_engine(kind, **({"kv_cache_dtype": kv} if kv else {})))
    ex, first = _loaded(engine, fake_cuda, kv_cache_gib=0.01)
    kv_section = engine.header["plan"]["kv_cache"]
    assert ex._ex.kv_bytes_per_block == engine.build["kv_block_size"] * section_bytes_per_token(kv_section)
    kernels = engine.header["kernels"]
    steps = [(_prefill(), None, True), (_decode(2), _sampling(2), True), (_decode(3), _sampling(3), False)]
    expected = interpreted(engine.dir, ex.num_kv_blocks,
                           [{"inputs": [s[k] for k in ("token_ids", "positions", "cu_seqlens", "context_lens",
                                                        "block_tables", "logits_indices")],
                             "sample": list(sampling) if sampling else None} for s, sampling, _ in steps], tmp_path)
    for (step, sampling, graphs), want in zip(steps, expected):
        ex.use_graphs = graphs
        fake_cuda.clear()
        if sampling:
            ex.sampler.sample(_batch(step), SamplingRows(*(np.asarray(a) for a in sampling)))
        else:
            ex.step(_batch(step))
        n, t = len(step["context_lens"]), len(step["token_ids"])
        tiles = len(step_inputs.prefill_tiles(np.asarray(step["cu_seqlens"]), engine.header["plan"]["attention"]["tile_tokens"]))
        decode = int((np.diff(step["cu_seqlens"]) == 1).sum())
        counts = dict(tokens=t, selected=len(step["logits_indices"]), seqs=n, prefill_tiles=tiles, decode_seqs=decode)
        got = from_fake_log(fake_cuda.records(), engine.header, PointerMap(ex.memory_map(), ex.step_layout(counts)),
                            first)
        assert [bool(g["replay"]) for g in got] == [graphs and bool(sampling)] * len(got)
        assert len(got) == len(want) > 20
        for i, (g, w) in enumerate(zip(got, want)):
            where = f"launch {i} ({w['entry']})"
            assert (g["kernel"], g["entry"], g["grid"]) == (w["kernel"], w["entry"], w["grid"]), where
            assert g["args"] == w["args"], where
            k = kernels[g["kernel"]]
            assert g["block"] == [32 * k["num_warps"], 1, 1] and g["shared"] == k["shared"], where
            assert g["scratch"] == [["null"], ["null"]], where


def test_kv_cache_budget(engine, fake_cuda):
    per_block, gib = 1 << 20, 1 << 30
    # utilization: U x total minus what is in use (here 30 GiB of 80 by others and weights)
    assert kv_cache_blocks(per_block, 50 * gib, 80 * gib, None, 0.5, 8, 10**9) == 10 * 1024
    assert kv_cache_blocks(per_block, 50 * gib, 80 * gib, None, None, 8, 10**9) == 42 * 1024  # 0.9 by default
    assert kv_cache_blocks(per_block, 50 * gib, 80 * gib, None, None, 8, 100) == 100  # no more than usable
    assert kv_cache_blocks(per_block, 50 * gib, 80 * gib, 2.0, None, 8, 10**9) == 2048
    assert kv_cache_blocks(per_block, 50 * gib, 80 * gib, 0, None, 8, 10**9) == 8  # 0: the minimum pool
    with pytest.raises(InvalidOptionError, match="not both"):
        kv_cache_blocks(per_block, 50 * gib, 80 * gib, 2.0, 0.5, 8, 10**9)
    with pytest.raises(InvalidOptionError, match=r"fewer than one full-length sequence needs \(8 x 1\.00 MiB\)"):
        kv_cache_blocks(per_block, 50 * gib, 80 * gib, None, 0.3, 8, 10**9)
    with pytest.raises(InvalidOptionError, match=r"must be in \(0, 1\]"):
        kv_cache_blocks(per_block, 50 * gib, 80 * gib, None, 1.5, 8, 10**9)
    # on the (fake) GPU: 64 MiB, utilization 0.5 -> what is left of 32 MiB after the load
    fake_cuda.set(memory_mib=64)
    ex = CudaExecutor(engine, gpu_memory_utilization=0.5, enforce_eager=True)
    loaded = ex.stats()["weight_bytes"] + ex.stats()["activation_bytes"]
    per_seq = -(-engine.build["max_seq_len"] // engine.build["kv_block_size"])
    usable = per_seq * engine.build["max_batch_size"]
    assert ex.num_kv_blocks == min(usable, (32 * 2**20 - loaded) // ex._ex.kv_bytes_per_block)
    assert ex.graph_buckets == [] and not fake_cuda.records("cuStreamBeginCapture")


def test_bad_steps_are_refused_with_one_line(engine):
    ex = CudaExecutor(engine, kv_cache_gib=0.01, enforce_eager=True)
    vocab = engine.header["plan"]["vocab_size"]
    bad_token = dict(_prefill(), token_ids=[11, 12, 13, 14, vocab, 21, 22, 23])
    # index checks are the engine contract's (format/csrc/step_batch.h), worded as on every target
    with pytest.raises(RequestError, match=rf"^token_ids\[4\]={vocab} outside \[0, {vocab}\)$"):
        ex.step(_batch(bad_token))
    with pytest.raises(RequestError, match=r"^block_tables entry 9999 outside \[-1, "):
        ex.step(_batch(dict(_prefill(), block_tables=[[0, 9999], [2, -1]])))
    limit = engine.build["max_num_tokens"]
    n = limit + 1
    with pytest.raises(RequestError, match=rf"^the step has {n} tokens; the engine allows {limit} per step"):
        ex.step(_batch(dict(token_ids=[1] * n, positions=list(range(n)), cu_seqlens=[0, n], context_lens=[n],
                            block_tables=[list(range(-(-n // 4)))], logits_indices=[n - 1])))
    with pytest.raises(RequestError, match="consecutive positions"):
        ex.step(_batch(dict(_prefill(), positions=[0, 1, 2, 4, 3, 0, 1, 2])))


def test_llm_samples_on_the_device_unless_a_row_needs_the_logits(cuda_engine, fake_cuda):
    from bessemer.runtime.llm import LLM, SamplingParams

    llm = LLM(cuda_engine(KIND), kv_cache_gib=0.01)
    vocab = llm.vocab_size
    fake_cuda.clear()
    out = llm.generate([[1, 2, 3, 4, 5], [7, 8, 9]], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    assert [len(o.token_ids) for o in out] == [4, 4]
    copies = fake_cuda.records("cuMemcpyDtoHAsync")
    assert copies and all(c["bytes"] <= 4 * 2 for c in copies)  # token ids only, never the logits
    assert llm.executor.stats()["graph_steps"] == 3  # the decode steps; the prefill is eager
    fake_cuda.clear()
    llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2, temperature=0, repetition_penalty=1.2, ignore_eos=True))
    assert {c["bytes"] for c in fake_cuda.records("cuMemcpyDtoHAsync")} == {4 * vocab}  # logits to the host


def test_a_gpu_of_another_arch_is_refused_naming_both(cuda_engine, fake_cuda):
    from bessemer.runtime.llm import LLM

    fake_cuda.set(cc="8.0")
    with pytest.raises(DeviceError, match=r"built for sm_90a .* is compute capability 8\.0"):
        LLM(cuda_engine(KIND))


def test_cli_runs_a_cuda_engine_or_says_why_not(cuda_engine, fake_cuda, tmp_path):
    engine = cuda_engine(KIND)
    env = dict(os.environ)
    ok = subprocess.run(["bessemer", "inspect", str(engine), "--device"], capture_output=True, text=True, env=env)
    assert ok.returncode == 0 and "target        cuda" in ok.stdout and "Fake GPU 0" in ok.stdout, ok.stderr
    env["BESSEMER_LIBCUDA"] = str(tmp_path / "libcuda.so.1")
    for cmd in (["run-engine", str(engine), "--prompt", "hi"], ["bessemer", "eval", str(engine), "--dataset", "wikitext2"]):
        run = subprocess.run(cmd, capture_output=True, text=True, env=env)
        assert run.returncode == 1
        errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and errors[0].startswith("error: no CUDA driver"), run.stderr
    env["BESSEMER_LIBCUDA"] = str(fake_cuda.library)
    run = subprocess.run(["run-engine", str(engine), "--prompt", "hi", "--device", "3"], capture_output=True,
                         text=True, env=env)
    assert run.returncode == 1 and "error: GPU 3 does not exist: the driver sees 1" in run.stderr
