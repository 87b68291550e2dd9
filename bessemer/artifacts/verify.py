"""verify(OUT): re-check every published file against OUT/manifest.json.

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
        return [f"{out / MANIFEST_NAME} is missing; is {out} the --out of a ci-build run?"]
    problems = []
    for name, entry in sorted(manifest.get("engines", {}).items()):
        where = entry.get("dir")
        if where is None:  # the build itself failed: nothing was published
            continue
        expected = name if entry.get("status") in PASSING else f"{FAILED_DIR}/{name}"
        if where != expected:
            problems.append(f"{name}: status {entry.get('status')} but its directory is {where}, not {expected}")
        problems += [f"{name}: {p}" for p in mismatches(out / where, entry.get("files", {}))]
    return problems
