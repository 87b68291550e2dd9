"""Prometheus metrics in the text exposition format, written by hand (no client library).

Latencies are observed from the engine's deltas (`Delta` times are time.perf_counter()
values), so they include the queueing before the engine thread picked a request up.
Gauges of the engine (running, waiting, KV usage, prefix cache, preemptions, speculative
decoding's drafted and accepted tokens) are read from the snapshot the engine thread
publishes after each step.
"""

from __future__ import annotations

import bisect
from collections import Counter

from bessemer.runtime.async_llm import Delta, EngineStats

PREFIX = "bessemer"
# seconds; TTFT and end-to-end include prefill of long prompts on a CPU, so they reach further
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, 2.5)
E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 60.0, 120.0, 300.0)


class Histogram:
    def __init__(self, name: str, help: str, buckets: tuple[float, ...]):
        self.name, self.help, self.buckets = name, help, buckets
        self.counts = [0] * (len(buckets) + 1)  # the last is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1  # bucket bounds are inclusive (le)
        self.sum += value

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        total = 0
        for bound, count in zip(self.buckets + (float("inf"),), self.counts):
            total += count
            le = "+Inf" if bound == float("inf") else repr(float(bound))
            lines.append(f'{self.name}_bucket{{le="{le}"}} {total}')
        lines += [f"{self.name}_sum {self.sum!r}", f"{self.name}_count {total}"]
        return lines


class ServerMetrics:
    def __init__(self):
        self.ttft = Histogram(f"{PREFIX}_time_to_first_token_seconds",
                              "Time from request arrival to the first generated token.", TTFT_BUCKETS)
        self.itl = Histogram(f"{PREFIX}_inter_token_latency_seconds",
                             "Time between consecutive generated tokens of a sequence.", ITL_BUCKETS)
        self.e2e = Histogram(f"{PREFIX}_e2e_request_latency_seconds",
                             "Time from request arrival to a sequence's last token.", E2E_BUCKETS)
        self.finished = Counter()  # finish_reason -> sequences
        self.num_prompt_tokens = 0
        self.num_generation_tokens = 0

    def request_started(self, num_prompt_tokens: int) -> None:
        self.num_prompt_tokens += num_prompt_tokens

    def observe(self, delta: Delta, last_time: dict[int, float]) -> None:
        """Records one delta; `last_time` is the request's index -> previous token time."""
        if delta.token_ids:
            self.num_generation_tokens += len(delta.token_ids)
            previous = last_time.get(delta.index)
            if previous is None:
                self.ttft.observe(delta.time - delta.arrival_time)
            else:
                self.itl.observe(delta.time - previous)
            last_time[delta.index] = delta.time
        if delta.finish_reason is not None:
            self.finished[delta.finish_reason] += 1
            if delta.finish_reason != "abort":  # an aborted request's latency says nothing
                self.e2e.observe(delta.time - delta.arrival_time)

    def aborted(self, num_sequences: int) -> None:
        """Sequences dropped because their client went away."""
        self.finished["abort"] += num_sequences

    def render(self, stats: EngineStats) -> str:
        usage = 1 - stats.num_free_blocks / stats.num_blocks if stats.num_blocks else 0.0
        lines = []
        for kind, name, help, value in (
            ("gauge", "num_requests_running", "Sequences in the running batch.", stats.num_running),
            ("gauge", "num_requests_waiting", "Sequences waiting to be scheduled.", stats.num_waiting),
            ("gauge", "kv_cache_usage_perc", "Fraction of KV-cache blocks in use (0-1); cached but "
                                             "unreferenced blocks count as free.", usage),
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
            lines += [f"# HELP {PREFIX}_{name} {help}", f"# TYPE {PREFIX}_{name} {kind}",
                      f"{PREFIX}_{name} {value}"]
        name = f"{PREFIX}_request_success_total"
        lines += [f"# HELP {name} Finished sequences by finish reason.", f"# TYPE {name} counter"]
        for reason in sorted(set(self.finished) | {"stop", "length", "abort"}):
            lines.append(f'{name}{{finished_reason="{reason}"}} {self.finished[reason]}')
        for hist in (self.ttft, self.itl, self.e2e):
            lines += hist.render()
        return "\n".join(lines) + "\n"
