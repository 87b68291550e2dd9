"""Engine.load: open an engine directory, check it is one this runtime can run, mmap it.

Refuses, with a message naming both sides, an engine of another format major, another
target, an ISA this CPU lacks, or kernels this runtime does not have; a rank file whose
size or sha256 differs from config.json is reported as corrupt.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from bessemer.builder.engine_format import sha256_file
from bessemer.errors import EngineLoadError
from bessemer.quantization.kv_cache import kv_bytes_per_token

SUPPORTED_FORMAT_MAJOR = 1
SUPPORTED_TARGETS = ("cpu", "cuda")  # cuda: run by bessemer/targets/cuda/executor.py
ISA_FEATURES = {"avx2": ("avx2", "fma"), "avx512": ("avx512f", "avx512bw", "avx512vl")}


def _native():
    try:
        from bessemer import _C
    except ImportError as e:
        raise EngineLoadError(f"the Bessemer C++ runtime is not built ({e}); run `make install`") from None
    return _C


@dataclass
class Engine:
    """A loaded engine: its config.json and rank 0's mmap'd file and header."""

    dir: Path
    config: dict
    header: dict
    file: object  # _C.EngineFile

    @property
    def model(self) -> dict:
        return self.config["model"]

    @property
    def build(self) -> dict:
        return self.config["build"]

    @staticmethod
    def read_config(engine_dir: str | Path, any_target: bool = False) -> dict:
        """config.json, checked: format major, and (unless any_target, as for inspect) target."""
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
        fmt = config.get("bessemer_format") or {}
        if fmt.get("major") != SUPPORTED_FORMAT_MAJOR:
            raise EngineLoadError(
                f"engine format {fmt.get('major')}.{fmt.get('minor')} (built by bessemer "
                f"{config.get('bessemer_version')}) is not supported by this runtime (format "
                f"{SUPPORTED_FORMAT_MAJOR}.x); rebuild the engine with this version's build-engine")
        if not any_target and config.get("target") not in SUPPORTED_TARGETS:
            built_for = f" ({config['gpu_arch']})" if config.get("gpu_arch") else ""
            raise EngineLoadError(
                f"engine target {config.get('target')!r}{built_for} cannot run on this runtime (targets: "
                f"{', '.join(SUPPORTED_TARGETS)}); rebuild with --target cpu")
        return config

    @classmethod
    def load(cls, engine_dir: str | Path, rank: int = 0, verify_checksum: bool = True) -> "Engine":
        d = Path(engine_dir)
        config = cls.read_config(d)
        _C = _native()
        features = _C.cpu_features()
        needs = ISA_FEATURES.get(config.get("isa_baseline", "avx2"), ()) if config.get("target") == "cpu" else ()
        missing = [f for f in needs if not features.get(f)]
        if missing:
            raise EngineLoadError(f"engine needs CPU features {config['isa_baseline']} ({', '.join(missing)} missing "
                                  "on this CPU); run it on an x86-64 CPU with AVX2 and FMA")
        ranks = config.get("ranks") or []
        if rank >= len(ranks):
            raise EngineLoadError(f"engine has {len(ranks)} rank files, rank {rank} requested")
        entry = ranks[rank]
        path = d / entry["file"]
        if not path.exists():
            raise EngineLoadError(f"rank file {path} is missing; rebuild the engine")
        if path.stat().st_size != entry["size"]:
            raise EngineLoadError(f"rank file {path} is truncated or corrupt ({path.stat().st_size} bytes, "
                                  f"config.json says {entry['size']}); rebuild the engine")
        if verify_checksum and sha256_file(path) != entry["sha256"]:
            raise EngineLoadError(f"rank file {path} is corrupt (sha256 differs from config.json); rebuild the engine")
        try:
            file = _C.EngineFile(str(path))
        except ValueError as e:
            raise EngineLoadError(f"{e}; rebuild the engine") from None
        if file.format_major != SUPPORTED_FORMAT_MAJOR:
            raise EngineLoadError(f"rank file {path} has format {file.format_major}.{file.format_minor}, this "
                                  f"runtime reads {SUPPORTED_FORMAT_MAJOR}.x; rebuild the engine")
        try:
            header = json.loads(bytes(file.header))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise EngineLoadError(f"rank file {path} has a corrupt header; rebuild the engine") from None
        return cls(d, config, header, file)

    def create_executor(self, num_threads: int, num_kv_blocks: int, isa: str = "auto"):
        _C = _native()
        try:
            return _C.Executor(self.file, self.header["tensors"], self.header["plan"], num_threads,
                               int(self.build["kv_block_size"]), num_kv_blocks, isa)
        except ValueError as e:
            raise EngineLoadError(f"{e}") from None

    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes per token over all layers (K and V), per-(token, head) scales included."""
        kv = self.header["plan"]["kv_cache"]
        return kv_bytes_per_token(kv["num_layers"], kv["num_kv_heads"], kv["head_dim"], kv["dtype"])
