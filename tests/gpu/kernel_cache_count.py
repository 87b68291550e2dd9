"""check.sh's line on the kernel cache: how many of the cubins a suite's engines need
(prebuild_kernels.py's prebuilt.json, written on CPU) are in the cache it was given. Only the
standard library: it runs before the install.

    python tests/gpu/kernel_cache_count.py CACHE_DIR bf16|quant
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def count_line(cache: Path, suite: str) -> str:
    cubins = {p.stem for p in cache.glob("*.cubin")}
    manifest = cache / "prebuilt.json"
    if not manifest.exists():
        return (f"check.sh: kernel cache {cache}: {len(cubins)} cubins and no prebuilt.json (run "
                "tests/gpu/prebuild_kernels.py on CPU first): every kernel not there compiles here")
    keys = json.loads(manifest.read_text()).get(suite, [])
    found = sum(k in cubins for k in keys)
    rest = "" if found == len(keys) else f"; the other {len(keys) - found} compile here (seconds each)"
    return f"check.sh: kernel cache {cache}: {found} of the {len(keys)} cubins the {suite} suite needs{rest}"


if __name__ == "__main__":
    print(count_line(Path(sys.argv[1]), sys.argv[2]))
