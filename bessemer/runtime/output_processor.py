"""Output processing: what happens to a sampled token. It is appended, the stop checks
run (stop tokens and EOS, min/max tokens, the engine's max_seq_len, stop strings), the
text grows by a delta that never splits a character or leaks a stop string (unless
include_stop_str_in_output keeps it), and finished sequences become RequestOutputs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from bessemer.runtime.outputs import CompletionOutput, RequestOutput, SequenceUpdate
from bessemer.runtime.sampling_params import SamplingParams
from bessemer.runtime.sequence import Sequence
from bessemer.errors import EngineLoadError
from bessemer.runtime.tokenizer import IncrementalDetokenizer, Tokenizer, read_json_object


def eos_token_ids(engine_dir: Path, model_config: dict, tokenizer: Callable[[], Tokenizer] | None) -> set[int]:
    """The model's end-of-sequence ids: config.json's, generation_config.json's and the
    tokenizer's (`tokenizer` is None when the engine has no tokenizer.json)."""
    ids = set(model_config.get("eos_token_id") or [])
    gen = engine_dir / "generation_config.json"
    if gen.exists():
        eos = read_json_object(gen).get("eos_token_id")
        eos = eos if isinstance(eos, list) else [eos] if eos is not None else []
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in eos):
            raise EngineLoadError(f"{gen}: eos_token_id {eos!r} is not a token id or a list of them; "
                                  "rebuild the engine or fix the file")
        ids |= set(eos)
    if tokenizer is not None and tokenizer().eos_token_id is not None:
        ids.add(tokenizer().eos_token_id)
    return ids


class OutputProcessor:
    def __init__(self, eos_ids: set[int], max_seq_len: int, tokenizer: Callable[[], Tokenizer] | None):
        """`tokenizer` loads the engine's tokenizer on first use; None when it has none."""
        self.eos_ids = eos_ids
        self.max_seq_len = max_seq_len
        self._tokenizer = tokenizer

    def stop_ids(self, params: SamplingParams) -> set[int]:
        return set(params.stop_token_ids or ()) | (set() if params.ignore_eos else self.eos_ids)

    def banned_ids(self, seq: Sequence, vocab_size: int, num_ahead: int = 0) -> list[int]:
        """Tokens the sampler must not pick `num_ahead` tokens from now (draft positions):
        stop tokens until min_tokens are out."""
        if len(seq.output_token_ids) + num_ahead >= seq.params.min_tokens:
            return []
        return [t for t in self.stop_ids(seq.params) if t < vocab_size]

    def start(self, seq: Sequence, stream: bool) -> None:
        """Prepares a new sequence: text is kept while generating when it is streamed or
        when stop strings must be found in it."""
        if stream or seq.params.stop_strings:
            seq.detok = IncrementalDetokenizer(self._tokenizer(), seq.params.skip_special_tokens)

    def append(self, seq: Sequence, tokens: list[int], logprobs: list[dict[int, float]] | None,
               now: float) -> tuple[SequenceUpdate, str | None]:
        """Appends `tokens` (sampled in one step) one at a time until one stops the
        sequence; the rest are dropped. Returns the update and the finish reason (None
        while it goes on); the caller finishes the sequence in the scheduler."""
        delta, added, reason = "", [], None
        for i, token in enumerate(tokens):
            if logprobs is not None:
                seq.logprobs.append(logprobs[i])
            seq.token_ids.append(token)
            added.append(token)
            seq.first_token_time = seq.first_token_time or now
            seq.last_token_time = now
            reason = self._stop_reason(seq, token)
            if seq.detok is not None:
                text_delta, reason = self._grow_text(seq, token, reason)
                delta += text_delta
            if reason:
                break
        entries = seq.logprobs[len(seq.logprobs) - len(added):] if logprobs is not None else None
        return SequenceUpdate(seq, delta, added, entries), reason

    def _stop_reason(self, seq: Sequence, token: int) -> str | None:
        if token in self.stop_ids(seq.params) and len(seq.output_token_ids) > seq.params.min_tokens:
            return "stop"
        if len(seq.output_token_ids) >= seq.params.max_tokens or len(seq.token_ids) >= self.max_seq_len:
            return "length"
        return None

    def _text_ids(self, seq: Sequence, reason: str | None) -> list[int]:
        """The output tokens the text is made of: a stop token that ended the sequence is
        not one of them unless include_stop_str_in_output (vLLM)."""
        ids = seq.output_token_ids
        if reason == "stop" and ids and ids[-1] in self.stop_ids(seq.params) \
                and not seq.params.include_stop_str_in_output:
            return ids[:-1]
        return ids

    def _grow_text(self, seq: Sequence, token: int, reason: str | None) -> tuple[str, str | None]:
        delta = seq.detok.update(self._text_ids(seq, reason))
        text = seq.detok.text
        for stop in seq.params.stop_strings:
            cut = text.find(stop)
            if cut >= 0:  # the text ends before the stop string, or after it when it is kept
                end = cut + len(stop) if seq.params.include_stop_str_in_output else cut
                delta = delta[: max(0, len(delta) - (len(text) - end))]
                text, reason = text[:end], "stop"
                break
        seq.text = text
        return delta, reason

    def request_output(self, group: list[Sequence], prompt: str | None) -> RequestOutput:
        completions = []
        for i, seq in enumerate(group):
            ids = seq.output_token_ids
            text = seq.text
            if text is None and self._tokenizer is not None:
                text = self._tokenizer().decode(self._text_ids(seq, seq.finish_reason), seq.params.skip_special_tokens)
            completions.append(CompletionOutput(i, text or "", ids,
                                                seq.logprobs if seq.params.logprobs is not None else None,
                                                seq.finish_reason, seq.error))
        first = group[0]
        metrics = {"arrival_time": first.arrival_time, "first_token_time": first.first_token_time,
                   "last_token_time": first.last_token_time}
        return RequestOutput(first.seq_id, prompt, first.token_ids[:first.num_prompt_tokens], completions, metrics,
                             first.prompt_logprobs)
