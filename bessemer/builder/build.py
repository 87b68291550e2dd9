"""build_engine: the whole build as a few named steps.

    load config -> build graph -> run passes -> lower to a plan -> pack and write (atomic)

Weights are streamed: each engine tensor is read from the mmap'd safetensors, packed and
written before the next is touched, so peak memory stays near one tensor, not the model.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

import bessemer
from bessemer.builder.calibrate import calibrate
from bessemer.builder.checkpoint import Checkpoint
from bessemer.builder.config import BuildConfig
from bessemer.ir.graph import GraphError
from bessemer.builder.input_groups import input_groups
from bessemer.builder.moe_layers import moe_layers
from bessemer.builder.passes.quantize import expert_notes, expert_calibration_lines
from bessemer.builder.pipeline import run_passes
from bessemer.builder.precision_plan import plan_precision
from bessemer.builder.weights import WeightSource
from bessemer.format import container
from bessemer.format.kv import kv_cache_section
from bessemer.format.layouts import packed_nbytes
from bessemer.quantization.bits import bits_per_weight, format_bits
from bessemer.quantization.native_threads import thread_budget
from bessemer.errors import BessemerError, InvalidOptionError
from bessemer.models.registry import family_for
from bessemer.models.rope import max_exact_positions
from bessemer.targets import get_target

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "chat_template.jinja", "chat_template.json", "generation_config.json",
                   "tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json")
CONFIG_NAME = "config.json"
REPORT_NAME = "build_report.json"

Progress = Callable[[str], None]


def _resolve_limits(build: BuildConfig, cfg) -> BuildConfig:
    limit, what = max_exact_positions(cfg.rope_parameters, cfg.max_position_embeddings)
    if build.max_seq_len is None:
        build = replace(build, max_seq_len=min(limit, 4096))
    if build.max_seq_len > limit:
        raise InvalidOptionError(
            f"--max-seq-len {build.max_seq_len} exceeds {what}; use --max-seq-len {limit} or less")
    return build


def is_engine_dir(path: Path) -> bool:
    """Whether `path` holds an engine Bessemer wrote: its config.json names the engine format
    (a HF checkpoint's, or any other config.json, does not). Only such a directory may be
    replaced by a build."""
    try:
        config = json.loads((path / CONFIG_NAME).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and "bessemer_format" in config and "ranks" in config


def _check_output(model_dir: Path, output: Path) -> None:
    """The output may be a new path, an empty directory or an engine; never the checkpoint,
    a directory inside it or one that contains it."""
    src, out = model_dir.resolve(), output.resolve()
    where = ("the checkpoint" if out == src else "inside the checkpoint" if src in out.parents
             else "a directory containing the checkpoint" if out in src.parents else None)
    if where:
        raise BessemerError(f"--output {output} is {where} {model_dir}; the build never writes into or over "
                            "its source: choose another --output")
    if output.exists():
        if not output.is_dir():
            raise BessemerError(f"output {output} exists and is not a directory; choose another --output")
        if any(output.iterdir()) and not is_engine_dir(output):
            raise BessemerError(f"output {output} is a non-empty directory that is not a Bessemer engine (it would be "
                                "replaced); choose a new or empty --output")


def _remove_stale_temps(output: Path) -> None:
    """Temp dirs of earlier builds of `output` whose process is gone (killed builds)."""
    for d in output.parent.glob(f".{output.name}.tmp-*-*"):
        pid = d.name[len(f".{output.name}.tmp-"):].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            shutil.rmtree(d, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _prepare_output(output: Path) -> Path:
    """A fresh temp dir beside the output (named with this process id, so that a later build
    can remove it if this one is killed)."""
    output.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(output)
    tmp = Path(tempfile.mkdtemp(prefix=f".{output.name}.tmp-{os.getpid()}-", dir=output.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes 0700; the engine dir is ordinary
    return tmp


def _commit_output(tmp: Path, output: Path) -> None:
    """Swap the finished build into place; an older engine there is removed only afterwards."""
    old = None
    if output.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{output.name}.old-", dir=output.parent))
        os.replace(output, old / "engine")
    os.replace(tmp, output)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _rank_graph(family, cfg, ckpt: Checkpoint, build: BuildConfig, model_dir: Path, dump_ir, target):
    try:
        graph = family.build_graph(cfg, ckpt.shapes())
    except (KeyError, GraphError) as e:
        missing = e.args[0] if isinstance(e, KeyError) else str(e)
        raise BessemerError(f"checkpoint {model_dir} does not match its config ({missing}); "
                            "re-export it with save_pretrained") from None
    if dump_ir and build.tp_size > 1:
        dump_ir = Path(dump_ir) / f"rank{build.tp_rank}"
    graph, applied = run_passes(graph, build, Path(dump_ir) if dump_ir else None)
    attn = next((n for n in graph.nodes if n.op in ("attention", "attention_sinks")), None)
    kv_heads = int(attn.attrs["num_kv_heads"]) if attn else cfg.num_key_value_heads  # per rank
    kv = kv_cache_section(cfg.num_hidden_layers, kv_heads, cfg.head_dim, build.resolved_kv_dtype)
    return graph, applied, target.lower(graph, build, kv)


def _time_left(elapsed: float, done: int, total: int) -> str:
    """', about 40s left' at the rate of bytes written so far (a rough guide: an int8 table
    costs less per byte than 4-bit codes), or '' at the end and in the first second."""
    if done <= 0 or done >= total or elapsed < 1.0:
        return ""
    return f", about {elapsed * (total - done) / done:.0f}s left"


def _calibrate(ckpt, graph, quant, say, kernel_smoothed: frozenset = frozenset()):
    """The calibration step on the model's unpassed graph: its linears' input groups and moe layers."""
    groups = input_groups(graph)
    return calibrate(ckpt, groups, quant, say, kernel_smoothed, moe_layers(graph, groups))


def _write_rank(model_dir: Path, build: BuildConfig, tmp: Path, calibration, say: Progress, target,
                rank_graph: tuple) -> dict:
    """Writes rank{build.tp_rank}.engine into tmp from its lowered graph (rank_graph: what
    _rank_graph returned for it); returns what config.json and the build report need about it.
    Opens its own checkpoint (it may run in a forked child)."""
    t = time.perf_counter()
    rank = build.tp_rank
    ckpt = Checkpoint(model_dir)
    graph, applied, lowered = rank_graph
    specs = lowered.tensors
    done = [0, 0]
    prefix = f"rank {rank}: " if build.tp_size > 1 else ""

    def on_tensor(name: str, nbytes: int) -> None:
        done[0] += nbytes
        done[1] += 1
        if done[1] % 20 == 0 or done[0] == total:
            say(f"{prefix}packing weights: {done[1]}/{len(entries)} tensors, {done[0] / 2**20:.0f}/{total / 2**20:.0f} MiB"
                + _time_left(time.perf_counter() - t_pack, done[0], total))

    header = {"rank": rank, "tp_size": build.tp_size, "target": build.target,
              **target.header_fields(build), "plan": lowered.plan}
    source = WeightSource(ckpt, graph.constants, calibration, threads=quantize_threads(build, calibration))
    source.write_order(specs)
    entries = [container.TensorEntry(s.name, s.dtype, s.layout, s.shape, source.producer(s)) for s in specs]
    kernels = target.kernel_section(lowered, build, say)  # compiled kernels, stored after the weights
    if kernels is not None:
        header.update(kernels.header)
        entries += kernels.entries
    total = sum(e.nbytes for e in entries)
    rank_file = tmp / f"rank{rank}.engine"
    t_pack = time.perf_counter()
    try:
        digest = container.write_rank_file(rank_file, header, entries, on_tensor)
    finally:
        source.close()
    ckpt.close()
    return {"file": rank_file.name, "size": rank_file.stat().st_size, "sha256": digest,
            "kernels": list(lowered.kernels), "applied": applied, "quant_error": source.quant_stats,
            "seconds": round(time.perf_counter() - t, 3), "compiled_kernels": kernels.report if kernels else None,
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "tensors": [{"name": s.name, "dtype": s.dtype, "layout": s.layout, "shape": list(s.shape)}
                        for s in specs]}


def quantize_threads(build: BuildConfig, calibration) -> int:
    """Threads that quantize weights ahead of the writer: the native helpers' whole thread
    budget (quantization/native_threads.py: the cores this process may use, or fewer when
    OMP_NUM_THREADS says so) when it builds the only rank of an uncalibrated build; each
    weight in flight then runs its helpers on its share. Calibrated quantizers (GPTQ, AWQ)
    run torch's own thread pools and read shared calibration state: one weight at a time."""
    if calibration is not None or build.tp_size > 1:
        return 1
    return thread_budget()


def _write_ranks(model_dir: Path, build: BuildConfig, tmp: Path, calibration, say: Progress,
                 workers: int, target, rank_graphs: list[tuple]) -> list[dict]:
    builds = [replace(build, tp_rank=r) for r in range(build.tp_size)]
    if calibration is not None and workers > 1:
        # calibration ran torch's thread pools in this process; a forked child that uses
        # torch (GPTQ) can deadlock on a lock held by a thread it does not have
        say("calibrated build: ranks are quantized one after another (--workers applies to "
            "uncalibrated builds)")
        workers = 1
    if workers <= 1 or build.tp_size == 1:
        return [_write_rank(model_dir, b, tmp, calibration, say, target, rank_graphs[b.tp_rank]) for b in builds]
    from bessemer.builder.parallel_build import run_forked

    # forked children inherit the calibration result (Hessians, AWQ scales) without a copy
    return run_forked([lambda b=b: _write_rank(model_dir, b, tmp, calibration, say, target, rank_graphs[b.tp_rank])
                       for b in builds], workers)


def build_engine(model_dir: str | os.PathLike, output_dir: str | os.PathLike,
                 build: BuildConfig | None = None, dump_ir: str | os.PathLike | None = None,
                 progress: Progress | None = None, workers: int = 1) -> Path:
    """Builds an engine directory from a HF checkpoint directory; returns its path.
    `workers` > 1 builds tensor-parallel ranks in that many processes at once."""
    say = progress or (lambda msg: None)
    build = build or BuildConfig()
    if not isinstance(workers, int) or workers <= 0:
        raise InvalidOptionError(f"--workers must be a positive integer, got {workers!r}")
    model_dir, output = Path(model_dir), Path(output_dir)
    _check_output(model_dir, output)  # before any work: a wrong --output fails in a second
    timings: dict[str, float] = {}
    t0 = time.perf_counter()

    say(f"loading {model_dir}")
    ckpt = Checkpoint(model_dir)
    family = family_for(ckpt.config)
    cfg = family.config_from_hf(ckpt.config)
    build = _resolve_limits(build, cfg)
    timings["load"] = time.perf_counter() - t0

    # a bits-per-weight budget: the precision plan is measured first (it needs the
    # calibration statistics), so that the passes follow it
    calibration, precision = None, None
    if build.quant is not None and build.quant.bits_per_weight is not None and not build.quant.precision:
        t = time.perf_counter()
        calibration = _calibrate(ckpt, family.build_graph(cfg, ckpt.shapes()), build.quant, say)
        build, precision = plan_precision(family.build_graph(cfg, ckpt.shapes()), build, ckpt, calibration, say)
        timings["mixed_precision"] = time.perf_counter() - t

    # Every rank's graph is checked (and dumped) before any calibration or packing starts,
    # so a bad --tp fails in a second with nothing written.
    # Each rank's graph is built, passed and lowered once, here; the writers (maybe forked
    # children) take it from rank_graphs. The target is resolved once for the whole build.
    t = time.perf_counter()
    target = get_target(build.target)
    rank_graphs = []
    for r in range(build.tp_size):
        rank_graphs.append(_rank_graph(family, cfg, ckpt, replace(build, tp_rank=r), model_dir, dump_ir, target))
        graph, applied, lowered = rank_graphs[-1]
        if r == 0:
            say(f"graph: {len(graph.nodes)} nodes after {', '.join(applied) or 'no passes'}; "
                f"plan: {lowered.summary}"
                + (f" (rank 0 of {build.tp_size})" if build.tp_size > 1 else ""))
            for note in expert_notes(graph, build):
                say(note)
    timings["graph_and_passes"] = time.perf_counter() - t

    if build.quant is not None and build.quant.needs_calibration and calibration is None:
        t = time.perf_counter()
        # inputs without a fold are smoothed only where the quantize pass gave the kernel a 1/s
        # (not, e.g., an excluded o_proj, which runs in floating point)
        kernel_smoothed = frozenset(s.parts[0] for s in lowered.tensors if s.role == "smooth")
        calibration = _calibrate(ckpt, family.build_graph(cfg, ckpt.shapes()), build.quant, say, kernel_smoothed)
        timings["calibration"] = time.perf_counter() - t
        if build.quant.algorithm == "smoothquant":  # record the backend that ran, not "auto"
            build = replace(build, quant=replace(build.quant, calib_backend=calibration.backend))
    ckpt.close()

    tmp = _prepare_output(output)
    try:
        t = time.perf_counter()
        ranks = _write_ranks(model_dir, build, tmp, calibration, say, workers, target, rank_graphs)
        timings["pack_and_write"] = time.perf_counter() - t

        copied = [name for name in TOKENIZER_FILES if (model_dir / name).exists()]
        for name in copied:
            shutil.copyfile(model_dir / name, tmp / name)
        n = build.tp_size
        config = {
            "bessemer_format": {"major": container.FORMAT_MAJOR, "minor": container.FORMAT_MINOR},
            "bessemer_version": bessemer.__version__,
            "target": build.target, **target.header_fields(build),
            "model": cfg.to_json(), "build": build.to_json(),
            "quant": build.quant.to_json() if build.quant else None,
            "mapping": {"tp_size": n, "pp_size": 1, "world_size": n},
            "plugins": sorted({k for r in ranks for k in r["kernels"]}), "passes": ranks[0]["applied"],
            "ranks": [{"file": r["file"], "size": r["size"], "sha256": r["sha256"]} for r in ranks],
            "tokenizer_files": copied,
        }
        (tmp / CONFIG_NAME).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        timings["total"] = time.perf_counter() - t0
        quant_error = {(name if n == 1 else f"{name}[rank{i}]"): v
                       for i, r in enumerate(ranks) for name, v in r["quant_error"].items()}
        for line in expert_calibration_lines(quant_error):
            say(line)
        report = {"timings_s": {k: round(v, 3) for k, v in timings.items()},
                  "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                  "passes": ranks[0]["applied"], "num_tensors": len(ranks[0]["tensors"]),
                  "engine_bytes": sum(r["size"] for r in ranks),
                  "quant": build.quant.to_json() if build.quant else None,
                  "quant_error": quant_error,
                  "bits_per_weight": bits_per_weight(
                      [(t["name"], tuple(t["shape"]), packed_nbytes(tuple(t["shape"]), t["dtype"], t["layout"]))
                       for t in r["tensors"]] for r in ranks),
                  "calibration": calibration.report if calibration else None,
                  **({"mixed_precision": precision} if precision else {}),
                  "workers": min(workers, n),
                  **({"kernels": ranks[0]["compiled_kernels"]} if ranks[0]["compiled_kernels"] else {}),
                  "ranks": [{"rank": i, "file": r["file"], "bytes": r["size"], "seconds": r["seconds"],
                             "peak_rss_mib": r["peak_rss_mib"]} for i, r in enumerate(ranks)],
                  "tensors": ranks[0]["tensors"]}
        (tmp / REPORT_NAME).write_text(json.dumps(report, indent=2) + "\n")
        if build.quant:
            say(f"weights stored at {format_bits(report['bits_per_weight'])}")
        _commit_output(tmp, output)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    size = sum(r["size"] for r in ranks)
    say(f"engine written to {output} ({size / 2**20:.1f} MiB{f' in {n} rank files' if n > 1 else ''}) "
        f"in {timings['total']:.1f}s")
    return output
