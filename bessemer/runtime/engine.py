"""Engine.load: open an engine directory, check it is one this runtime can run.

Refuses, with a message naming both sides, an engine of another format major, a target
this runtime does not have, or one this machine cannot run (the target says why: the cpu
target names the ISA features it lacks); a rank file whose size or sha256 differs from
config.json is reported as corrupt. The target's executor maps the rank file and checks
every kernel, tensor and bound itself (targets/<name>/).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from bessemer.errors import EngineLoadError
from bessemer.format.container import FORMAT_MAJOR, read_rank_header, sha256_file
from bessemer.targets import Target, get_target, target_names

SUPPORTED_FORMAT_MAJOR = FORMAT_MAJOR


@dataclass
class Engine:
    """A loaded engine: its config.json, one rank's file and that file's header."""

    dir: Path
    config: dict
    header: dict
    rank_path: Path
    target: Target
    data_offset: int = 0  # where the rank file's tensor data starts (tensor offsets count from it)
    file_format: tuple[int, int] = (0, 0)  # the rank file's format (major, minor)

    @property
    def model(self) -> dict:
        return self.config["model"]

    @property
    def build(self) -> dict:
        return self.config["build"]

    @staticmethod
    def read_config(engine_dir: str | Path) -> dict:
        d = Path(engine_dir)
        if not d.is_dir():
            raise EngineLoadError(f"engine directory {d} does not exist; build one with `build-engine MODEL_DIR --output {d}`")
        path = d / "config.json"
        if not path.exists():
            raise EngineLoadError(f"{path} is missing; {d} is not a Bessemer engine (rebuild it with build-engine)")
        try:
            config = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise EngineLoadError(f"{path} is not valid JSON; rebuild the engine with build-engine") from None
        if not isinstance(config, dict):  # `[]` parses: every check below reads it as an object
            raise _damaged(path, "not a JSON object")
        fmt = config.get("bessemer_format")
        fmt = fmt if isinstance(fmt, dict) else {}
        if fmt.get("major") != SUPPORTED_FORMAT_MAJOR:
            raise EngineLoadError(
                f"engine format {fmt.get('major')}.{fmt.get('minor')} (built by bessemer "
                f"{config.get('bessemer_version')}) is not supported by this runtime (format "
                f"{SUPPORTED_FORMAT_MAJOR}.x); rebuild the engine with this version's build-engine")
        if config.get("target") not in target_names():
            raise EngineLoadError(
                f"engine target {config.get('target')!r} cannot run on this runtime (targets: "
                f"{', '.join(target_names())}); rebuild with --target cpu")
        _check_config(config, path)
        return config

    @classmethod
    def load(cls, engine_dir: str | Path, rank: int = 0, verify_checksum: bool = True) -> "Engine":
        d = Path(engine_dir)
        config = cls.read_config(d)
        target = get_target(config["target"])
        target.check_runnable(config)
        ranks = config.get("ranks") or []
        if rank >= len(ranks):
            raise EngineLoadError(f"engine has {len(ranks)} rank files, rank {rank} requested")
        entry = ranks[rank]
        path = d / entry["file"]
        if not path.exists():
            raise EngineLoadError(f"rank file {path} is missing; rebuild the engine")
        if not path.is_file():  # a device (/dev/zero would be hashed forever), a directory, ...
            raise EngineLoadError(f"rank file {path} is not a regular file; rebuild the engine")
        if path.stat().st_size != entry["size"]:
            raise EngineLoadError(f"rank file {path} is truncated or corrupt ({path.stat().st_size} bytes, "
                                  f"config.json says {entry['size']}); rebuild the engine")
        if verify_checksum and sha256_file(path) != entry["sha256"]:
            raise EngineLoadError(f"rank file {path} is corrupt (sha256 differs from config.json); rebuild the engine")
        try:
            major, minor, header, data_offset = read_rank_header(path)
        except (ValueError, UnicodeDecodeError) as e:
            raise EngineLoadError(f"{e}; rebuild the engine") from None
        if major != SUPPORTED_FORMAT_MAJOR:
            raise EngineLoadError(f"rank file {path} has format {major}.{minor}, this "
                                  f"runtime reads {SUPPORTED_FORMAT_MAJOR}.x; rebuild the engine")
        if not isinstance(header, dict) or "plan" not in header:
            raise EngineLoadError(f"rank file {path} has a corrupt header; rebuild the engine")
        return cls(d, config, header, path, target, data_offset, (major, minor))

    def create_executor(self, num_threads: int, num_kv_blocks: int, isa: str = "auto"):
        return self.target.create_executor(self, num_threads, num_kv_blocks, isa)

    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes per token over all layers (K and V), per-(token, head) scales included."""
        return self.target.kv_bytes_per_token(self.header)

    def kv_pool_blocks(self, kv_cache_gib: float | None) -> int:
        """KV blocks for a host-memory budget of `kv_cache_gib` (runtime/kv_cache.pool_size:
        a full batch of full-length sequences, capped by the budget, at least one sequence)."""
        from bessemer.runtime.kv_cache import pool_size

        b = self.build
        return pool_size(self.kv_bytes_per_token(), int(b["kv_block_size"]), int(b["max_seq_len"]),
                         int(b["max_batch_size"]), kv_cache_gib)


