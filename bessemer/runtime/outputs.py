"""What the engine hands back: per step, one SequenceUpdate for each sequence that got
tokens; per finished request, a RequestOutput (vLLM's shape)."""

from __future__ import annotations

from dataclasses import dataclass, field

from bessemer.runtime.sequence import Sequence


@dataclass(frozen=True)
class SequenceUpdate:
    """What one engine step added to one sequence."""

    seq: Sequence
    text: str  # new text; "" when not streaming, while a character is incomplete, at a stop
    token_ids: list[int]  # new token ids, in order
    logprobs: list[dict[int, float]] | None  # one {token: logprob} per new token, if asked


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    logprobs: list[dict[int, float]] | None
    finish_reason: str | None  # "error" when this sequence failed inside a step
    error: str | None = None  # why it failed; the other sequences of the batch went on


@dataclass
class RequestOutput:
    request_id: int
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    metrics: dict = field(default_factory=dict)  # arrival/first/last token times (perf_counter)
    # SamplingParams.prompt_logprobs: per prompt token {token: logprob} of its own and the
    # top-k tokens given the tokens before it; None for the first token (it has no context)
    prompt_logprobs: list[dict[int, float] | None] | None = None

    # vLLM keeps results under .outputs; the common single-sample case reads them directly.
    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def logprobs(self):
        return self.outputs[0].logprobs

    @property
    def finish_reason(self):
        return self.outputs[0].finish_reason
