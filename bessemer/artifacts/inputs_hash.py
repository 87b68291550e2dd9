"""The hash of everything that determines an engine's bytes, and of what its gates check.

An engine is rebuilt unless all of these are unchanged since the run that built it:
  - the content of the checkpoint files the builder reads (config.json, *.safetensors and
    the tokenizer files it copies), not their paths or times;
  - the build and quant options (and the content of the calibration text, if any);
  - `bessemer.__version__` and the engine format version;
  - the builder's own source (builder/, format/, models/, quantization/, plugins/, targets/): during development
    the version string does not move, and an engine built by older code must not be reused.
Gates are hashed apart (gates_hash), so that changing a threshold revalidates without a rebuild.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Callable

import bessemer
from bessemer.format import container as fmt
from bessemer.builder.build import TOKENIZER_FILES
from bessemer.builder.config import BuildConfig
from bessemer.datasets import text_path

BUILDER_PACKAGES = ("builder", "format", "models", "quantization", "plugins", "targets")
SOURCE_SUFFIXES = (".py", ".cpp", ".h")


def digest(obj) -> str:
    """sha256 of canonical JSON: key order and whitespace never change the hash."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _files_digest(root: Path, paths: list[Path], sha256_file: Callable[[Path], str] = fmt.sha256_file) -> str:
    lines = [f"{p.relative_to(root).as_posix()}\0{sha256_file(p)}" for p in sorted(paths)]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def checkpoint_hash(model_dir: Path, sha256_file: Callable[[Path], str] = fmt.sha256_file) -> str:
    """Content hash of the checkpoint files that build_engine reads or copies. `sha256_file`
    may be a memoized one (builder/hash_memo.py: the engine cache re-keys a checkpoint on
    every start and must not re-read gigabytes each time)."""
    model_dir = Path(model_dir)
    names = {"config.json", *TOKENIZER_FILES}
    paths = [p for p in model_dir.iterdir() if p.is_file() and (p.name in names or p.suffix == ".safetensors")]
    return _files_digest(model_dir, paths, sha256_file)


def builder_source_hash() -> str:
    root = Path(bessemer.__file__).parent
    paths = [p for pkg in BUILDER_PACKAGES for p in (root / pkg).rglob("*")
             if p.suffix in SOURCE_SUFFIXES and p.is_file() and "__pycache__" not in p.parts]
    return _files_digest(root, paths + [root / "__init__.py"])


def engine_inputs(checkpoint_sha256: str, build: BuildConfig, builder_sha256: str) -> dict:
    """Everything the engine's bytes depend on, as recorded in the manifest."""
    quant = build.quant
    return {
        "checkpoint_sha256": checkpoint_sha256,
        "build": build.to_json(),
        "quant": quant.to_json() if quant else None,
        # quant.to_json keeps only the calibration file's name; its content is what matters
        "calib_data_sha256": fmt.sha256_file(text_path(quant.calib_data)) if quant and quant.calib_data else None,
        "bessemer_version": bessemer.__version__,
        "engine_format": {"major": fmt.FORMAT_MAJOR, "minor": fmt.FORMAT_MINOR},
        "builder_source_sha256": builder_sha256,
    }


def gates_record(spec) -> dict:
    """The gates of an EngineSpec as JSON (dataset by name and content hash, not by path)."""
    out = {}
    if spec.perplexity:
        g = spec.perplexity
        out["perplexity"] = {"dataset": g.dataset.name, "dataset_sha256": fmt.sha256_file(g.dataset),
                             "context_len": g.context_len, "max_tokens": g.max_tokens,
                             "max_increase_pct": g.max_increase_pct}
    if spec.greedy:
        g = spec.greedy
        out["greedy"] = {"prompts": [p if isinstance(p, str) else list(p) for p in g.prompts],
                         "max_new_tokens": g.max_new_tokens, "min_agreement": g.min_agreement}
    return out