# config.json is read before any checksum can vouch for it: its values are checked here as
# strictly as the rank header (a 0 limit made the scheduler spin; a rank "file" of
# "../x" or "/dev/zero" was followed)
BUILD_LIMITS = ("max_seq_len", "max_batch_size", "max_num_tokens", "kv_block_size")


def _damaged(path: Path, what: str) -> EngineLoadError:
    return EngineLoadError(f"{path}: {what}; the engine's config.json is damaged, rebuild the engine")


def _positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _check_config(config: dict, path: Path) -> None:
    def bad(what: str) -> EngineLoadError:
        return _damaged(path, what)

    build = config.get("build")
    if not isinstance(build, dict):
        raise bad("no build section")
    for name in BUILD_LIMITS:
        value = build.get(name)
        if not _positive_int(value) or value > 1 << 24:
            raise bad(f"build.{name} is {value!r}, not a positive integer")
    # the sections the runtime and inspect read as objects (a null one was an AttributeError)
    for name in ("model", "mapping"):
        if not isinstance(config.get(name), dict):
            raise bad(f"{name} is {_as_json(config.get(name))}, not an object")
    if not (config.get("quant") is None or isinstance(config["quant"], dict)):
        raise bad(f"quant is {_as_json(config['quant'])}, not an object or null")
    ranks = config.get("ranks")
    if not isinstance(ranks, list) or not ranks:
        raise bad("no rank files listed")
    for i, entry in enumerate(ranks):
        if not isinstance(entry, dict):
            raise bad(f"ranks[{i}] is not an object")
        name, size, digest = entry.get("file"), entry.get("size"), entry.get("sha256")
        if not isinstance(name, str) or not name or name != Path(name).name or name.startswith("."):
            raise bad(f"ranks[{i}].file {name!r} is not a plain file name in the engine directory")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise bad(f"ranks[{i}].size {size!r} is not a byte count")
        if not isinstance(digest, str) or len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise bad(f"ranks[{i}].sha256 is not a sha256 hex digest")
    _check_mapping(config["mapping"], len(ranks), bad)


def _check_mapping(mapping: dict, num_ranks: int, bad) -> None:
    """tp_size picks the executor (one rank or a TP group of that many rank files)."""
    for name in ("tp_size", "pp_size"):
        if not _positive_int(mapping.get(name)):
            raise bad(f"mapping.{name} is {_as_json(mapping.get(name))}, not a positive integer")
    if mapping["tp_size"] != num_ranks:
        raise bad(f"mapping.tp_size is {mapping['tp_size']} but ranks lists {num_ranks} file(s)")


def _as_json(value) -> str:
    """`value` as config.json spells it (null, "1"), cut to 40 characters."""
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."
