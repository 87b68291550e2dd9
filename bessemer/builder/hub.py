"""A HuggingFace hub id (org/name) as a local checkpoint directory, through huggingface_hub.

Only the files build_engine reads are fetched (configs, safetensors, tokenizer files). A
snapshot already in the HF cache is used without the network (huggingface_hub falls back to
it); otherwise the machine must reach the hub, and a machine that cannot gets one line
saying so, not a traceback after a long retry.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

from bessemer.errors import BessemerError

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")
PATTERNS = ["*.json", "*.safetensors", "*.jinja", "tokenizer.model", "merges.txt", "vocab.txt"]
ETAG_TIMEOUT_S = 10  # per metadata request: a black-holed network fails in seconds, not minutes


def looks_like_hub_id(name: str) -> bool:
    return bool(HUB_ID.match(name))


def download(repo_id: str, say: Callable[[str], None]) -> Path:
    """The local snapshot directory of `repo_id`; BessemerError when it cannot be had."""
    def unreachable(why: str) -> BessemerError:
        return BessemerError(f"model {repo_id} is not a local directory and the hub cannot be reached ({why}); "
                             "download it and pass the directory")

    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise unreachable("huggingface_hub is not installed: pip install huggingface_hub") from None
    say(f"fetching {repo_id} from the HuggingFace hub")
    try:
        path = snapshot_download(repo_id, allow_patterns=PATTERNS, etag_timeout=ETAG_TIMEOUT_S)
    except Exception as e:  # noqa: BLE001 - network, auth, missing repo: all end the same way
        first = next((line.strip() for line in str(e).splitlines() if line.strip()), "")
        raise unreachable(f"{type(e).__name__}: {first[:200]}") from None
    return Path(path)
