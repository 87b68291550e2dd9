"""Where Bessemer keeps what it can rebuild: the model fixture, calibration statistics, engines."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """BESSEMER_CACHE, else ~/.cache/bessemer (read on each call: tests point it elsewhere)."""
    return Path(os.environ.get("BESSEMER_CACHE") or Path.home() / ".cache" / "bessemer").expanduser()
