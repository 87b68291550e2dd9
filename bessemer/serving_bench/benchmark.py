"""The whole benchmark as the CLI runs it: name the model, load the prompts, one probe
request, then one timed run per request rate; returns the results JSON."""

from __future__ import annotations

import asyncio
import datetime
import math
from dataclasses import dataclass
from typing import Callable

import httpx

from bessemer.errors import BessemerError
from bessemer.serving_bench import prompts as P
from bessemer.serving_bench.target import Target
from bessemer.serving_bench.metrics import format_table, summarize
from bessemer.serving_bench.runner import first_model, probe, run


@dataclass(frozen=True)
class Options:
    base_url: str
    endpoint: str = "completions"
    model: str | None = None
    api_key: str | None = None
    dataset: str = "synthetic"
    num_prompts: int = 100
    input_len: int = 1024  # vLLM's random-dataset defaults
    output_len: int | None = None  # synthetic: 128; files: each prompt's own unless given
    rates: tuple[float, ...] = (math.inf,)
    max_concurrency: int | None = None
    seed: int = 0
    ignore_eos: bool = False
    percentiles: tuple[float, ...] = (99.0,)
    timeout_s: float = 600.0


def base_url(url: str) -> str:
    """The server's root: people paste the OpenAI client's base URL (.../v1) as often as not."""
    url = url.rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


def benchmark(opts: Options, progress: Callable[[str], None], show: Callable[[str], None]) -> dict:
    """Runs every rate; `show` gets each rate's table as it finishes. Raises BessemerError when
    the server cannot be benchmarked at all (unreachable, wrong model or endpoint)."""
    root = base_url(opts.base_url)
    model = opts.model
    if model is None:
        try:
            model = asyncio.run(first_model(root, opts.api_key, 30.0))
        except (httpx.HTTPError, ValueError, KeyError, IndexError) as e:
            reason = " ".join(f"{type(e).__name__}: {e}".split())  # one line, whatever the exception says
            raise BessemerError(f"could not list the models at {root}/v1/models ({reason}); "
                                "check --base-url, or name the model with --model") from None
    target = Target(root, opts.endpoint, model, opts.api_key, opts.ignore_eos)
    prompts = P.load(opts.dataset, opts.num_prompts, opts.input_len, opts.output_len, opts.seed,
                     as_text=opts.endpoint == "chat")
    first = asyncio.run(probe(target, prompts[0], opts.timeout_s))
    if not first.ok:
        raise BessemerError(f"the test request to {target.url} failed: {first.error}")
    percentiles = sorted(set(opts.percentiles) | {99.0})  # p99 always: the table and the plot show it
    runs = []
    for rate in opts.rates:
        progress(f"rate {rate} req/s, max concurrency {opts.max_concurrency or 'none'}: "
                 f"{len(prompts)} requests to {target.url}")
        summary = summarize(asyncio.run(run(target, prompts, rate, opts.max_concurrency, opts.seed,
                                            opts.timeout_s, progress)), percentiles)
        show(format_table(summary, percentiles))
        runs.append(summary)
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "base_url": root, "endpoint": opts.endpoint, "model_id": model, "dataset": opts.dataset,
            "num_prompts": len(prompts), "input_len": opts.input_len if opts.dataset == "synthetic" else None,
            "output_len": opts.output_len, "ignore_eos": opts.ignore_eos, "seed": opts.seed,
            "percentiles": percentiles, "runs": runs}
