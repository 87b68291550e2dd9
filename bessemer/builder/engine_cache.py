"""resolve_engine: an engine directory for whatever the user named (engine, checkpoint, hub id).

    engine dir       -> itself (build options are refused: it is built already)
    HF checkpoint    -> CACHE/engines/<key>, built on first use, reused afterwards
    org/name         -> the hub snapshot (builder/hub.py), then as a checkpoint

The key is the sha256 of artifacts/inputs_hash.engine_inputs: the checkpoint's file contents
(config, safetensors, tokenizer files; memoized by stat, builder/hash_memo.py), the build and
quant options, bessemer.__version__, the engine format and the builder's source (an editable
install keeps its version while the builder changes). It is the same record `bessemer
ci-build` keeps, so both agree on when an engine is stale. Paths and times are not in it: a
copied checkpoint reuses the engine.

Two processes resolving the same key build it once: the build runs under an flock on
`<key>.lock`, and the second finds the engine there when it gets the lock. build_engine
commits atomically, so an engine directory in the cache is always complete.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Callable

from bessemer.errors import InvalidOptionError

Say = Callable[[str], None]


def default_engine_cache() -> Path:
    """CACHE/engines, CACHE being BESSEMER_CACHE or ~/.cache/bessemer (bessemer/cache_root.py)."""
    from bessemer.cache_root import cache_root

    return cache_root() / "engines"


def engine_key(model_dir: Path, build, cache_dir: Path) -> str:
    from bessemer.artifacts.inputs_hash import builder_source_hash, checkpoint_hash, digest, engine_inputs
    from bessemer.builder.hash_memo import memoized_sha256

    ckpt = checkpoint_hash(model_dir, memoized_sha256(cache_dir / "hashes"))
    return digest(engine_inputs(ckpt, build, builder_source_hash()))[:32]


def is_checkpoint_dir(path: Path) -> bool:
    """Whether `path` holds a HF checkpoint: a config.json naming a model_type or
    architectures (an engine's, damaged or not, names neither at its top level)."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and "bessemer_format" not in config and \
        ("model_type" in config or "architectures" in config)


def resolve_engine(model_or_engine: str | os.PathLike, build_config=None, cache_dir: str | os.PathLike | None = None,
                   say: Say | None = None) -> Path:
    """The engine directory to load for `model_or_engine`, building it into `cache_dir`
    (default: default_engine_cache()) when it is a checkpoint. `build_config` (a
    BuildConfig; None: the defaults) applies to checkpoints only. Anything that is neither
    a checkpoint nor a hub id comes back as it is, for the engine loader's own errors
    (missing directory, damaged config) to name."""
    from bessemer.builder import hub
    from bessemer.builder.build import is_engine_dir

    say = say or (lambda msg: None)
    path = Path(model_or_engine).expanduser()
    if is_engine_dir(path):
        if build_config is not None:
            raise InvalidOptionError(f"{path} is an engine, built already; build options apply to a checkpoint "
                                     "only: drop them, or pass the checkpoint directory")
        return path
    if not path.exists() and hub.looks_like_hub_id(str(model_or_engine)):
        path = hub.download(str(model_or_engine), say)
    if not is_checkpoint_dir(path):
        return path
    return _cached_build(path, build_config, Path(cache_dir).expanduser() if cache_dir else default_engine_cache(), say)


def _cached_build(model_dir: Path, build, cache_dir: Path, say: Say) -> Path:
    from bessemer.builder.build import build_engine, is_engine_dir
    from bessemer.builder.config import BuildConfig

    build = build or BuildConfig()
    say(f"engine cache: hashing {model_dir}")
    key = engine_key(model_dir, build, cache_dir)
    engine = cache_dir / key
    if is_engine_dir(engine):  # the common case: no lock needed to read a committed engine
        say(f"engine cache: reusing {engine}")
        return engine
    cache_dir.mkdir(parents=True, exist_ok=True)
    with open(cache_dir / f"{key}.lock", "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"engine cache: another process is building {engine}; waiting for it")
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process dies
        if is_engine_dir(engine):  # another process built it while we waited
            say(f"engine cache: reusing {engine} (built by another process)")
            return engine
        say(f"engine cache: building {model_dir} into {engine} (once; later starts reuse it)")
        return build_engine(model_dir, engine, build, progress=say)
