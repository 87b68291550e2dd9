"""The server's Prometheus metrics: vLLM V1's metric set, names and bucket boundaries, so
vLLM's Grafana dashboards and PromQL read a Bessemer server unchanged.

Every series carries `model_name` (the served model name). Names are `bessemer_<name>`,
or `vllm:<name>` exactly as vLLM's with `--metrics-prefix vllm`.

What one "request" is: one prompt with its n sequences (one engine RequestStream), as
vLLM counts engine requests; a completions request with several prompts is several.
Token latencies (time to first token, inter-token) are observed per sequence; the rest
(request_success, end-to-end, queue / prefill / decode / inference times, the request_*
size histograms) once per request when its last sequence ends. A request's finish reason
is the first of its sequences' reasons in REASON_ORDER. Aborted requests are counted but
not timed: their latencies say nothing. Times come from the deltas (time.perf_counter()
values): arrival is when the server submitted the prompt, so queue time includes waiting
for the engine thread. Engine state (running, waiting, KV usage, prefix cache,
preemptions, speculative decoding) is read from the EngineStats snapshot AsyncLLM
publishes after each step; tokens per step from each step's stats (`engine_step`).
"""

from __future__ import annotations

import weakref
from collections import Counter
from dataclasses import dataclass, field

from bessemer.runtime.async_llm import Delta, EngineStats, RequestStream
from bessemer.runtime.sampling_params import SamplingParams
from bessemer.serving.prometheus import PREFIXES, Histogram, family

# vLLM V1's boundaries (vllm/v1/metrics/loggers.py, v0.10-v0.11): the same `le` values, so
# dashboards' histogram_quantile panels and SLO thresholds mean the same
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TOKEN_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                         10.0, 20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
N_BUCKETS = (1, 2, 5, 10, 20)

# one aborted or failed sequence makes its request aborted or failed
REASON_ORDER = ("abort", "error", "length", "stop")


def kv_cache_usage(stats: EngineStats) -> float:
    """Fraction of KV-cache blocks in use (0-1); cached but unreferenced blocks count as free."""
    return 1 - stats.num_free_blocks / stats.num_blocks if stats.num_blocks else 0.0


