"""ServerLimits: what one client may send and how long it may take, and how long a
shutdown waits for running requests (`bessemer serve` flags). No imports of the serving
stack, so the CLI can check them before loading it. Enforced by serving/http.py
(headers), serving/body.py (the body) and serving/drain.py (the shutdown).
"""

from __future__ import annotations

from dataclasses import dataclass

from bessemer.errors import InvalidOptionError


@dataclass(frozen=True)
class ServerLimits:
    # a request body: a prompt of the longest context any engine here takes is well under
    # it (~4 bytes per token)
    max_body_bytes: int = 16 * 2**20
    body_timeout_s: float = 60.0  # for the whole body to arrive
    header_timeout_s: float = 10.0  # for the request line and headers to arrive
    max_header_bytes: int = 64 * 1024  # request line and headers together
    max_n: int = 64  # completions per prompt (`n`)
    # one request's prompts: how many (a completions prompt list) and their tokens together,
    # so that no request can fill the queue by itself (fair admission does the rest)
    max_prompts: int = 1024
    max_prompt_tokens: int = 2**20
    # on SIGTERM, how long running requests may go on before they are aborted (0: at once);
    # under the 30 s a Kubernetes pod gets between SIGTERM and SIGKILL by default
    drain_timeout_s: float = 25.0

    def __post_init__(self):
        for name in ("max_body_bytes", "max_header_bytes", "max_n", "max_prompts", "max_prompt_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise InvalidOptionError(f"--{name.replace('_', '-')} must be a positive integer, got {value!r}")
        for name in ("body_timeout_s", "header_timeout_s"):
            value = getattr(self, name)
            if not value > 0 or value == float("inf"):
                flag = name.replace("_s", "").replace("_", "-")
                raise InvalidOptionError(f"--{flag} must be a positive number of seconds, got {value!r}")
        if not 0 <= self.drain_timeout_s < float("inf"):
            raise InvalidOptionError(f"--drain-timeout must be a number of seconds >= 0 (0 aborts running requests "
                                     f"at once), got {self.drain_timeout_s!r}")
