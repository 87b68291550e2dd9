"""Runs the app under uvicorn, with the shutdown a server under a supervisor needs.

SIGTERM (or Ctrl-C): drain (serving/drain.py): /health and new generation requests
answer 503 at once while the requests already running go on, still listening, for up to
`limits.drain_timeout_s` (a second signal cuts it short). Then stop accepting connections,
close the engine so that what is still running ends at once (streams get an error event,
plain requests a 503) instead of generating to max_tokens, wait for the responses to go
out, stop the engine thread and exit 0.
"""

from __future__ import annotations

import logging
import signal
from pathlib import Path

from bessemer.runtime.async_llm import AsyncLLM
from bessemer.serving.app import build_app
from bessemer.serving.cors import CorsPolicy
from bessemer.serving.drain import Drain
from bessemer.serving.http import guarded_protocol
from bessemer.serving.limits import ServerLimits
from bessemer.serving.stats_log import StatsLogger
from bessemer.targets import RunOptions


def run(engine_dir: str, host: str = "127.0.0.1", port: int = 8000, model_name: str | None = None,
        api_key: str | None = None, log_level: str = "info", limits: ServerLimits | None = None,
        metrics_prefix: str = "bessemer", log_stats_interval: float = 10.0, cors: CorsPolicy | None = None,
        chat_template: str | None = None, tool_call_parser: str = "auto", max_num_seqs: int | None = None,
        max_num_tokens: int | None = None, options: RunOptions = RunOptions(), stream_interval_s: float = 0.0) -> None:
    """`options`: how the engine runs (targets/__init__.py: threads, KV budget, prefix
    caching, speculative decoding, constraint limits, ...); `max_num_seqs` and
    `max_num_tokens` lower the scheduler's per-step limits; `limits` bound what one request
    may send (serving/limits.py); `metrics_prefix` names the /metrics series ("bessemer" or
    "vllm"); a stats line is logged every `log_stats_interval` seconds of activity (0: never);
    `cors` lets browser pages of other origins call the server (serving/cors.py);
    `chat_template` (Jinja text) replaces the engine's own; `tool_call_parser` names the
    format of the model's tool calls (serving/tool_parsers.py; "auto" reads the template);
    `stream_interval_s` > 0 sends a stream's tokens together at most that often (serving/app.py)."""
    import uvicorn

    # The kernels' threads wait and give way to other work by bessemer/thread_policy.py, set
    # when the package was imported (a short spin, fewer threads while other tasks hold cores).

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):  # the signal handler: sets flags only
            if self.should_exit:
                drain.stop_waiting()  # a second signal: abort what is running now
            drain.begin()  # /health turns 503 now, not at uvicorn's next 0.1 s tick
            super().handle_exit(sig, frame)

        async def shutdown(self, sockets=None):
            # uvicorn's own shutdown stops listening first, so a load balancer could not
            # see /health turn 503: drain while still listening
            log = logging.getLogger("uvicorn.error")
            if drain.num_running and drain.timeout_s > 0:
                log.info("draining: %d request(s) running, waiting up to %g s for them (signal again to abort them)",
                         drain.num_running, drain.timeout_s)
            left = await drain.wait()
            if left:
                log.warning("drain over: aborting %d request(s) still running", left)
            engine.close()  # before uvicorn waits for the open responses to finish
            await super().shutdown(sockets)

    limits = limits or ServerLimits()
    drain = Drain(limits.drain_timeout_s)
    engine = AsyncLLM(engine_dir, max_num_seqs, max_num_tokens, options=options)
    if chat_template is not None:
        engine.llm.tokenizer.chat_template = chat_template
    try:
        app = build_app(engine, model_name or Path(engine_dir).resolve().name, api_key, limits, metrics_prefix,
                        drain=drain, cors=cors, tool_call_parser=tool_call_parser,
                        stream_interval_s=stream_interval_s)
        config = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="off",
                                timeout_graceful_shutdown=10,
                                http=guarded_protocol(limits.header_timeout_s, limits.max_header_bytes),
                                h11_max_incomplete_event_size=limits.max_header_bytes)
        llm = engine.llm  # uvicorn's logger is configured once Config exists
        logging.getLogger("uvicorn.error").info(
            "engine %s: %s, %d threads, %d KV blocks of %d tokens, at most %d sequences and %d tokens per step, "
            "prefix caching %s, speculative decoding %s", engine_dir, llm.executor.info.isa, llm.num_threads,
            llm.num_kv_blocks, llm.block_size, llm.scheduler.max_batch_size, llm.scheduler.max_num_tokens,
            "on" if llm.blocks.enable_prefix_caching else "off", llm.llm_engine.speculative or "off")
        # uvicorn re-raises the signal that stopped it once it is done; with the default
        # SIGTERM action that would turn a clean shutdown into "killed by SIGTERM" (-15).
        previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
        stats_logger = StatsLogger(app.state.metrics, engine, log_stats_interval).start() \
            if log_stats_interval > 0 else None
        try:
            Server(config).run()
        finally:
            signal.signal(signal.SIGTERM, previous)
            if stats_logger is not None:
                stats_logger.stop()
    finally:
        engine.shutdown()
