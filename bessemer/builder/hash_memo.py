"""sha256 of a file, remembered by its stat so that an unchanged file is never re-read.

The engine cache keys a checkpoint by the content of its files, and it does so on every
`bessemer serve MODEL_DIR`: re-reading a 16 GB checkpoint each start would cost a minute.
A full content hash is kept (not the safetensors headers and sizes: a re-quantized or
fine-tuned checkpoint can keep both and change every weight), and memoized the way git's
index and ccache do: by (resolved path, size, mtime_ns, inode, device). A file rewritten in
place keeps none of those the same except in the racy case of a rewrite of equal size within
one mtime tick, which git accepts too. The first key of a checkpoint reads it once, about
what the build itself reads.

Each memo entry is one small file named by the stat key, written atomically, so processes
share the memo without a lock and a torn write is never read.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from bessemer.format.container import sha256_file


def _stat_key(path: Path) -> str:
    st = path.stat()
    ident = f"{path.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}\0{st.st_dev}"
    return hashlib.sha256(ident.encode()).hexdigest()


def memoized_sha256(memo_dir: Path):
    """A sha256_file(path) -> hex that remembers its answers under `memo_dir`."""
    memo_dir = Path(memo_dir)

    def sha256_of(path: Path) -> str:
        entry = memo_dir / _stat_key(path)
        try:
            known = entry.read_text().strip()
            if len(known) == 64:
                return known
        except OSError:
            pass
        value = sha256_file(path)
        memo_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=memo_dir)
        with os.fdopen(fd, "w") as f:
            f.write(value + "\n")
        os.replace(tmp, entry)
        return value

    return sha256_of
