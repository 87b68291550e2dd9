"""OUT/manifest.json: what a ci-build run published, and the proof of each file's bytes.

    {"manifest_version": 1, "bessemer_version": "...", "spec": "engines.yaml", "ok": true,
     "engines": {"<name>": {
        "status": "pass" | "fail" | "skipped",   # skipped: inputs and gates unchanged since a
                                                 # passing run, engine reused as is (counts as pass)
        "dir": "<name>" | "_failed/<name>",      # relative to OUT; failed engines are quarantined
        "files": {"rank0.engine": {"sha256": "...", "size": N}, ...},   # every file of the dir
        "source": "smollm2", "source_checkpoint_sha256": "...",
        "inputs": {...inputs_hash.engine_inputs...}, "inputs_hash": "...",
        "gates": {...}, "gates_hash": "...", "builder_version": "...",
        "options": {"build": {...}, "quant": {...} | null},
        "build_time_s": s, "peak_rss_mib": MiB,     # from the build's build_report.json
        "validation": {"perplexity": {..., "passed": bool}, "greedy": {...}},
        "error": "..."}}}                           # only when the build or a gate raised

The manifest holds no timestamps or absolute paths, so two runs on the same inputs give the
same file records. It is replaced atomically (temp file + rename) after every engine.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from bessemer.format.container import sha256_file
from bessemer.errors import BessemerError

MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 1
FAILED_DIR = "_failed"  # failing engines go to OUT/_failed/<name>: never beside passing ones
PASSING = ("pass", "skipped")


def file_records(engine_dir: Path) -> dict[str, dict]:
    files = sorted(p for p in Path(engine_dir).rglob("*") if p.is_file())
    return {p.relative_to(engine_dir).as_posix(): {"sha256": sha256_file(p), "size": p.stat().st_size}
            for p in files}


def mismatches(engine_dir: Path, records: dict[str, dict]) -> list[str]:
    """Every way `engine_dir` differs from its records: missing, resized, changed or extra files."""
    engine_dir = Path(engine_dir)
    if not engine_dir.is_dir():
        return [f"{engine_dir} is missing"]
    problems = []
    for name, rec in sorted(records.items()):
        path = engine_dir / name
        if not path.is_file():
            problems.append(f"{name} is missing")
        elif path.stat().st_size != rec["size"]:
            problems.append(f"{name} has {path.stat().st_size} bytes, manifest says {rec['size']}")
        elif sha256_file(path) != rec["sha256"]:
            problems.append(f"{name} sha256 differs from the manifest (modified or corrupt)")
    extra = sorted(p.relative_to(engine_dir).as_posix() for p in engine_dir.rglob("*") if p.is_file())
    problems += [f"{name} is not in the manifest" for name in extra if name not in records]
    return problems


def read_manifest(out: Path) -> dict | None:
    path = Path(out) / MANIFEST_NAME
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise BessemerError(f"{path} is not valid JSON; delete it (the next ci-build rebuilds everything)") from None
    if not isinstance(data, dict) or data.get("manifest_version") != MANIFEST_VERSION:
        raise BessemerError(f"{path} has manifest_version {data.get('manifest_version') if isinstance(data, dict) else None!r}, "
                            f"this bessemer reads {MANIFEST_VERSION}; delete it or use another --out")
    return data


def write_manifest(out: Path, manifest: dict) -> Path:
    out = Path(out)
    fd, tmp = tempfile.mkstemp(prefix=f".{MANIFEST_NAME}.", dir=out)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; the manifest is published with the engines
        os.replace(tmp, out / MANIFEST_NAME)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out / MANIFEST_NAME
