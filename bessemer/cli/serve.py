"""bessemer serve MODEL_OR_ENGINE: an OpenAI-compatible HTTP server (bessemer/serving).

MODEL_OR_ENGINE: an engine directory, or a HF checkpoint directory / hub id built once into
the engine cache with the build flags (builder/engine_cache.py)."""

from __future__ import annotations

import os
from pathlib import Path

import click

from bessemer.cli.build_flags import build_config, model_options
from bessemer.cli.common import Progress, fail, read_text_file, speculative_config, speculative_options, user_errors
from bessemer.runtime.constraint_limits import ConstraintLimits
from bessemer.serving.cors import CorsPolicy
from bessemer.serving.limits import ServerLimits
from bessemer.serving.prometheus import PREFIXES
from bessemer.serving.tool_parsers import PARSER_NAMES


@click.command(name="serve", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("engine_dir", metavar="MODEL_OR_ENGINE", type=click.Path(path_type=str))
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Interface to bind; 0.0.0.0 exposes the server to the network.")
@click.option("--port", type=int, default=8000, show_default=True)
@click.option("--max-num-seqs", type=int, default=None, help="Sequences per step (at most the engine's).")
@click.option("--max-num-tokens", type=int, default=None,
              help="Tokens per step (at most the engine's); building from a checkpoint, the engine's too.")
@click.option("--kv-cache-gib", type=float, default=None,
              help="KV-cache budget; 0 gives the minimum pool (one full-length sequence). [default: 1]")
@click.option("--no-prefix-cache", is_flag=True, help="Turn off automatic prefix caching.")
@click.option("--api-key", default=None, help="Require 'Authorization: Bearer KEY' on /v1 routes.")
@click.option("--allowed-origins", default=None,
              help="Browser origins that may call the server (CORS), a JSON list or comma list; '*' for any. "
                   "[default: none, no CORS headers]")
@click.option("--allowed-methods", default=None, help="HTTP methods CORS allows (JSON or comma list). [default: *]")
@click.option("--allowed-headers", default=None, help="Request headers CORS allows (JSON or comma list). [default: *]")
@click.option("--chat-template", "chat_template_file", default=None, metavar="FILE",
              help="A Jinja chat template to use instead of the engine's own.")
@click.option("--tool-call-parser", type=click.Choice(PARSER_NAMES), default="auto", show_default=True,
              help="The format of the model's tool calls (tool_choice auto); auto reads it from the chat template.")
@click.option("--model-name", default=None,
              help="Name clients pass as `model`. [default: the directory's name, or the hub id]")
@click.option("--threads", type=int, default=None, help="Threads per rank. [default: the cores divided among the ranks]")
@click.option("--replicas", type=int, default=None,
              help="Serve N replicas of the engine behind one endpoint on Ray Serve, each with its own KV cache and "
                   "--threads (default: the cores divided among them); needs pip install 'bessemer[ray]'.")
@click.option("--ray-address", default=None,
              help="With --replicas: the Ray cluster to join ('auto', or HOST:PORT). [default: start one here]")
@click.option("--log-level", type=click.Choice(["critical", "error", "warning", "info", "debug"]),
              default="info", show_default=True)
@click.option("--metrics-prefix", type=click.Choice(list(PREFIXES)), default="bessemer", show_default=True,
              help="Names of the /metrics series: bessemer_* or vLLM's vllm:* (its dashboards work unchanged).")
@click.option("--log-stats-interval", type=float, default=10.0, show_default=True,
              help="Seconds between the throughput / queue / KV-cache lines in the log (only after activity); 0: off.")
@click.option("--stream-interval-ms", type=float, default=0.0, show_default=True,
              help="Send a stream's tokens together at most this often (the first at once; each token keeps its "
                   "own event); 0: each as soon as it is made. Over a token's time it spares the server and a "
                   "client on the same cores a wake-up per token.")
@click.option("--max-request-bytes", type=int, default=ServerLimits.max_body_bytes, show_default=True,
              help="Largest request body; larger ones get 413 before they are read.")
@click.option("--max-n", type=int, default=ServerLimits.max_n, show_default=True,
              help="Most completions one request may ask for per prompt (`n`).")
@click.option("--header-timeout", type=float, default=ServerLimits.header_timeout_s, show_default=True,
              help="Seconds a client has to send a request's headers (then 408).")
@click.option("--body-timeout", type=float, default=ServerLimits.body_timeout_s, show_default=True,
              help="Seconds a client has to send a request's body (then 408).")
@click.option("--drain-timeout", type=float, default=ServerLimits.drain_timeout_s, show_default=True,
              help="On SIGTERM, seconds running requests may take to finish (meanwhile /health and new "
                   "generation requests get 503) before they are aborted; 0 aborts at once.")
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
@model_options(exclude=("max_num_tokens",))  # serve's own --max-num-tokens above feeds the build too
@click.option("--quiet", "-q", is_flag=True, help="No progress lines while an engine is built.")
@user_errors
def main(engine_dir, host, port, max_num_seqs, max_num_tokens, kv_cache_gib, no_prefix_cache, api_key,
         model_name, threads, replicas, ray_address, log_level, metrics_prefix, log_stats_interval, stream_interval_ms,
         max_request_bytes,
         max_n, header_timeout, body_timeout, max_prompts, max_prompt_tokens, max_constraint_bytes, max_grammar_rules,
         max_schema_depth, constraint_timeout, speculative, draft_engine, num_speculative_tokens, ngram_max,
         drain_timeout, allowed_origins, allowed_methods, allowed_headers, chat_template_file, tool_call_parser,
         engine_cache, quiet, **build_flags):
    """Serve an engine (or a checkpoint, built once into the engine cache) over HTTP
    (OpenAI /v1/completions and /v1/chat/completions)."""
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        fail("bessemer serve needs FastAPI and uvicorn: pip install fastapi uvicorn "
             "(or pip install 'bessemer[serve]')")
    if threads is not None and threads <= 0:
        fail(f"--threads must be a positive integer, got {threads}")
    if replicas is not None and replicas <= 0:
        fail(f"--replicas must be a positive integer, got {replicas}")
    if ray_address is not None and replicas is None:
        fail("--ray-address joins a Ray cluster to serve replicas; give --replicas N too")
    cores = os.cpu_count() or 1
    if replicas is not None and ray_address is None and threads is not None and threads * replicas > cores:
        fail(f"{replicas} replicas of {threads} threads need {threads * replicas} cores and this machine has {cores}, "
             "so Ray could not place them all; lower --threads or --replicas, or join a larger cluster (--ray-address)")
    if kv_cache_gib is not None and kv_cache_gib < 0:
        fail(f"--kv-cache-gib must be >= 0, got {kv_cache_gib}")
    if log_stats_interval < 0:
        fail(f"--log-stats-interval must be >= 0, got {log_stats_interval}")
    if not stream_interval_ms >= 0:
        fail(f"--stream-interval-ms must be >= 0, got {stream_interval_ms}")
    if not 0 <= port <= 65535:
        fail(f"--port must be in 0..65535, got {port}")
    limits = ServerLimits(max_body_bytes=max_request_bytes, max_n=max_n, header_timeout_s=header_timeout,
                          body_timeout_s=body_timeout, max_prompts=max_prompts,
                          max_prompt_tokens=max_prompt_tokens,
                          drain_timeout_s=drain_timeout)  # checked before the engine loads
    constraint_limits = ConstraintLimits(max_bytes=max_constraint_bytes, max_rules=max_grammar_rules,
                                         max_schema_depth=max_schema_depth, compile_timeout_s=constraint_timeout)
    cors = CorsPolicy.from_flags(allowed_origins, allowed_methods, allowed_headers)
    chat_template = None
    if chat_template_file is not None:  # read and parsed now: a bad file fails before the engine loads
        from bessemer.runtime.tokenizer import check_chat_template

        chat_template = read_text_file(chat_template_file, "--chat-template")
        check_chat_template(chat_template, f"--chat-template {chat_template_file}")
    from bessemer.builder.build import is_engine_dir
    from bessemer.builder.engine_cache import resolve_engine

    model = engine_dir
    if not is_engine_dir(Path(model).expanduser()):  # a checkpoint is built with the step size it is served with
        build_flags["max_num_tokens"] = max_num_tokens
    engine_dir = resolve_engine(model, build_config(build_flags), engine_cache, Progress(quiet))
    local = Path(model).expanduser()
    model_name = model_name or (local.resolve().name if local.exists() else model)
    run_options = dict(kv_cache_gib=kv_cache_gib, enable_prefix_caching=not no_prefix_cache,
                       constraint_limits=constraint_limits,
                       speculative=speculative_config(speculative, draft_engine, num_speculative_tokens, ngram_max))
    step_limits = dict(max_num_seqs=max_num_seqs, max_num_tokens=max_num_tokens)
    if replicas is not None:  # AsyncLLM keyword arguments: each replica adds its own num_threads
        serve_replicas(str(engine_dir), replicas, ray_address, host, port, threads, model_name, chat_template,
                       {**step_limits, **run_options}, dict(api_key=api_key, limits=limits,
                                                            metrics_prefix=metrics_prefix, cors=cors,
                                                            tool_call_parser=tool_call_parser,
                                                            stream_interval_s=stream_interval_ms / 1e3))
        return
    from bessemer.serving.server import run
    from bessemer.targets import RunOptions

    run(str(engine_dir), host=host, port=port, model_name=model_name, api_key=api_key, log_level=log_level, limits=limits,
        metrics_prefix=metrics_prefix, log_stats_interval=log_stats_interval, cors=cors,
        chat_template=chat_template, tool_call_parser=tool_call_parser, stream_interval_s=stream_interval_ms / 1e3,
        **step_limits,
        options=RunOptions(num_threads=threads, **run_options))


def serve_replicas(engine_dir, replicas, ray_address, host, port, threads, model_name, chat_template,
                   engine_options, app_options):
    try:
        import ray.serve  # noqa: F401
    except ImportError:
        fail("bessemer serve --replicas needs Ray Serve: pip install 'bessemer[ray]'")
    from bessemer.serving.ray.application import build_application, serve_forever

    application = build_application(engine_dir, replicas, threads, model_name, app_options, chat_template,
                                    engine_options)
    serve_forever(application, ray_address, host, port, log=click.echo)
