"""bessemer eval ENGINE_DIR --dataset FILE|wikitext2: perplexity by the protocol of runtime/evaluate.py."""

from __future__ import annotations

import json

import click

from bessemer.cli.common import Progress, gpu_kwargs, gpu_options, user_errors


@click.command(name="eval", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("engine_dir", type=click.Path(path_type=str))
@click.option("--dataset", required=True, type=str, help="Plain-text file, or a built-in text: wikitext2, hamlet, python-code.")
@click.option("--context-len", type=int, default=1024, show_default=True, help="Tokens per window.")
@click.option("--max-tokens", type=int, default=8192, show_default=True, help="Score the first N tokens.")
@click.option("--reference", type=click.Path(path_type=str), help="HF checkpoint to score the same way.")
@click.option("--threads", type=int, default=None)
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout.")
@click.option("--kv-cache-gib", type=float, default=None,
              help="KV-cache budget (cpu default 1; cuda default: --gpu-memory-utilization).")
@gpu_options
@click.option("--quiet", "-q", is_flag=True)
@user_errors
def main(engine_dir, dataset, context_len, max_tokens, reference, threads, kv_cache_gib, device,
         gpu_memory_utilization, enforce_eager, as_json, quiet):
    """Perplexity of an engine (and optionally of the HF checkpoint) on a text file."""
    from bessemer.runtime.evaluate import hf_scorer, perplexity, read_dataset, windows
    from bessemer.runtime.llm import LLM, RunOptions

    progress = Progress(quiet)
    text = read_dataset(dataset)
    llm = LLM(engine_dir, options=RunOptions(num_threads=threads, kv_cache_gib=kv_cache_gib, say=progress,
                                             **gpu_kwargs(device, gpu_memory_utilization, enforce_eager)))
    if context_len > llm.max_seq_len:
        raise click.UsageError(f"--context-len {context_len} exceeds the engine's max_seq_len {llm.max_seq_len}")
    wins = windows(llm.tokenizer.encode(text, add_special_tokens=False), context_len, max_tokens)
    # the reference is loaded (and checked) before the engine scores: a wrong one fails at once
    ref_score = hf_scorer(reference, threads, llm.vocab_size) if reference else None
    progress(f"{sum(len(w) for w in wins)} tokens in {len(wins)} windows of up to {context_len}")
    result = {"engine": engine_dir, "dataset": dataset, "context_len": context_len,
              **perplexity(llm.score, wins, progress=progress).to_json()}
    if reference:
        ref = perplexity(ref_score, wins, progress=progress)
        result["reference"] = {"model": reference, **ref.to_json()}
        result["relative_difference"] = result["perplexity"] / ref.perplexity - 1
    if as_json:
        click.echo(json.dumps(result))
    else:
        click.echo(f"perplexity {result['perplexity']:.4f} over {result['scored_tokens']} tokens")
        if reference:
            click.echo(f"reference  {result['reference']['perplexity']:.4f} (HF transformers fp32); "
                       f"relative difference {result['relative_difference'] * 100:+.3f}%")
