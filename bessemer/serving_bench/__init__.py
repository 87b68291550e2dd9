"""`bessemer bench serve`: a load generator for any OpenAI-compatible server (Bessemer's own,
vLLM's, llama.cpp's), measuring what vLLM's benchmarks/benchmark_serving.py measures so the
numbers can be set side by side with theirs.

- prompts.py: the prompt sets (synthetic token ids or words, the shipped prompts.jsonl, a JSONL file)
- target.py: the URL, model and request body
- client.py: one streamed request -> its TTFT, inter-token gaps, E2E latency and token counts
- runner.py: Poisson arrivals at a rate (or all at once) under an optional concurrency cap
- metrics.py: the summary vLLM prints (throughputs; mean/median/std/percentiles) and its table
- plot.py: latency vs output throughput over a sweep of rates (matplotlib, optional)
- benchmark.py: all of it in order, as the CLI runs it (`bessemer/cli/bench.py` only parses)
"""
