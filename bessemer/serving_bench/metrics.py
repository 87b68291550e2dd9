"""The summary vLLM's benchmark_serving prints and saves, under its key names (`completed`,
`request_throughput`, `mean_ttft_ms`, `p99_itl_ms`, ...), so its scripts read ours:
TPOT per request is (E2E - TTFT) / (output tokens - 1), over requests of 2+ tokens; ITL pools
every gap of every request; throughputs count successful requests over the benchmark duration."""

from __future__ import annotations

import numpy as np

from bessemer.serving_bench.runner import Run

# key, the table's section title, the table's short name
METRICS = (("ttft", "Time to First Token", "TTFT"),
           ("tpot", "Time per Output Token (excl. 1st token)", "TPOT"),
           ("itl", "Inter-token Latency", "ITL"),
           ("e2el", "End-to-end Latency", "E2EL"))


def percentile_name(p: float) -> str:
    return str(int(p)) if p == int(p) else str(p)  # vLLM's: p99, p99.9


def samples(run: Run) -> dict[str, list[float]]:
    """Seconds, per metric, over the successful requests."""
    ok = [r for r in run.results if r.ok]
    return {"ttft": [r.ttft_s for r in ok],
            "tpot": [(r.e2el_s - r.ttft_s) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1],
            "itl": [gap for r in ok for gap in r.itl_s],
            "e2el": [r.e2el_s for r in ok]}


def summarize(run: Run, percentiles: list[float]) -> dict:
    ok = [r for r in run.results if r.ok]
    total_input = sum(r.prompt_tokens for r in ok)
    total_output = sum(r.output_tokens for r in ok)
    out = {"request_rate": "inf" if np.isinf(run.request_rate) else run.request_rate,  # JSON has no inf
           "max_concurrency": run.max_concurrency, "num_prompts": len(run.results),
           "completed": len(ok), "failed": len(run.results) - len(ok), "duration": run.duration_s,
           "total_input_tokens": total_input, "total_output_tokens": total_output,
           "request_throughput": len(ok) / run.duration_s, "output_throughput": total_output / run.duration_s,
           "total_token_throughput": (total_input + total_output) / run.duration_s}
    for key, values in samples(run).items():
        ms = np.asarray(values or [0.0]) * 1000  # vLLM reports 0 for a metric with no samples
        out[f"mean_{key}_ms"] = float(np.mean(ms))
        out[f"median_{key}_ms"] = float(np.median(ms))
        out[f"std_{key}_ms"] = float(np.std(ms))
        for p in percentiles:
            out[f"p{percentile_name(p)}_{key}_ms"] = float(np.percentile(ms, p))
    # per request, in the order sent (vLLM's lists, plus e2els)
    out["input_lens"] = [r.prompt_tokens for r in run.results]
    out["output_lens"] = [r.output_tokens for r in run.results]
    out["ttfts"] = [r.ttft_s for r in run.results]
    out["e2els"] = [r.e2el_s for r in run.results]
    out["itls"] = [list(r.itl_s) for r in run.results]
    out["errors"] = [r.error for r in run.results]
    return out


def format_table(summary: dict, percentiles: list[float]) -> str:
    """vLLM's result table."""
    def row(name: str, value) -> str:
        return f"{name:<40} {value:<10.2f}" if isinstance(value, float) else f"{name:<40} {value:<10}"

    lines = [f"{' Serving Benchmark Result ':=^60}", row("Request rate (req/s):", summary["request_rate"]),
             row("Max concurrency:", summary["max_concurrency"] or "none"),
             row("Successful requests:", summary["completed"]),
             row("Failed requests:", summary["failed"]),
             row("Benchmark duration (s):", summary["duration"]),
             row("Total input tokens:", summary["total_input_tokens"]),
             row("Total generated tokens:", summary["total_output_tokens"]),
             row("Request throughput (req/s):", summary["request_throughput"]),
             row("Output token throughput (tok/s):", summary["output_throughput"]),
             row("Total Token throughput (tok/s):", summary["total_token_throughput"])]
    for key, section, short in METRICS:
        lines.append(f"{section:-^60}")
        lines.append(row(f"Mean {short} (ms):", summary[f"mean_{key}_ms"]))
        lines.append(row(f"Median {short} (ms):", summary[f"median_{key}_ms"]))
        for p in percentiles:
            lines.append(row(f"P{percentile_name(p)} {short} (ms):", summary[f"p{percentile_name(p)}_{key}_ms"]))
    lines.append("=" * 60)
    return "\n".join(lines)
