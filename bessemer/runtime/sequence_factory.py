"""SequenceFactory: a request's prompt and params checked against the loaded engine, and
its sequences made (ids in arrival order, each with its random stream)."""

from __future__ import annotations

import time
from typing import Callable

from bessemer.errors import RequestError
from bessemer.runtime.random_stream import RandomStream
from bessemer.runtime.sampler import bad_words_token_ids
from bessemer.runtime.sampling_params import SamplingParams
from bessemer.runtime.sequence import Sequence
from bessemer.runtime.tokenizer import Tokenizer


class SequenceFactory:
    def __init__(self, vocab_size: int, max_seq_len: int, seed: int,
                 tokenizer: Callable[[], Tokenizer] | None):
        """`seed` keys the streams of a request without its own seed (with the sequence's
        arrival order: runtime/random_stream.py); `tokenizer` loads the engine's tokenizer
        (None: the engine has no tokenizer.json)."""
        self.vocab_size, self.max_seq_len, self.seed = vocab_size, max_seq_len, seed
        self._tokenizer = tokenizer
        self.next_id = 0

    def new(self, token_ids: list[int], params: SamplingParams, index: int = 0,
            generates: bool = True) -> Sequence:
        """Sequence `index` of a request's n. `generates`: it needs room for at least one
        output token (scoring does not). Its stream's key is the request's seed + `index`,
        or without a seed the engine's seed + its arrival order."""
        if not token_ids:
            raise RequestError("the prompt is empty; give at least one token")
        if len(token_ids) > self.max_seq_len - int(generates):
            raise RequestError(
                f"the prompt has {len(token_ids)} tokens but the engine allows {self.max_seq_len} "
                f"(prompt and output); shorten the prompt or rebuild with a larger --max-seq-len")
        self.check_in_vocabulary(token_ids)
        key = params.seed + index if params.seed is not None else self.seed + self.next_id
        seq = Sequence(self.next_id, list(token_ids), len(token_ids), params, RandomStream(key),
                       arrival_time=time.perf_counter())
        if params.prompt_logprobs is not None and index == 0:  # the request's n sequences share one prompt
            seq.prompt_logprobs = [None]  # the first token has no context (vLLM)
        self.next_id += 1
        return seq

    def check_params(self, params: SamplingParams) -> list[list[int]]:
        """The checks of a request's params that need the vocabulary (once per request, not
        per sequence); returns its bad_words as token sequences."""
        self.check_in_vocabulary(params.logit_bias or (), " in logit_bias")
        self.check_in_vocabulary(params.allowed_token_ids or (), " in allowed_token_ids")
        if params.prompt_logprobs is not None and params.prompt_logprobs > self.vocab_size:
            raise RequestError(f"prompt_logprobs {params.prompt_logprobs} exceeds the vocabulary "
                               f"({self.vocab_size} tokens); ask for at most {self.vocab_size}")
        return self._bad_words_token_ids(params)

    def check_in_vocabulary(self, token_ids, where: str = "") -> None:
        bad = next((t for t in token_ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise RequestError(f"token id {bad}{where} is outside the vocabulary (0..{self.vocab_size - 1})")

    def _bad_words_token_ids(self, params: SamplingParams) -> list[list[int]]:
        """params.bad_words as token sequences (sampler.bad_words_token_ids), tokenized once
        when the request is added rather than at every step."""
        if not params.bad_words:
            return []
        if self._tokenizer is None:
            raise RequestError("bad_words needs the engine's tokenizer and this engine has none (no tokenizer.json); "
                               "ban token ids with logit_bias -100 instead")
        tokenizer = self._tokenizer()
        words = bad_words_token_ids(params.bad_words, lambda text: tokenizer.encode(text, add_special_tokens=False))
        for word in words:
            self.check_in_vocabulary(word, " of bad_words")
        return words
