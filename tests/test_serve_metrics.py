"""/metrics as a drop-in for vLLM's: vLLM V1's names (with --metrics-prefix vllm), a
model_name label on every series, and counts that are exact for a known set of requests.

One server (`--metrics-prefix vllm`, a stats line every half second) serves, in order: a
completion (max_tokens 5), a completion with n=2 (max_tokens 4 each) and a streamed chat
(max_tokens 3), all with ignore_eos, so every token count is known in advance. The bessemer_
names are read by tests/test_serve.py.
"""

from __future__ import annotations

import re
import time

import pytest

from test_serve import MODEL, Server

from bessemer.serving.metrics import ServerMetrics, buckets_1_2_5

# vLLM V1's series, as vllm/v1/metrics/loggers.py (v0.10.1) exposes them, plus v0.11's
# inter_token_latency_seconds (the new name of time_per_output_token_seconds) and
# request_time_per_output_token_seconds
VLLM_COUNTERS = ["prompt_tokens_total", "generation_tokens_total", "request_success_total", "num_preemptions_total",
                 "prefix_cache_queries_total", "prefix_cache_hits_total"]
VLLM_GAUGES = ["num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"]
VLLM_HISTOGRAMS = ["time_to_first_token_seconds", "time_per_output_token_seconds", "inter_token_latency_seconds",
                   "e2e_request_latency_seconds", "request_queue_time_seconds", "request_prefill_time_seconds",
                   "request_decode_time_seconds", "request_inference_time_seconds", "request_prompt_tokens",
                   "request_generation_tokens", "request_max_num_generation_tokens", "iteration_tokens_total",
                   "request_time_per_output_token_seconds", "request_params_n", "request_params_max_tokens"]
VLLM_SERIES = {f"vllm:{n}" for n in VLLM_COUNTERS + VLLM_GAUGES} | \
    {f"vllm:{h}{s}" for h in VLLM_HISTOGRAMS for s in ("_bucket", "_sum", "_count")}

STATS_LINE = "Avg prompt throughput"


@pytest.fixture(scope="module")
def vllm_server(smollm2_engine, tmp_path_factory):
    s = Server(smollm2_engine("bfloat16"), tmp_path_factory.mktemp("metrics-logs") / "server.log",
               "--metrics-prefix", "vllm", "--log-stats-interval", "0.5", "--log-level", "info")
    try:
        s.wait_ready()
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def served(vllm_server):
    """Sends the three requests once; returns (metrics, the responses' prompt token counts)."""
    client = vllm_server.client()
    one = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=5, temperature=0,
                                    extra_body={"ignore_eos": True})
    two = client.completions.create(model=MODEL, prompt="Once upon a time, in a quiet village,", max_tokens=4,
                                    n=2, temperature=0.8, seed=3, extra_body={"ignore_eos": True})
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Name a colour."}], max_tokens=3, temperature=0,
        stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    prompts = [one.usage.prompt_tokens, two.usage.prompt_tokens, chunks[-1].usage.prompt_tokens]
    assert [one.usage.completion_tokens, two.usage.completion_tokens, chunks[-1].usage.completion_tokens] == [5, 8, 3]
    return vllm_server.metrics(), prompts


def test_token_and_request_counters_are_exact(served):
    m, prompts = served
    assert m["vllm:prompt_tokens_total"] == sum(prompts)  # n=2 shares one prompt: counted once
    assert m["vllm:generation_tokens_total"] == 5 + 2 * 4 + 3
    # per request, not per sequence: the n=2 completion is one "length"
    assert m['vllm:request_success_total{finished_reason="length"}'] == 3
    for reason in ("stop", "abort", "error"):
        assert m[f'vllm:request_success_total{{finished_reason="{reason}"}}'] == 0
    assert m["vllm:num_requests_running"] == m["vllm:num_requests_waiting"] == 0


