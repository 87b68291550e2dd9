"""An engine directory's config.json: reading it and checking it before anything trusts it.

config.json is read before any checksum can vouch for it, so its values are checked here as
strictly as the rank header (a 0 limit made the scheduler spin; a rank "file" of "../x" or
"/dev/zero" was followed). Every reader of an engine directory (the runtime's Engine.load,
a target's own executor, inspect and verify) goes through read_engine_config.
"""

from __future__ import annotations

import json
from pathlib import Path

from bessemer.errors import EngineLoadError
from bessemer.format.container import FORMAT_MAJOR

BUILD_LIMITS = ("max_seq_len", "max_batch_size", "max_num_tokens", "kv_block_size")


def read_engine_config(engine_dir: str | Path, known_targets: tuple[str, ...]) -> dict:
    """config.json of `engine_dir`, checked: this format major, a target in `known_targets`
    (the caller's registry: the format itself knows no target), limits, mapping, rank files."""
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
    if fmt.get("major") != FORMAT_MAJOR:
        raise EngineLoadError(
            f"engine format {fmt.get('major')}.{fmt.get('minor')} (built by bessemer "
            f"{config.get('bessemer_version')}) is not supported by this runtime (format "
            f"{FORMAT_MAJOR}.x); rebuild the engine with this version's build-engine")
    if config.get("target") not in known_targets:
        raise EngineLoadError(
            f"engine target {config.get('target')!r} cannot run on this runtime (targets: "
            f"{', '.join(known_targets)}); rebuild with --target cpu")
    _check_config(config, path)
    return config


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
