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

import numpy as np

import bessemer
from bessemer.builder import engine_format as fmt
from bessemer.builder.checkpoint import Checkpoint
from bessemer.builder.config import BuildConfig
from bessemer.builder.graph import GraphError
from bessemer.builder.lower import TensorSpec, lower
from bessemer.builder.pipeline import run_passes
from bessemer.builder.quantize_weights import CalibrationResult, calibrate, quantize_weight
from bessemer.quantization.awq import apply_transform
from bessemer.errors import BessemerError, InvalidOptionError
from bessemer.models.registry import family_for

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "chat_template.jinja", "chat_template.json", "generation_config.json",
                   "tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json")
CONFIG_NAME = "config.json"
REPORT_NAME = "build_report.json"

Progress = Callable[[str], None]


def _resolve_limits(build: BuildConfig, max_positions: int) -> BuildConfig:
    if build.max_seq_len is None:
        build = replace(build, max_seq_len=min(max_positions, 4096))
    if build.max_seq_len > max_positions:
        raise InvalidOptionError(
            f"--max-seq-len {build.max_seq_len} exceeds the model's max_position_embeddings "
            f"{max_positions}; use --max-seq-len {max_positions} or less")
    return build


class WeightSource:
    """Produces each engine tensor from the checkpoint when the writer asks for it.

    A quantized weight is quantized once, when its first part (the codes) is asked for;
    its scales/offsets follow it in the tensor order, then the cache is dropped.
    """

    def __init__(self, ckpt: Checkpoint, constants: dict, calibration: CalibrationResult | None = None):
        self.ckpt, self.constants = ckpt, constants
        self.calibration = calibration
        self.quant_stats: dict[str, dict] = {}
        self._cached: tuple[str, dict] | None = None

    def part(self, name: str) -> np.ndarray:
        """A checkpoint tensor, with the AWQ scaling folded in where there is one."""
        arr = self.ckpt.get(name)
        if self.calibration and name in self.calibration.transforms:
            arr = apply_transform(arr, self.calibration.transforms[name])
        return arr

    def fp32(self, spec: TensorSpec) -> np.ndarray:
        if spec.name in self.constants:
            return self.constants[spec.name]
        arrays = [self.part(p) for p in spec.parts]
        return arrays[0] if len(arrays) == 1 else np.concatenate(arrays, axis=0)

    def producer(self, spec: TensorSpec) -> Callable[[], np.ndarray]:
        def produce() -> np.ndarray:
            if not spec.quant:
                return fmt.encode(self.fp32(spec), spec.dtype, spec.layout)
            if self._cached is None or self._cached[0] != spec.source:
                # GPTQ chooses 4-bit codes only (an int8 lm_head is round to nearest)
                four_bit = dict(spec.quant)["bits"] == 4
                hessian = self.calibration.hessian_for(spec) if self.calibration and four_bit else None
                act_order = bool(self.calibration and self.calibration.act_order)
                parts, stats = quantize_weight(self.fp32(spec), spec.quant, hessian, act_order)
                self.quant_stats[spec.source] = stats
                self._cached = (spec.source, parts)
            return self._cached[1][spec.role]
        return produce


def _prepare_output(output: Path) -> Path:
    """A fresh temp dir beside the output; the output may only replace an engine or empty dir."""
    if output.exists():
        if not output.is_dir():
            raise BessemerError(f"output {output} exists and is not a directory; choose another --output")
        if any(output.iterdir()) and not (output / CONFIG_NAME).exists():
            raise BessemerError(f"output {output} is a non-empty directory that is not an engine; choose another --output")
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{output.name}.tmp-", dir=output.parent))
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


