"""run-engine MODEL_OR_ENGINE (--prompt TEXT ... | --input-file FILE): parse flags, call LLM.generate.

MODEL_OR_ENGINE: an engine directory, or a HF checkpoint directory / hub id built once into
the engine cache with the build flags (builder/engine_cache.py)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from bessemer.cli.build_flags import build_config, model_options
from bessemer.cli.common import (MAX_TEXT_FILE_MIB, Progress, error, fail, gpu_kwargs, gpu_options, read_text_file,
                                 speculative_config, speculative_options, user_errors)


def _read_prompts(prompts: tuple[str, ...], input_file: str | None) -> list[str]:
    if bool(prompts) == bool(input_file):
        fail("give either --prompt TEXT (repeatable) or --input-file FILE (one prompt per line)")
    if input_file:
        lines = [line for line in read_text_file(input_file, "--input-file").splitlines() if line.strip()]
        if not lines:
            fail(f"--input-file {input_file} holds no prompts; put one prompt per line")
        return lines
    return list(prompts)


@click.command(name="run-engine", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("engine_dir", metavar="MODEL_OR_ENGINE", type=click.Path(path_type=str))
@click.option("--prompt", "prompts", multiple=True, help="Prompt text; repeat for a batch.")
@click.option("--input-file", type=click.Path(path_type=str),
              help=f"UTF-8 file with one prompt per line (at most {MAX_TEXT_FILE_MIB} MiB).")
@click.option("--chat", is_flag=True, help="Wrap each prompt as a user message in the chat template.")
@click.option("--max-new-tokens", type=int, default=64, show_default=True)
@click.option("--temperature", type=float, default=0.0, show_default=True, help="0 = greedy.")
@click.option("--top-k", type=int, default=0, show_default=True, help="0 = off.")
@click.option("--top-p", type=float, default=1.0, show_default=True)
@click.option("--seed", type=int, default=None)
@click.option("--ignore-eos", is_flag=True, help="Keep generating past end-of-sequence tokens.")
@click.option("--stream", is_flag=True, help="Print text as it is generated (one prompt at a time).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per prompt on stdout.")
@click.option("--threads", type=int, default=None, help="Threads per rank. [default: the cores divided among the ranks]")
@click.option("--json-schema", default=None,
              help=f"Constrain the output to this JSON schema (a file of at most {MAX_TEXT_FILE_MIB} MiB, "
                   "or the schema itself).")
@click.option("--regex", default=None, help="Constrain the output to this regular expression.")
@click.option("--grammar", default=None,
              help=f"Constrain the output to this grammar file (Lark or GBNF, UTF-8, at most {MAX_TEXT_FILE_MIB} MiB).")
@speculative_options
@click.option("--kv-cache-gib", type=float, default=None,
              help="KV-cache budget (cpu default 1; cuda default: --gpu-memory-utilization).")
@gpu_options
@model_options()
@click.option("--quiet", "-q", is_flag=True, help="No progress output.")
@user_errors
def main(engine_dir, prompts, input_file, chat, max_new_tokens, temperature, top_k, top_p, seed,
         ignore_eos, stream, as_json, threads, json_schema, regex, grammar, speculative, draft_engine,
         num_speculative_tokens, ngram_max, kv_cache_gib, device, gpu_memory_utilization, enforce_eager, quiet,
         engine_cache, **build_flags):
    """Generate text with a Bessemer engine (or a checkpoint, built once into the engine cache)."""
    from bessemer.runtime.llm import LLM, RunOptions, SamplingParams

    texts = _read_prompts(prompts, input_file)
    if threads is not None and threads <= 0:
        fail(f"--threads must be a positive integer, got {threads}")
    progress = Progress(quiet)
    params = SamplingParams(max_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                            top_p=top_p, seed=seed, ignore_eos=ignore_eos, json_schema=_read_schema(json_schema),
                            regex=regex, grammar=read_text_file(grammar, "--grammar") if grammar is not None else None)
    progress(f"loading engine {engine_dir}")
    options = RunOptions(num_threads=threads, kv_cache_gib=kv_cache_gib, say=progress,
                         speculative=speculative_config(speculative, draft_engine, num_speculative_tokens, ngram_max),
                         **gpu_kwargs(device, gpu_memory_utilization, enforce_eager))
    llm = LLM(model=engine_dir, build_config=build_config(build_flags), engine_cache=engine_cache, options=options)
    progress(f"engine loaded: {llm.executor.info.isa}, {llm.num_threads} threads, {llm.num_kv_blocks} KV blocks")
    if chat:
        token_ids = [llm.tokenizer.encode_chat([{"role": "user", "content": t}]) for t in texts]
    else:
        token_ids = [llm.tokenizer.encode(t) for t in texts]
    if stream and not as_json:
        outputs = []
        for text, ids in zip(texts, token_ids):  # one at a time so streams do not interleave
            outputs += llm.generate([ids], params, on_delta=lambda i, d: click.echo(d, nl=False))
            click.echo("")
    else:
        outputs = llm.generate(token_ids, params)
    for text, out in zip(texts, outputs):
        if as_json:
            click.echo(json.dumps(_json_row(text, out)))
        elif not stream and out.finish_reason != "error":  # a failed prompt has no text: its error follows
            click.echo(f"{text}{out.text}" if not chat else out.text)
            if len(outputs) > 1:
                click.echo("-" * 40)
    stats = llm.llm_engine.stats()
    if stats.num_draft_tokens:
        progress(f"speculative decoding: {stats.num_accepted_tokens}/{stats.num_draft_tokens} draft tokens accepted "
                 f"({stats.num_accepted_tokens / stats.num_draft_tokens:.0%})")
    _exit_on_failures(outputs)


def _json_row(text: str, out) -> dict:
    """One prompt's result for --json; `error` says why, when finish_reason is "error"."""
    m = out.metrics
    n = len(out.token_ids)
    first = m["first_token_time"]  # None: the sequence failed before its first token
    span = (m["last_token_time"] or 0) - (first or 0)
    return {"prompt": text, "text": out.text, "token_ids": out.token_ids,
            "num_prompt_tokens": len(out.prompt_token_ids),
            "finish_reason": out.finish_reason, "error": out.outputs[0].error,
            "ttft_s": round(first - m["arrival_time"], 6) if first is not None else None,
            "decode_tok_s": round((n - 1) / span, 3) if n > 1 and span > 0 else None}


def _exit_on_failures(outputs) -> None:
    """A prompt that failed inside a step ended alone (the others' results are printed):
    one `error:` line for each, and a non-zero exit, so a script never takes it for a result."""
    failed = [(i, out.outputs[0].error) for i, out in enumerate(outputs, 1) if out.finish_reason == "error"]
    for i, why in failed:
        error(f"prompt {i} failed: {why}")
    if failed:
        raise SystemExit(1)


def _read_schema(value: str | None) -> dict | None:
    if value is None:
        return None
    text = read_text_file(value, "--json-schema") if Path(value).is_file() else value
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as e:
        fail(f"--json-schema is neither a file nor valid JSON ({e}); pass a schema file or a JSON string")
    if not isinstance(schema, dict):
        fail("--json-schema must be a JSON object (a JSON schema)")
    return schema


if __name__ == "__main__":
    main()
