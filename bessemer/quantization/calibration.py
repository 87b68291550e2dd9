"""Calibration: activation statistics of every linear's input, a build step of its own.

The checkpoint runs (HF transformers, fp32, on the CPU) over windows of a calibration
text; forward hooks gather, per distinct linear input, what the algorithms need:

    hessian    sum of x^T x over all rows      (K, K)  GPTQ
    abs_mean   mean |x| per input channel      (K,)    AWQ scale search
    abs_max    max |x| per input channel       (K,)    SmoothQuant factors, FP8/INT8 activation scales
    sample     a fixed subset of rows          (R, K)  AWQ loss

    inputs     every row, in a file             (T, K)  per-expert GPTQ / AWQ of a MoE layer
                                                        (keep_rows): expert_calibration.py routes them

Linears that read the same value (q/k/v, gate/up) are one input group
(builder/input_groups.py): the input is recorded once, under the group's key, the name of
its first linear, which is the HF module the hook sits on. Results are cached by content hash (checkpoint tensors, text, samples, length, version),
so building another mode from the same data does not recompute them. Kept rows are written
as they come into one .npy per key beside the statistics and returned memory-mapped: a
48-layer MoE's inputs (T x H x 4 bytes a layer) never sit in RAM together.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from bessemer.errors import BessemerError

STATS_VERSION = 2  # 2: abs_max
SAMPLE_ROWS = 256


@dataclass(frozen=True)
class CalibrationSpec:
    data: Path
    num_samples: int = 64
    seq_len: int = 512

    def __post_init__(self):
        if self.num_samples <= 0 or self.seq_len < 2:
            raise BessemerError("--calib-samples must be positive and --calib-seq-len at least 2")


def cache_dir() -> Path:
    from bessemer.cache_root import cache_root

    return cache_root() / "calibration"


def _content_hash(model_dir: Path, spec: CalibrationSpec, tag: str = "") -> str:
    h = hashlib.sha256(f"v{STATS_VERSION}:{spec.num_samples}:{spec.seq_len}{tag}".encode())
    for f in sorted(model_dir.glob("*.safetensors")) + [model_dir / "config.json", spec.data]:
        with open(f, "rb") as fh:
            while block := fh.read(1 << 22):
                h.update(block)
    return h.hexdigest()[:32]


# checkpoint module paths that transformers 5 renamed at load: (old, new) path components
MODULE_RENAMES = ((".block_sparse_moe.", ".mlp."),)  # Mixtral's sparse block


def _module_paths(name: str) -> list[str]:
    """The HF module path of a checkpoint module path, as stored and as renamed."""
    return [name] + [name.replace(old, new) for old, new in MODULE_RENAMES if old in name]


def calibration_windows(model_dir: Path, spec: CalibrationSpec) -> list[list[int]]:
    from tokenizers import Tokenizer

    if not spec.data.is_file():
        raise BessemerError(f"calibration data {spec.data} does not exist; pass a plain-text file with --calib-data")
    tok_path = model_dir / "tokenizer.json"
    if not tok_path.exists():
        raise BessemerError(f"{tok_path} is missing; calibration needs the checkpoint's tokenizer")
    tok = Tokenizer.from_file(str(tok_path))
    need = spec.num_samples * spec.seq_len
    text = spec.data.read_text(encoding="utf-8", errors="replace")
    ids = tok.encode(text[: need * 8], add_special_tokens=False).ids
    wins = [ids[i:i + spec.seq_len] for i in range(0, len(ids) - spec.seq_len + 1, spec.seq_len)][: spec.num_samples]
    if not wins:
        raise BessemerError(f"calibration data {spec.data} has fewer than {spec.seq_len} tokens; use a longer file")
    return wins


def collect(model_dir: Path, spec: CalibrationSpec, inputs: Iterable[str],
            progress: Callable[[str], None] = lambda m: None, hessian: bool = True,
            keep_rows: Iterable[str] = ()) -> dict:
    """Returns {key: {"hessian", "abs_mean", "abs_max", "sample", "rows"}} (numpy), cached,
    for the input of each linear module named in `inputs` (the input groups' keys).
    hessian=False (SmoothQuant, FP8 scales) skips the (K, K) sums, a good part of the cost.
    keep_rows: keys (among `inputs`) whose every row is kept too, as "inputs" (T, K) fp32
    memory-mapped from the cache."""
    model_dir = Path(model_dir)
    keep_rows = sorted(set(keep_rows))
    path = cache_dir() / f"{_content_hash(model_dir, spec)}.npz"
    if not hessian and not path.exists():  # a full set of statistics serves too
        path = cache_dir() / f"{_content_hash(model_dir, spec, ':nohessian')}.npz"
    kept = {key: _rows_path(path, key) for key in keep_rows}
    if path.exists() and all(p.exists() for p in kept.values()):
        progress(f"calibration: cached statistics {path}")
        return _with_rows(_load(path), kept)
    from bessemer.builder.hf_loader import load_hf_model

    wins = calibration_windows(model_dir, spec)
    model = load_hf_model(model_dir, "calibrated quantization")
    import torch  # present: load_hf_model checked it
    stats: dict[str, dict] = {}
    rng = np.random.default_rng(0)
    take = max(1, SAMPLE_ROWS // len(wins))
    total_rows = sum(len(w) for w in wins)
    rows_out: dict[str, np.ndarray] = {}  # key -> (total_rows, K) .npy being written
    rows_done: dict[str, int] = {}

    def keep(name, x):
        if name not in rows_out:
            kept[name].parent.mkdir(parents=True, exist_ok=True)
            rows_out[name] = np.lib.format.open_memmap(_partial(kept[name]), mode="w+", dtype=np.float32,
                                                       shape=(total_rows, x.shape[1]))
            rows_done[name] = 0
        r0 = rows_done[name]
        rows_out[name][r0:r0 + x.shape[0]] = x.numpy()
        rows_done[name] = r0 + x.shape[0]

    def hook(name):
        def record(module, args, output):
            x = args[0].detach().reshape(-1, args[0].shape[-1]).to(torch.float32)  # (rows, K)
            if name in kept:
                keep(name, x)
            if name not in stats:
                stats[name] = {"hessian": torch.zeros(x.shape[1], x.shape[1], dtype=torch.float64) if hessian else None,
                               "abs_sum": torch.zeros(x.shape[1], dtype=torch.float64),
                               "abs_max": torch.zeros(x.shape[1], dtype=torch.float32),
                               "sample": [], "rows": 0}
            s = stats[name]
            # fp32 products summed in fp64: add_ widens each fp32 element exactly, in place
            # (a .double() copy of a (K, K) product is a fresh 18 MB at K = 1536, every call)
            if hessian:
                s["hessian"].add_(x.T @ x)
            s["abs_sum"].add_(x.abs().sum(0))
            s["abs_max"] = torch.maximum(s["abs_max"], x.abs().amax(0))
            s["rows"] += x.shape[0]
            rows = rng.choice(x.shape[0], size=min(take, x.shape[0]), replace=False)
            s["sample"].append(x[torch.from_numpy(np.sort(rows))].numpy())
        return record

    # the modules whose first input a recorded linear reads: nn.Linear, or a MoE router (its
    # own module class in transformers 5, a linear of its first input all the same), found by
    # their checkpoint path or the path transformers gives them now
    modules = dict(model.named_modules())
    handles, missing, hooked = [], [], []
    for name in sorted(set(inputs)):
        runtime = next((a for a in _module_paths(name) if a in modules), None)
        if runtime is None:
            missing.append(name)
        else:
            hooked.append(modules[runtime])
            handles.append(modules[runtime].register_forward_hook(hook(name)))
    if missing:
        for h in handles:
            h.remove()
        raise BessemerError(f"calibration: the checkpoint's HF model has no module {missing[0]}")
    run = _decoder_of(model, hooked)
    try:
        with torch.no_grad():
            for i, w in enumerate(wins):
                run(torch.tensor([w]))
                if (i + 1) % 8 == 0 or i + 1 == len(wins):
                    progress(f"calibration: {i + 1}/{len(wins)} samples of {spec.seq_len} tokens")
    finally:
        for h in handles:
            h.remove()
    result = {name: {**({"hessian": s["hessian"].float().numpy()} if hessian else {}), "abs_mean": (s["abs_sum"] / s["rows"]).float().numpy(),
                     "abs_max": s["abs_max"].numpy(),
                     "sample": np.concatenate(s["sample"])[:SAMPLE_ROWS], "rows": np.int64(s["rows"])}
              for name, s in stats.items()}
    for name, arr in rows_out.items():
        if rows_done[name] != total_rows:
            raise BessemerError(f"calibration: the input of {name} was seen on {rows_done[name]} rows of "
                                f"{total_rows}; a module called more or less than once per token cannot be kept")
        arr.flush()
        del arr
        os.replace(_partial(kept[name]), kept[name])
    rows_out.clear()
    _save(path, result)
    progress(f"calibration: statistics cached in {path}")
    return _with_rows(result, kept)


def _decoder_of(model, hooked: list):
    """What calibration runs: the model's decoder (the stack below lm_head) when every hooked
    module lies in it, else the whole model. The logits are never read, and lm_head is a fifth
    of a small model's multiply-adds (49152 x 576 of SmolLM2's 135M weights, 128256 x 2048 of
    Llama-3.2-1B's 1.2B); the decoder's hidden states are the same computation either way."""
    decoder = model.get_decoder()
    inside = {id(m) for m in decoder.modules()}
    return decoder if decoder is not model and all(id(m) in inside for m in hooked) else model


def _rows_path(stats_path: Path, key: str) -> Path:
    return stats_path.with_suffix("") / f"{key}.rows.npy"


def _partial(path: Path) -> Path:
    return path.with_suffix(".partial.npy")


def _with_rows(stats: dict, kept: dict[str, Path]) -> dict:
    for key, p in kept.items():
        stats[key]["inputs"] = np.load(p, mmap_mode="r")
    return stats


def _save(path: Path, stats: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    flat = {f"{name}::{field}": value for name, s in stats.items() for field, value in s.items()}
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, **flat)
    os.replace(tmp, path)


def _load(path: Path) -> dict:
    out: dict[str, dict] = {}
    with np.load(path) as data:
        for key in data.files:
            name, field = key.split("::")
            out.setdefault(name, {})[field] = data[key]
    return out


def describe(spec: CalibrationSpec | None) -> dict | None:
    if spec is None:
        return None
    return {"data": spec.data.name, "num_samples": spec.num_samples, "seq_len": spec.seq_len,
            "stats_version": STATS_VERSION}

