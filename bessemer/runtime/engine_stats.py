"""EngineStats: a snapshot of the engine core's state (AsyncLLM publishes one after every
step; the server's metrics and stats log read it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineStats:
    num_running: int = 0  # sequences, so a request with n=4 counts 4
    num_waiting: int = 0
    num_blocks: int = 0
    num_free_blocks: int = 0
    num_hit_tokens: int = 0  # prefix cache: prompt tokens served from cached blocks
    num_queried_tokens: int = 0  # prefix cache: prompt tokens looked up
    num_preemptions: int = 0
    num_steps: int = 0
    num_draft_tokens: int = 0  # speculative decoding: draft tokens verified
    num_accepted_tokens: int = 0  # ... and accepted by the target
    num_step_tokens: int = 0  # tokens the last step ran: prefill chunks, decode and draft tokens
