"""Engine.load: open an engine directory, check it is one this runtime can run.

Refuses, with a message naming both sides, an engine of another format major, a target
this runtime does not have, or one this machine cannot run (the target says why: the cpu
target names the ISA features it lacks); a rank file whose size or sha256 differs from
config.json is reported as corrupt. The target's executor maps the rank file and checks
every kernel, tensor and bound itself (targets/<name>/).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bessemer.errors import EngineLoadError
from bessemer.format.container import FORMAT_MAJOR, read_rank_header, sha256_file
from bessemer.format.engine_config import read_engine_config
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
        return read_engine_config(engine_dir, target_names())

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