def buckets_1_2_5(max_value: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, ... up to max_value (vLLM's token-count buckets)."""
    out, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_value:
                return tuple(out)
            out.append(m * scale)
        scale *= 10


@dataclass
class _Request:
    """What the metrics remember of one request until its last sequence ends."""

    n: int
    max_tokens: int
    num_prompt_tokens: int
    reasons: list[str] = field(default_factory=list)  # of its finished sequences
    num_generation_tokens: int = 0
    max_num_generation_tokens: int = 0  # of its longest sequence
    token_times: dict[int, float] = field(default_factory=dict)  # sequence index -> its last token's time
    arrival_time: float | None = None
    first_scheduled_time: float | None = None  # the earliest of its sequences'
    first_token_time: float | None = None  # the earliest of its sequences'
    last_time: float | None = None  # its last sequence's end


class ServerMetrics:
    def __init__(self, model_name: str, max_model_len: int, prefix: str = "bessemer"):
        if prefix not in PREFIXES:
            raise ValueError(f"metrics prefix must be one of {sorted(PREFIXES)}, got {prefix!r}")
        self.prefix = PREFIXES[prefix]
        self.labels = {"model_name": model_name}
        tokens = buckets_1_2_5(max_model_len)

        def hist(name: str, help: str, buckets) -> Histogram:
            return Histogram(self.prefix + name, help, buckets)

        self.ttft = hist("time_to_first_token_seconds", "Time from request arrival to a sequence's first token.",
                         TTFT_BUCKETS)
        self.itl = hist("inter_token_latency_seconds", "Time between consecutive deltas of a sequence.",
                        TOKEN_LATENCY_BUCKETS)
        # vLLM's name before v0.11 for the same observations; older dashboards read it
        self.tpot = self.itl.alias(self.prefix + "time_per_output_token_seconds", "Time between consecutive "
                                   "deltas of a sequence (the older name of inter_token_latency_seconds).")
        self.e2e = hist("e2e_request_latency_seconds", "Time from request arrival to its last token.",
                        REQUEST_LATENCY_BUCKETS)
        self.queue = hist("request_queue_time_seconds", "Time from request arrival until first scheduled.",
                          REQUEST_LATENCY_BUCKETS)
        self.prefill = hist("request_prefill_time_seconds", "Time from first scheduled to the first token.",
                            REQUEST_LATENCY_BUCKETS)
        self.decode = hist("request_decode_time_seconds", "Time from the first token to the last.",
                           REQUEST_LATENCY_BUCKETS)
        self.inference = hist("request_inference_time_seconds", "Time from first scheduled to the last token "
                              "(prefill + decode).", REQUEST_LATENCY_BUCKETS)
        self.request_prompt_tokens = hist("request_prompt_tokens", "Prompt tokens per request.", tokens)
        self.request_generation_tokens = hist("request_generation_tokens",
                                              "Generated tokens per request (all its n sequences).", tokens)
        self.max_generation_tokens = hist("request_max_num_generation_tokens",
                                          "Generated tokens of a request's longest sequence.", tokens)
        # vLLM v0.11's per-request mean: decode time over the longest sequence's later tokens
        self.request_tpot = hist("request_time_per_output_token_seconds", "Decode time per generated token "
                                 "after the first, per request.", TOKEN_LATENCY_BUCKETS)
        self.params_n = hist("request_params_n", "The n request parameter.", N_BUCKETS)
        self.params_max_tokens = hist("request_params_max_tokens", "The max_tokens request parameter.", tokens)
        self.iteration_tokens = hist("iteration_tokens_total", "Tokens per engine step.", ITERATION_TOKEN_BUCKETS)
        self.finished = Counter()  # finish reason -> requests
        self.num_prompt_tokens = 0
        self.num_generation_tokens = 0
        # weak: a stream dropped before its end (a handler that failed) takes its entry with it
        self._requests: weakref.WeakKeyDictionary[RequestStream, _Request] = weakref.WeakKeyDictionary()
        self._last_step = 0  # engine thread only

    def request_started(self, stream: RequestStream, num_prompt_tokens: int, params: SamplingParams) -> None:
        self.num_prompt_tokens += num_prompt_tokens
        self._requests[stream] = _Request(params.n, params.max_tokens, num_prompt_tokens)

    def observe(self, stream: RequestStream, delta: Delta) -> None:
        """Records one delta of a request `request_started` announced."""
        r = self._requests.get(stream)
        if r is None:  # already counted as aborted
            return
        r.arrival_time = delta.arrival_time
        if delta.first_scheduled_time is not None:
            r.first_scheduled_time = min(r.first_scheduled_time or delta.first_scheduled_time,
                                         delta.first_scheduled_time)
        if delta.token_ids:
            self.num_generation_tokens += len(delta.token_ids)
            r.num_generation_tokens += len(delta.token_ids)
            previous = r.token_times.get(delta.index)
            if previous is None:
                self.ttft.observe(delta.time - delta.arrival_time)
                r.first_token_time = min(r.first_token_time or delta.time, delta.time)
            else:
                self.itl.observe(delta.time - previous)  # tpot too: its alias
            r.token_times[delta.index] = delta.time
        if delta.finish_reason is not None:
            r.reasons.append(delta.finish_reason)
            r.max_num_generation_tokens = max(r.max_num_generation_tokens, delta.num_output_tokens)
            r.last_time = max(r.last_time or delta.time, delta.time)
            if len(r.reasons) == r.n:
                self._finish(stream, r)

    def aborted(self, stream: RequestStream) -> None:
        """A request whose client went away before its last sequence ended."""
        if self._requests.pop(stream, None) is not None:
            self.finished["abort"] += 1

    def engine_step(self, stats: EngineStats) -> None:
        """An AsyncLLM step listener (engine thread): one observation per step that ran."""
        if stats.num_steps != self._last_step:
            self._last_step = stats.num_steps
            self.iteration_tokens.observe(stats.num_step_tokens)

    def _finish(self, stream: RequestStream, r: _Request) -> None:
        del self._requests[stream]
        reason = min(r.reasons, key=lambda x: REASON_ORDER.index(x) if x in REASON_ORDER else len(REASON_ORDER))
        self.finished[reason] += 1
        if reason == "abort":
            return
        self.e2e.observe(r.last_time - r.arrival_time)
        self.request_prompt_tokens.observe(r.num_prompt_tokens)
        self.request_generation_tokens.observe(r.num_generation_tokens)
        self.max_generation_tokens.observe(r.max_num_generation_tokens)
        self.params_n.observe(r.n)
        self.params_max_tokens.observe(r.max_tokens)
        if r.first_scheduled_time is None or r.first_token_time is None:  # ended before a token (a failed constraint)
            return
        self.queue.observe(r.first_scheduled_time - r.arrival_time)
        self.prefill.observe(r.first_token_time - r.first_scheduled_time)
        self.decode.observe(r.last_time - r.first_token_time)
        self.inference.observe(r.last_time - r.first_scheduled_time)
        if r.max_num_generation_tokens > 1:
            self.request_tpot.observe((r.last_time - r.first_token_time) / (r.max_num_generation_tokens - 1))

    def render(self, stats: EngineStats) -> str:
        lines = []
        for kind, name, help, value in (
            ("gauge", "num_requests_running", "Sequences in the running batch.", stats.num_running),
            ("gauge", "num_requests_waiting", "Sequences waiting to be scheduled.", stats.num_waiting),
            ("gauge", "kv_cache_usage_perc", "Fraction of KV-cache blocks in use (0-1); cached but "
                                             "unreferenced blocks count as free.", kv_cache_usage(stats)),
            ("counter", "prefix_cache_hits_total", "Prompt tokens served from the prefix cache.",
             stats.num_hit_tokens),
            ("counter", "prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.",
             stats.num_queried_tokens),
            ("counter", "num_preemptions_total", "Sequences preempted (freed, recomputed later).",
             stats.num_preemptions),
            ("counter", "spec_decode_num_draft_tokens_total", "Speculative decoding: draft tokens verified.",
             stats.num_draft_tokens),
            ("counter", "spec_decode_num_accepted_tokens_total", "Speculative decoding: draft tokens accepted.",
             stats.num_accepted_tokens),
            ("gauge", "spec_decode_draft_acceptance_rate", "Accepted / verified draft tokens since start (0-1).",
             stats.num_accepted_tokens / stats.num_draft_tokens if stats.num_draft_tokens else 0.0),
            ("counter", "prompt_tokens_total", "Prompt tokens of accepted requests.", self.num_prompt_tokens),
            ("counter", "generation_tokens_total", "Generated tokens.", self.num_generation_tokens),
        ):
            lines += family(kind, self.prefix + name, help, [(self.labels, value)])
        reasons = sorted(set(self.finished) | set(REASON_ORDER))
        lines += family("counter", self.prefix + "request_success_total", "Finished requests by finish reason.",
                        [({**self.labels, "finished_reason": r}, self.finished[r]) for r in reasons])
        for hist in (self.ttft, self.itl, self.tpot, self.e2e, self.queue, self.prefill, self.decode, self.inference,
                     self.request_tpot, self.request_prompt_tokens, self.request_generation_tokens,
                     self.max_generation_tokens, self.params_n,
                     self.params_max_tokens, self.iteration_tokens):
            lines += hist.render(self.labels)
        return "\n".join(lines) + "\n"
