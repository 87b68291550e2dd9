"""What the ingress hands an engine replica, and the prefix key the router reads from it.

The key is a chain of hashes over fixed-size blocks of the prompt's text (its chat
messages rendered as "role: content"), as the KV block manager chains token blocks:
hash i covers blocks 0..i, so two prompts share hash i exactly when they share their
first i+1 blocks. Characters stand in for tokens because the ingress has no tokenizer;
a block of 128 characters is about 32 tokens, a couple of the engine's KV blocks.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

BLOCK_CHARS = 128
MAX_BLOCKS = 64  # a longer shared prefix routes the same way; no need to hash the rest


@dataclasses.dataclass(frozen=True)
class RoutedCall:
    """One HTTP request as the replica's ASGI app will see it. `prefix_hashes` (outermost
    block last) steer the router; `pin` names a replica by its rank among the sorted
    replica ids instead (the ingress's fan-out of /health and /metrics)."""

    scope: dict
    body: bytes
    prefix_hashes: tuple[int, ...] = ()
    pin: int | None = None


def prompt_text(path: str, body: bytes) -> str:
    """The text a generation request's prompt starts with; "" when there is none (other
    routes, a body that is not JSON): such requests go to the least loaded replica, and
    the replica itself reports what is wrong with the body."""
    try:
        request = json.loads(body) if path.startswith("/v1/") and body else None
    except (ValueError, UnicodeDecodeError):
        return ""
    if not isinstance(request, dict):
        return ""
    if path == "/v1/chat/completions":
        messages = request.get("messages")
        if not isinstance(messages, list):
            return ""
        return "\n".join(f"{m.get('role')}: {_content_text(m.get('content'))}"
                         for m in messages if isinstance(m, dict))
    if path == "/v1/completions":
        prompt = request.get("prompt")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # several prompts: the first one decides
        if isinstance(prompt, list):  # token ids
            return " ".join(str(t) for t in prompt)
        return prompt if isinstance(prompt, str) else ""
    return ""


def _content_text(content) -> str:
    if isinstance(content, list):  # OpenAI content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return content if isinstance(content, str) else ""


def prefix_hashes(text: str, block_chars: int = BLOCK_CHARS) -> tuple[int, ...]:
    """Chained hashes of `text`'s full blocks, at most MAX_BLOCKS (a prompt shorter than
    one block has no key: there is no prefix worth keeping together)."""
    hashes, chain = [], hashlib.blake2b(digest_size=8)
    for i in range(min(len(text) // block_chars, MAX_BLOCKS)):
        chain.update(text[i * block_chars:(i + 1) * block_chars].encode("utf-8", "surrogatepass"))
        hashes.append(int.from_bytes(chain.copy().digest(), "little"))
    return tuple(hashes)
