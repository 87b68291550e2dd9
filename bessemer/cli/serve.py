"""bessemer serve ENGINE_DIR: an OpenAI-compatible HTTP server (bessemer/serving)."""

from __future__ import annotations

import click

from bessemer.cli.common import fail, speculative_config, speculative_options, user_errors
from bessemer.runtime.constraint_limits import ConstraintLimits
from bessemer.serving.limits import ServerLimits


@click.command(name="serve", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("engine_dir", type=click.Path(path_type=str))
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Interface to bind; 0.0.0.0 exposes the server to the network.")
@click.option("--port", type=int, default=8000, show_default=True)
@click.option("--max-num-seqs", type=int, default=None, help="Sequences per step (at most the engine's).")
@click.option("--max-num-tokens", type=int, default=None, help="Tokens per step (at most the engine's).")
@click.option("--kv-cache-gib", type=float, default=None,
              help="KV-cache budget; 0 gives the minimum pool (one full-length sequence). [default: 1]")
@click.option("--no-prefix-cache", is_flag=True, help="Turn off automatic prefix caching.")
@click.option("--api-key", default=None, help="Require 'Authorization: Bearer KEY' on /v1 routes.")
@click.option("--model-name", default=None, help="Name clients pass as `model`. [default: engine dir name]")
@click.option("--threads", type=int, default=None, help="Threads per rank. [default: the cores divided among the ranks]")
@click.option("--log-level", type=click.Choice(["critical", "error", "warning", "info", "debug"]),
              default="info", show_default=True)
@click.option("--max-request-bytes", type=int, default=ServerLimits.max_body_bytes, show_default=True,
              help="Largest request body; larger ones get 413 before they are read.")
@click.option("--max-n", type=int, default=ServerLimits.max_n, show_default=True,
              help="Most completions one request may ask for per prompt (`n`).")
@click.option("--header-timeout", type=float, default=ServerLimits.header_timeout_s, show_default=True,
              help="Seconds a client has to send a request's headers (then 408).")
@click.option("--body-timeout", type=float, default=ServerLimits.body_timeout_s, show_default=True,
              help="Seconds a client has to send a request's body (then 408).")
@click.option("--max-prompts", type=int, default=ServerLimits.max_prompts, show_default=True,
              help="Most prompts one completions request may hold.")
@click.option("--max-prompt-tokens", type=int, default=ServerLimits.max_prompt_tokens, show_default=True,
              help="Most prompt tokens one request may hold, all its prompts together.")
@click.option("--max-constraint-bytes", type=int, default=ConstraintLimits.max_bytes, show_default=True,
              help="Largest JSON schema, regex or grammar a request may send.")
@click.option("--max-grammar-rules", type=int, default=ConstraintLimits.max_rules, show_default=True,
              help="Most rules a request's grammar may define.")
@click.option("--max-schema-depth", type=int, default=ConstraintLimits.max_schema_depth, show_default=True,
              help="Deepest nesting of a request's JSON schema.")
@click.option("--constraint-timeout", type=float, default=ConstraintLimits.compile_timeout_s, show_default=True,
              help="Seconds a request's constraint may take to compile (then 400).")
@speculative_options
@user_errors
def main(engine_dir, host, port, max_num_seqs, max_num_tokens, kv_cache_gib, no_prefix_cache, api_key,
         model_name, threads, log_level, max_request_bytes, max_n, header_timeout, body_timeout, max_prompts,
         max_prompt_tokens, max_constraint_bytes, max_grammar_rules, max_schema_depth, constraint_timeout,
         speculative, draft_engine, num_speculative_tokens, ngram_max):
    """Serve an engine over HTTP (OpenAI /v1/completions and /v1/chat/completions)."""
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        fail("bessemer serve needs FastAPI and uvicorn: pip install fastapi uvicorn "
             "(or pip install 'bessemer[serve]')")
    if threads is not None and threads <= 0:
        fail(f"--threads must be a positive integer, got {threads}")
    if kv_cache_gib is not None and kv_cache_gib < 0:
        fail(f"--kv-cache-gib must be >= 0, got {kv_cache_gib}")
    if not 0 <= port <= 65535:
        fail(f"--port must be in 0..65535, got {port}")
    limits = ServerLimits(max_body_bytes=max_request_bytes, max_n=max_n, header_timeout_s=header_timeout,
                          body_timeout_s=body_timeout, max_prompts=max_prompts,
                          max_prompt_tokens=max_prompt_tokens)  # checked before the engine loads
    constraint_limits = ConstraintLimits(max_bytes=max_constraint_bytes, max_rules=max_grammar_rules,
                                         max_schema_depth=max_schema_depth, compile_timeout_s=constraint_timeout)
    from bessemer.serving.server import run

    run(engine_dir, host=host, port=port, model_name=model_name, api_key=api_key, log_level=log_level, limits=limits,
        max_num_seqs=max_num_seqs, max_num_tokens=max_num_tokens, num_threads=threads,
        kv_cache_gib=kv_cache_gib, enable_prefix_caching=not no_prefix_cache, constraint_limits=constraint_limits,
        speculative=speculative_config(speculative, draft_engine, num_speculative_tokens, ngram_max))
