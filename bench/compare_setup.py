"""What bench/compare.py needs before it can measure, each made once and cached under
~/.cache/bessemer/bench (override: $BESSEMER_BENCH_CACHE), keyed by its inputs:

  venv/              the anchors: a venv with --system-site-packages (reuses the installed
                     torch/transformers/numpy) holding llama-cpp-python (compiled from the
                     PyPI sdist: CPU, -DGGML_NATIVE=ON, no BLAS/CUDA), onnxruntime-genai and
                     what its model builder and llama.cpp's converter import
  gguf/KEY/          F32 from llama.cpp's convert_hf_to_gguf.py (in the sdist), then Q8_0,
                     Q4_0, Q4_K_M, ... (GGUF_TYPES) through llama.cpp's own quantizer
                     (llama_model_quantize, no importance matrix)
  onnx/KEY/          onnxruntime-genai's model builder output, int4 and fp32 (-e cpu)
  engines/KEY/       Bessemer engines (build-engine of this tree)
KEY = a hash of the checkpoint's content and of everything else the artifact depends on.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

LLAMA_CPP_VERSION = "0.3.36"
ORT_GENAI_VERSION = "0.18.0"
# what the ORT model builder and llama.cpp's converter import beyond the shared interpreter
ANCHOR_EXTRAS = ["onnx", "onnx_ir", "sentencepiece", "diskcache", "jinja2", "typing-extensions"]
LLAMA_CMAKE_ARGS = ("-DGGML_NATIVE=ON -DGGML_BLAS=OFF -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF "
                    "-DGGML_OPENMP=ON -DLLAVA_BUILD=OFF -DLLAMA_CURL=OFF")
# llama.cpp's file types (llama_ftype names). Q4_K_M/Q4_K_S/IQ4_XS use 256-wide super-blocks: on
# a model whose rows are not a multiple of 256 (SmolLM2: 576) llama.cpp falls back per tensor
# (Q4_K -> Q5_0, Q6_K -> Q8_0, IQ4_XS -> IQ4_NL), so their bits per weight are measured, not named.
GGUF_TYPES = {"f32": None, "q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0", "q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0",
              "q4_1": "LLAMA_FTYPE_MOSTLY_Q4_1", "q4_k_m": "LLAMA_FTYPE_MOSTLY_Q4_K_M",
              "q4_k_s": "LLAMA_FTYPE_MOSTLY_Q4_K_S", "iq4_nl": "LLAMA_FTYPE_MOSTLY_IQ4_NL",
              "iq4_xs": "LLAMA_FTYPE_MOSTLY_IQ4_XS", "q5_0": "LLAMA_FTYPE_MOSTLY_Q5_0"}
ORT_PRECISIONS = ("int4", "fp32")


def say(msg: str) -> None:
    print(f"[compare] {msg}", file=sys.stderr, flush=True)


def cache_root() -> Path:
    return Path(os.environ.get("BESSEMER_BENCH_CACHE", Path.home() / ".cache/bessemer/bench"))


def venv_python() -> Path:
    return cache_root() / "venv/bin/python"


def short_hash(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def _run_logged(cmd: list[str], log: Path, env: dict | None = None, what: str = "", cwd: Path | None = None) -> dict:
    """Runs cmd with its output in `log`, printing progress every 30 s; on failure, the log's
    tail and one error line. Returns {"wall_s", "peak_rss_bytes"}: the child's own peak resident
    set (wait4's rusage of that one process; its own children are not counted)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}, cwd=cwd)
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                proc.returncode = os.waitstatus_to_exitcode(status)
                break
            time.sleep(1)
            if int(time.time() - t0) % 30 == 0:
                say(f"  {what}: {int(time.time() - t0)} s (log: {log})")
    if proc.returncode != 0:
        tail = log.read_text(errors="replace").splitlines()[-15:]
        print("\n".join(tail), file=sys.stderr)
        raise SystemExit(f"error: {what} failed (exit {proc.returncode}); full log in {log}")
    say(f"  {what}: done in {time.time() - t0:.0f} s")
    return {"wall_s": round(time.time() - t0, 1), "peak_rss_bytes": usage.ru_maxrss * 1024}  # ru_maxrss: KiB


# ---- the anchors' venv ----
def _has(py: Path, module: str) -> bool:
    return subprocess.run([str(py), "-c", f"import {module}"], capture_output=True).returncode == 0


def sdist_dir() -> Path:
    return cache_root() / f"src/llama_cpp_python-{LLAMA_CPP_VERSION}"


def ensure_venv(need_llama: bool, need_ort: bool) -> Path:
    """Creates the anchors' venv and installs what is missing. llama-cpp-python is compiled
    here (many minutes on 2 cores; its log says how far it got)."""
    root = cache_root()
    py = venv_python()
    if not py.exists():
        say(f"creating the anchors' venv {root / 'venv'}")
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(root / "venv")], check=True)
    pip = [str(py), "-m", "pip", "install", "-q"]
    if not all(_has(py, m) for m in ("onnx", "onnx_ir", "sentencepiece", "diskcache", "jinja2")):
        _run_logged(pip + ANCHOR_EXTRAS, root / "logs/pip_extras.log", what="pip install " + " ".join(ANCHOR_EXTRAS))
    if need_ort and not _has(py, "onnxruntime_genai"):
        _run_logged(pip + [f"onnxruntime-genai=={ORT_GENAI_VERSION}"], root / "logs/pip_ortgenai.log",
                    what=f"pip install onnxruntime-genai=={ORT_GENAI_VERSION}")
    src = sdist_dir()
    if need_llama and not (src / "vendor/llama.cpp/convert_hf_to_gguf.py").exists():
        # the sdist: its vendor/llama.cpp has the converter, and pip builds from it
        (root / "src").mkdir(parents=True, exist_ok=True)
        _run_logged([str(py), "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                     f"llama-cpp-python=={LLAMA_CPP_VERSION}", "-d", str(root / "src")],
                    root / "logs/pip_download_llama.log", what="download the llama-cpp-python sdist")
        subprocess.run(["tar", "xzf", str(root / f"src/llama_cpp_python-{LLAMA_CPP_VERSION}.tar.gz"), "-C",
                        str(root / "src")], check=True)
    if need_llama and not _has(py, "llama_cpp"):
        say(f"compiling llama-cpp-python {LLAMA_CPP_VERSION} from source (CPU, native; 20+ min on 2 loaded cores)")
        _run_logged([str(py), "-m", "pip", "install", "-v", "--no-deps", str(src)], root / "logs/llama_build.log",
                    env={"CMAKE_ARGS": LLAMA_CMAKE_ARGS, "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 2)},
                    what="build llama-cpp-python")
    return py


# ---- models for the anchors ----
def _done(d: Path) -> bool:
    return (d / ".done").exists()


def _mark(d: Path, info: dict) -> None:
    (d / ".done").write_text(json.dumps(info, indent=1))


def gguf_files(model_dir: Path, ckpt_hash: str, types: list[str], outtype: str = "f32") -> dict[str, Path]:
    """GGUF files of the checkpoint: converted at `outtype` (f32, or bf16: a bf16 checkpoint's
    values exactly, half the bytes on disk), the others quantized from it. Tensors the checkpoint
    stores quantized (gpt-oss's MXFP4 experts) the converter copies as they are, at any outtype.
    Each file's {"wall_s", "peak_rss_bytes"} of making it is kept beside it (FILE.json). The
    converted file may be deleted to save disk once the quantized ones exist: it is made again
    only when a type is missing."""
    py = venv_python()
    d = cache_root() / "gguf" / short_hash(ckpt_hash, LLAMA_CPP_VERSION, *([outtype] if outtype != "f32" else []))
    d.mkdir(parents=True, exist_ok=True)
    f32 = d / f"{outtype}.gguf"
    llama = sdist_dir() / "vendor/llama.cpp"
    missing = [t for t in types if t != outtype and not (d / f"{t}.gguf").exists()]
    if not (f32.exists() and _done(d)) and (missing or outtype in types or not types):
        say(f"converting the checkpoint to GGUF {outtype.upper()} (llama.cpp convert_hf_to_gguf.py)")
        cost = _run_logged([str(py), str(llama / "convert_hf_to_gguf.py"), str(model_dir), "--outtype", outtype,
                            "--outfile", str(f32)], d / "convert.log", env={"PYTHONPATH": str(llama / "gguf-py")},
                           what="convert_hf_to_gguf")
        f32.with_suffix(".json").write_text(json.dumps(cost))
        _mark(d, {"from": str(model_dir)})
    out = {outtype: f32}
    for t in types:
        if t == outtype:
            continue
        path = d / f"{t}.gguf"
        if not path.exists():
            say(f"quantizing GGUF {t.upper()} (llama_model_quantize)")
            code = ("import llama_cpp as L, sys\n"
                    "p = L.llama_model_quantize_default_params()\n"
                    f"p.ftype = L.{GGUF_TYPES[t]}\np.nthread = 2\n"
                    "rc = L.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), p)\n"
                    "sys.exit(rc)\n")
            tmp = path.with_suffix(".tmp")
            cost = _run_logged([str(py), "-c", code, str(f32), str(tmp)], d / f"quantize_{t}.log", what=f"quantize {t}")
            path.with_suffix(".json").write_text(json.dumps(cost))
            tmp.rename(path)
        out[t] = path
    return out


def gguf_tensors(path: Path) -> tuple[list[tuple[str, int]], dict[str, str]]:
    """(name, bytes) of every tensor of a GGUF file and its type, read with the gguf package."""
    sys.path.insert(0, str(sdist_dir() / "vendor/llama.cpp/gguf-py"))
    try:
        from gguf import GGUFReader
    finally:
        sys.path.pop(0)
    r = GGUFReader(str(path))
    return [(t.name, int(t.n_bytes)) for t in r.tensors], {t.name: t.tensor_type.name for t in r.tensors}


def gguf_bits(path: Path) -> tuple[dict, dict[str, int]]:
    """Bits per weight of a GGUF file by the buckets of bessemer/quantization/bits.py (decoder:
    the blk.* matrices; lm_head: output.weight, or token_embd when tied; embedding: token_embd
    when output.weight exists), and how many matrices each GGML type holds."""
    sys.path.insert(0, str(sdist_dir() / "vendor/llama.cpp/gguf-py"))
    try:
        from gguf import GGUFReader
    finally:
        sys.path.pop(0)
    mats = [t for t in GGUFReader(str(path)).tensors if len([d for d in t.shape if d > 1]) == 2]
    untied = any(t.name == "output.weight" for t in mats)
    sums: dict[str, list[int]] = {}
    types: dict[str, int] = {}
    for t in mats:
        b = ("lm_head" if t.name == "output.weight" or (t.name == "token_embd.weight" and not untied) else
             "embedding" if t.name == "token_embd.weight" else "decoder")
        acc = sums.setdefault(b, [0, 0])
        acc[0] += int(t.n_elements)
        acc[1] += int(t.n_bytes)
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
    out = {b: {"bpw": round(8 * n / w, 3), "weights": w, "bytes": n}
           for b in ("decoder", "lm_head", "embedding") if b in sums for w, n in [sums[b]]}
    w, n = sum(v["weights"] for v in out.values()), sum(v["bytes"] for v in out.values())
    out["all"] = {"bpw": round(8 * n / w, 3), "weights": w, "bytes": n}
    return out, types


def onnx_model(model_dir: Path, ckpt_hash: str, precision: str) -> Path:
    py = venv_python()
    d = cache_root() / "onnx" / short_hash(ckpt_hash, ORT_GENAI_VERSION, precision)
    if not _done(d):
        if d.exists():
            shutil.rmtree(d)
        say(f"building the ONNX {precision} model (onnxruntime_genai.models.builder -p {precision} -e cpu)")
        work = d.with_name(d.name + ".cache")
        _run_logged([str(py), "-m", "onnxruntime_genai.models.builder", "-i", str(model_dir), "-o", str(d),
                     "-p", precision, "-e", "cpu", "-c", str(work)], d.with_name(d.name + ".log"),
                    what=f"ORT-genai builder {precision}")
        shutil.rmtree(work, ignore_errors=True)
        _mark(d, {"precision": precision})
    return d


def onnx_tensors(d: Path) -> tuple[list[tuple[str, int]], dict[str, str]]:
    """(name, bytes) of the ONNX initializers (from the external-data records, no data read);
    the RoPE cos/sin tables are left out: a step reads one row of them."""
    code = ("import onnx, json, sys\n"
            "m = onnx.load(sys.argv[1], load_external_data=False)\n"
            "out = []\n"
            "for t in m.graph.initializer:\n"
            "    n = [int(e.value) for e in t.external_data if e.key == 'length']\n"
            "    out.append([t.name, n[0] if n else len(t.raw_data), onnx.TensorProto.DataType.Name(t.data_type)])\n"
            "print(json.dumps(out))\n")
    res = subprocess.run([str(venv_python()), "-c", code, str(d / "model.onnx")], capture_output=True, text=True, check=True)
    rows = [r for r in json.loads(res.stdout) if r[0] not in ("cos_cache", "sin_cache")]
    return [(n, b) for n, b, _ in rows], {n: t for n, _, t in rows}


# ---- Bessemer engines ----
def bessemer_modes() -> dict[str, bool]:
    """The builder's --quant modes -> whether the mode needs calibration text."""
    from bessemer.quantization.config import CALIBRATED, MODES

    return {m: algo in CALIBRATED for m, (_, algo) in MODES.items()}


def bessemer_engine(model_dir: Path, ckpt_hash: str, name: str, args: list[str], tree: Path | None = None) -> Path:
    """The engine of one recipe, built by this tree or by `tree` (a baseline_tree) and cached."""
    from bessemer.artifacts.inputs_hash import builder_source_hash

    import bessemer

    # a baseline tree is a fixed commit: its directory name (the commit) keys its engines
    builder = tree.name if tree else (builder_source_hash(), bessemer.__version__)
    d = cache_root() / "engines" / f"{name}-{short_hash(ckpt_hash, args, builder)}"
    if not (d / "config.json").exists():
        say(f"building Bessemer engine {name} ({' '.join(args)})")
        repo = tree or Path(__file__).resolve().parents[1]
        env = {"PYTHONPATH": f"{repo}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        cost = _run_logged([sys.executable, "-m", "bessemer.cli.build", str(model_dir), "--output", str(d), "-q", *args],
                           d.with_name(d.name + ".log"), env=env, what=f"build-engine {name}")
        build_cost_file(d).write_text(json.dumps(cost))
    return d


def build_cost_file(engine: Path) -> Path:
    """Where bessemer_engine keeps the build's {"wall_s", "peak_rss_bytes"}: beside the engine."""
    return engine.with_name(engine.name + ".build.json")


def baseline_tree(rev: str) -> Path:
    """An earlier commit of this repository, exported and built (C++ extension in place) once
    under the cache, so that its engines and runtime can be measured beside this tree's."""
    repo = Path(__file__).resolve().parents[1]
    res = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", f"{rev}^{{commit}}"], capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"error: --baseline {rev} is not a commit of {repo}; give a commit id or tag")
    sha = res.stdout.strip()
    tree = cache_root() / "trees" / sha[:12]
    if (tree / ".built").exists():
        return tree
    shutil.rmtree(tree, ignore_errors=True)
    tree.mkdir(parents=True)
    say(f"exporting and building the baseline {sha[:12]} in {tree}")
    archive = subprocess.Popen(["git", "-C", str(repo), "archive", sha], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(tree)], stdin=archive.stdout, check=True)
    if archive.wait() != 0:
        raise SystemExit(f"error: git archive {sha[:12]} failed")
    _run_logged([sys.executable, "setup.py", "build_ext", "--inplace", "-q"], tree.with_name(tree.name + ".build.log"),
                what=f"building the baseline's C++ extension ({sha[:12]})", cwd=tree)
    (tree / ".built").write_text(sha + "\n")
    return tree


def engine_tensors(d: Path) -> tuple[list[tuple[str, int]], dict[str, str]]:
    from bessemer.runtime.engine import Engine

    e = Engine.load(d, verify_checksum=False)
    t = e.header["tensors"]
    return [(x["name"], int(x["nbytes"])) for x in t], {x["name"]: f"dtype{x['dtype']}/layout{x['layout']}" for x in t}


def safetensors_tensors(model_dir: Path) -> tuple[list[tuple[str, int]], dict[str, str]]:
    """From the safetensors headers (8-byte length, then JSON): no weights read."""
    rows, types = [], {}
    for f in sorted(model_dir.glob("*.safetensors")):
        with open(f, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(n))
        for name, v in header.items():
            if name != "__metadata__":
                rows.append((name, v["data_offsets"][1] - v["data_offsets"][0]))
                types[name] = v["dtype"]
    return rows, types


# ---- memory bandwidth ----
def copy_bandwidth(threads: int, mib: int = 256, trials: int = 5) -> dict:
    """STREAM-style copy bandwidth with `threads` threads (numpy copies release the GIL):
    (bytes read + bytes written) / time, best of `trials` (load only lowers it)."""
    import numpy as np

    n = mib * 2**20 // 4
    src = np.ones(n, dtype=np.float32)
    dst = np.empty_like(src)
    parts = np.array_split(np.arange(n), threads)
    bounds = [(int(p[0]), int(p[-1]) + 1) for p in parts]

    def work(lo, hi):
        np.copyto(dst[lo:hi], src[lo:hi])

    best = 0.0
    for _ in range(trials):
        ts = [threading.Thread(target=work, args=b) for b in bounds]
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        best = max(best, 2 * src.nbytes / (time.perf_counter() - t0))
    return {"copy_GBps": round(best / 1e9, 2), "buffer_MiB": mib, "threads": threads, "trials": trials,
            "convention": "(read + write bytes) / s, best of trials"}