def test_histograms_agree_with_the_counters(served):
    m, prompts = served
    assert m["vllm:request_generation_tokens_sum"] == m["vllm:generation_tokens_total"] == 16
    assert m["vllm:request_prompt_tokens_sum"] == sum(prompts)
    assert m["vllm:request_params_n_sum"] == 1 + 2 + 1
    assert m["vllm:request_params_max_tokens_sum"] == 5 + 4 + 3
    assert m["vllm:request_max_num_generation_tokens_sum"] == 5 + 4 + 3  # the longest of each request's sequences
    for name in ("e2e_request_latency_seconds", "request_queue_time_seconds", "request_prefill_time_seconds",
                 "request_decode_time_seconds", "request_inference_time_seconds", "request_prompt_tokens",
                 "request_generation_tokens", "request_max_num_generation_tokens", "request_params_n",
                 "request_params_max_tokens", "request_time_per_output_token_seconds"):
        assert m[f"vllm:{name}_count"] == 3, name  # once per request
        assert m[f'vllm:{name}_bucket{{le="+Inf"}}'] == 3, name
    assert m["vllm:time_to_first_token_seconds_count"] == 4  # once per sequence
    # one gap per token after a sequence's first (no speculative decoding: a token per delta)
    gaps = (5 - 1) + 2 * (4 - 1) + (3 - 1)
    assert m["vllm:inter_token_latency_seconds_count"] == m["vllm:time_per_output_token_seconds_count"] == gaps
    assert m["vllm:inter_token_latency_seconds_sum"] == m["vllm:time_per_output_token_seconds_sum"]
    # vLLM's identities: inference = prefill + decode, and e2e covers queue + inference
    assert m["vllm:request_inference_time_seconds_sum"] == pytest.approx(
        m["vllm:request_prefill_time_seconds_sum"] + m["vllm:request_decode_time_seconds_sum"])
    assert m["vllm:e2e_request_latency_seconds_sum"] >= m["vllm:request_inference_time_seconds_sum"] + \
        m["vllm:request_queue_time_seconds_sum"] - 1e-6
    # every step ran prompt tokens (less those the prefix cache served) or a decode token
    # for each sequence's next-to-last and earlier tokens
    computed = prompts[0] + 2 * prompts[1] + prompts[2] - m["vllm:prefix_cache_hits_total"] + gaps
    assert m["vllm:iteration_tokens_total_sum"] == computed
    assert 1 <= m["vllm:iteration_tokens_total_count"] <= computed


def test_every_series_carries_the_model_name_and_vllm_names(served, vllm_server):
    text = vllm_server.metrics_text()
    samples = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert samples and all(f'model_name="{MODEL}"' in line for line in samples)
    names = {re.split(r"[{ ]", line, maxsplit=1)[0] for line in samples}
    assert VLLM_SERIES <= names, sorted(VLLM_SERIES - names)
    assert all(n.startswith("vllm:") for n in names)


def test_the_stats_line_is_logged_only_after_activity(served, vllm_server):
    def lines() -> list[str]:
        return [line for line in vllm_server.log_path.read_text().splitlines() if STATS_LINE in line]

    deadline = time.monotonic() + 10
    while not lines() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert lines(), vllm_server.log_path.read_text()
    assert re.search(r"Avg prompt throughput: [\d.]+ tokens/s, Avg generation throughput: [\d.]+ tokens/s, "
                     r"Running: \d+ reqs, Waiting: \d+ reqs, GPU KV cache usage: [\d.]+%, "
                     r"Prefix cache hit rate: [\d.]+%", lines()[0])
    time.sleep(1.2)  # the interval that saw the last request has logged by now
    before = len(lines())
    time.sleep(1.5)  # three idle intervals
    assert len(lines()) == before


def test_a_request_counts_once_with_its_worst_finish_reason():
    """No server: a request's n sequences end with different reasons."""
    from bessemer.runtime.async_llm import Delta
    from bessemer.runtime.llm_engine import EngineStats
    from bessemer.runtime.sampling_params import SamplingParams

    class Stream:  # a stand-in RequestStream: the metrics only key on it
        pass

    metrics, stream = ServerMetrics("m", 2048, "bessemer"), Stream()
    metrics.request_started(stream, 7, SamplingParams(n=2, max_tokens=4))
    for index, reason, t in ((0, "stop", 1.0), (1, "length", 2.0)):
        metrics.observe(stream, Delta(index, "x", [1], reason, None, 7, 1, 0.0, t, t, first_scheduled_time=0.5))
    text = metrics.render(EngineStats())
    assert 'bessemer_request_success_total{model_name="m",finished_reason="length"} 1' in text
    assert 'bessemer_request_success_total{model_name="m",finished_reason="stop"} 0' in text
    assert 'bessemer_e2e_request_latency_seconds_sum{model_name="m"} 2.0' in text  # to its last sequence's end
    assert 'bessemer_request_decode_time_seconds_sum{model_name="m"} 1.0' in text  # first token 1.0, last 2.0
    assert buckets_1_2_5(2048) == (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)