def build_engine(model_dir: str | os.PathLike, output_dir: str | os.PathLike,
                 build: BuildConfig | None = None, dump_ir: str | os.PathLike | None = None,
                 progress: Progress | None = None) -> Path:
    """Builds an engine directory from a HF checkpoint directory; returns its path."""
    say = progress or (lambda msg: None)
    build = build or BuildConfig()
    model_dir, output = Path(model_dir), Path(output_dir)
    timings: dict[str, float] = {}
    t0 = time.perf_counter()

    say(f"loading {model_dir}")
    ckpt = Checkpoint(model_dir)
    family = family_for(ckpt.config)
    cfg = family.config_from_hf(ckpt.config)
    build = _resolve_limits(build, cfg.max_position_embeddings)
    timings["load"] = time.perf_counter() - t0

    t = time.perf_counter()
    try:
        graph = family.build_graph(cfg, ckpt.shapes())
    except (KeyError, GraphError) as e:
        missing = e.args[0] if isinstance(e, KeyError) else str(e)
        raise BessemerError(f"checkpoint {model_dir} does not match its config ({missing}); "
                            "re-export it with save_pretrained") from None
    graph, applied = run_passes(graph, build, Path(dump_ir) if dump_ir else None)
    kv = dict(num_layers=cfg.num_hidden_layers, num_kv_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim)
    plan, specs = lower(graph, build, kv)
    timings["graph_and_passes"] = time.perf_counter() - t
    say(f"graph: {len(graph.nodes)} nodes after {', '.join(applied) or 'no passes'}; "
        f"plan: {len(plan.steps)} kernel calls, {len(plan.buffers)} buffers")

    calibration = None
    if build.quant is not None and build.quant.needs_calibration:
        t = time.perf_counter()
        calibration = calibrate(ckpt, cfg, build.quant, say)
        timings["calibration"] = time.perf_counter() - t

    tmp = _prepare_output(output)
    try:
        t = time.perf_counter()
        total = sum(fmt.packed_nbytes(s.shape, s.dtype, s.layout) for s in specs)
        done = [0, 0]

        def on_tensor(name: str, nbytes: int) -> None:
            done[0] += nbytes
            done[1] += 1
            if done[1] % 20 == 0 or done[0] == total:
                say(f"packing weights: {done[1]}/{len(specs)} tensors, {done[0] / 2**20:.0f}/{total / 2**20:.0f} MiB")

        header = {"rank": 0, "tp_size": 1, "target": build.target, "isa_baseline": "avx2",
                  "plan": plan.to_json()}
        source = WeightSource(ckpt, graph.constants, calibration)
        entries = [fmt.TensorEntry(s.name, s.dtype, s.layout, s.shape, source.producer(s)) for s in specs]
        rank_file = tmp / "rank0.engine"
        digest = fmt.write_rank_file(rank_file, header, entries, on_tensor)
        timings["pack_and_write"] = time.perf_counter() - t
        ckpt.close()

        copied = [name for name in TOKENIZER_FILES if (model_dir / name).exists()]
        for name in copied:
            shutil.copyfile(model_dir / name, tmp / name)
        config = {
            "bessemer_format": {"major": fmt.FORMAT_MAJOR, "minor": fmt.FORMAT_MINOR},
            "bessemer_version": bessemer.__version__,
            "target": build.target, "isa_baseline": "avx2",
            "model": cfg.to_json(), "build": build.to_json(),
            "quant": build.quant.to_json() if build.quant else None,
            "mapping": {"tp_size": 1, "pp_size": 1, "world_size": 1},
            "plugins": plan.kernels(), "passes": applied,
            "ranks": [{"file": rank_file.name, "size": rank_file.stat().st_size, "sha256": digest}],
            "tokenizer_files": copied,
        }
        (tmp / CONFIG_NAME).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        timings["total"] = time.perf_counter() - t0
        report = {"timings_s": {k: round(v, 3) for k, v in timings.items()},
                  "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                  "passes": applied, "num_tensors": len(specs), "engine_bytes": rank_file.stat().st_size,
                  "quant": build.quant.to_json() if build.quant else None,
                  "quant_error": source.quant_stats,
                  "calibration": calibration.report if calibration else None,
                  "tensors": [{"name": s.name, "dtype": s.dtype, "layout": s.layout, "shape": list(s.shape)}
                              for s in specs]}
        (tmp / REPORT_NAME).write_text(json.dumps(report, indent=2) + "\n")
        _commit_output(tmp, output)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    say(f"engine written to {output} ({config['ranks'][0]['size'] / 2**20:.1f} MiB) in {timings['total']:.1f}s")
    return output
