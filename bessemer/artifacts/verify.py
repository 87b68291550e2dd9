"""verify(OUT): re-check every published file against OUT/manifest.json (or, for a single
engine directory, every rank file against its config.json).

Used after downloading CI artifacts, before deploying them: a problem list that is empty means
every file of every engine has the size and sha256 the build recorded, no file was added, and
each engine sits where its status says (passing in OUT/<name>, failing in OUT/_failed/<name>).
"""

from __future__ import annotations

import os
from pathlib import Path

from bessemer.artifacts.manifest import FAILED_DIR, MANIFEST_NAME, PASSING, mismatches, read_manifest


def verify(out: str | os.PathLike) -> list[str]:
    """Problems found, one line each, prefixed with the engine's name; [] when all is well."""
    out = Path(out)
    manifest = read_manifest(out)
    if manifest is None:
        if (out / "config.json").exists():  # a standalone engine: what the loader checks
            return verify_engine(out)
        return [f"{out / MANIFEST_NAME} is missing; is {out} the --out of a ci-build run (or an engine)?"]
    problems = []
    for name, entry in sorted(manifest.get("engines", {}).items()):
        where = entry.get("dir")
        if where is None:  # the build itself failed: nothing was published
            continue
        expected = name if entry.get("status") in PASSING else f"{FAILED_DIR}/{name}"
        if where != expected:
            problems.append(f"{name}: status {entry.get('status')} but its directory is {where}, not {expected}")
            continue  # never follow a path the manifest made up ("..", absolute)
        files = entry.get("files", {})
        outside = [f for f in files if not _inside(f)]
        if outside:
            problems.append(f"{name}: manifest names files outside the engine directory: {', '.join(outside[:3])}")
            continue
        problems += [f"{name}: {p}" for p in mismatches(out / where, files)]
    return problems


def _inside(relative: str) -> bool:
    path = Path(relative)
    return bool(relative) and not path.is_absolute() and ".." not in path.parts


def verify_engine(engine_dir: Path) -> list[str]:
    """A standalone engine: every rank file present, of its recorded size and sha256, with a
    header the loader accepts."""
    from bessemer.errors import BessemerError
    from bessemer.runtime.engine import Engine

    try:
        ranks = Engine.read_config(engine_dir)["ranks"]
        for rank in range(len(ranks)):
            Engine.load(engine_dir, rank=rank)
    except BessemerError as e:
        return [str(e)]
    return []
