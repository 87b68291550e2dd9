"""bessemer bench serve: load an OpenAI-compatible server and report vLLM's serving metrics
(the library is bessemer/serving_bench)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import click

from bessemer.cli.common import Progress, fail, user_errors
from bessemer.serving_bench.target import ENDPOINTS
from bessemer.serving_bench.prompts import DATASETS


def numbers(value: str, flag: str, rates: bool) -> tuple[float, ...]:
    """A comma list of positive numbers ('inf' allowed for rates)."""
    try:
        out = tuple(math.inf if rates and v.strip() == "inf" else float(v) for v in value.split(",") if v.strip())
    except ValueError:
        fail(f"{flag} takes comma-separated numbers{' or inf' if rates else ''}, got {value!r}")
    if not out or any(v <= 0 or (not rates and v >= 100) for v in out):
        fail(f"{flag} takes numbers above 0{' (or inf)' if rates else ' and below 100'}, got {value!r}")
    return out


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main():
    """Benchmarks."""


@main.command(name="serve")
@click.option("--base-url", required=True, help="The server's root URL, e.g. http://127.0.0.1:8000 (a trailing /v1 is fine).")
@click.option("--api-key", default=None, help="Sent as 'Authorization: Bearer KEY'.")
@click.option("--model", default=None, help="The model to ask for. [default: the first of GET /v1/models]")
@click.option("--endpoint", type=click.Choice(list(ENDPOINTS)), default="completions", show_default=True)
@click.option("--dataset", default="synthetic", show_default=True, metavar="|".join(DATASETS) + "|FILE.jsonl",
              help="Random prompts of --input-len tokens, the prompts shipped with Bessemer, or a JSONL file "
                   "({\"prompt\": ..., \"output_len\": N} or ShareGPT's conversations) per line.")
@click.option("--num-prompts", type=click.IntRange(min=1), default=100, show_default=True)
@click.option("--input-len", type=click.IntRange(min=1), default=1024, show_default=True,
              help="synthetic: prompt tokens (chat: words).")
@click.option("--output-len", type=click.IntRange(min=1), default=None,
              help="max_tokens of every request. [default: synthetic 128; files: each prompt's own]")
@click.option("--request-rate", default="inf", show_default=True,
              help="Requests per second, Poisson arrivals; inf sends them all at once.")
@click.option("--max-concurrency", type=click.IntRange(min=1), default=None, help="Most requests in flight.")
@click.option("--sweep-rates", default=None, metavar="R1,R2,...",
              help="Run once per rate (instead of --request-rate); with --plot, latency vs throughput.")
@click.option("--percentiles", "percentile_list", default="99", show_default=True,
              help="Percentiles reported for TTFT, TPOT, ITL and E2EL (p99 always), e.g. 50,90,99.")
@click.option("--ignore-eos", is_flag=True, help="Send ignore_eos (vLLM, Bessemer): every request runs to --output-len.")
@click.option("--seed", type=int, default=0, show_default=True, help="Prompts and arrival times.")
@click.option("--timeout", type=float, default=600.0, show_default=True, help="Seconds to wait for a response's next bytes before the request counts as failed.")
@click.option("--result-json", type=click.Path(path_type=Path), default=None, help="Write the results here.")
@click.option("--plot", type=click.Path(path_type=Path), default=None, metavar="FILE.png",
              help="Latency (median/p99 TTFT and TPOT) vs output throughput, one point per rate (matplotlib).")
@click.option("--quiet", "-q", is_flag=True, help="No progress lines.")
@user_errors
def serve(base_url, api_key, model, endpoint, dataset, num_prompts, input_len, output_len, request_rate,
          max_concurrency, sweep_rates, percentile_list, ignore_eos, seed, timeout, result_json, plot, quiet):
    """Benchmark an OpenAI-compatible server (Bessemer's, vLLM's, llama.cpp's): streamed
    requests at a rate or concurrency; TTFT, TPOT, ITL, E2EL and throughput as vLLM reports them."""
    try:
        import httpx  # noqa: F401
    except ImportError:
        fail("bessemer bench serve needs httpx: pip install httpx (or pip install 'bessemer[bench]')")
    from bessemer.serving_bench.benchmark import Options, benchmark

    rates = numbers(sweep_rates or request_rate, "--sweep-rates" if sweep_rates else "--request-rate", rates=True)
    opts = Options(base_url, endpoint, model, api_key, dataset, num_prompts, input_len, output_len, rates,
                   max_concurrency, seed, ignore_eos, numbers(percentile_list, "--percentiles", rates=False), timeout)
    result = benchmark(opts, Progress(quiet), click.echo)
    if result_json is not None:
        result_json.write_text(json.dumps(result, indent=2) + "\n")
    if plot is not None:
        from bessemer.serving_bench.plot import plot_sweep

        plot_sweep(result["runs"], plot, f"{result['model_id']} at {result['base_url']} ({endpoint})")
    failed = [r for r in result["runs"] if r["completed"] == 0]
    if failed:
        first_error = next(e for e in failed[0]["errors"] if e)
        fail(f"all {failed[0]['num_prompts']} requests failed at rate {failed[0]['request_rate']}; "
             f"the first: {first_error}")
