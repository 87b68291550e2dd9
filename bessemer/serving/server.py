"""Runs the app under uvicorn, with the shutdown a server under a supervisor needs.

SIGTERM (or Ctrl-C): stop accepting connections, close the engine so every in-flight
request ends at once (streams get an error event, plain requests a 503) instead of
generating to max_tokens, wait for the responses to go out, stop the engine thread and
exit 0.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from pathlib import Path

from bessemer.runtime.async_llm import AsyncLLM
from bessemer.serving.app import build_app
from bessemer.serving.http import guarded_protocol
from bessemer.serving.limits import ServerLimits


def run(engine_dir: str, host: str = "127.0.0.1", port: int = 8000, model_name: str | None = None,
        api_key: str | None = None, log_level: str = "info", limits: ServerLimits | None = None,
        **engine_options) -> None:
    """`engine_options` go to AsyncLLM (max_num_seqs, max_num_tokens, num_threads,
    kv_cache_gib, enable_prefix_caching, speculative); `limits` bound what one request
    may send (serving/limits.py)."""
    import uvicorn

    # OpenMP workers spin between parallel regions by default. In a server the engine
    # thread alternates kernels with Python work (sampling, detokenizing) while the event
    # loop thread needs a core too; spinning workers starve it (measured on 2 busy cores:
    # 8 short requests took 63 s spinning, 1.7 s passive). libgomp reads this once, when the
    # native module loads, so it only helps if the engine was not loaded yet.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if "bessemer._C" in sys.modules and os.environ["OMP_WAIT_POLICY"].upper() == "PASSIVE":
        logging.getLogger("uvicorn.error").warning("the native module was loaded before run(); "
                                                   "OMP_WAIT_POLICY=PASSIVE has no effect")

    class Server(uvicorn.Server):
        async def shutdown(self, sockets=None):
            engine.close()  # before uvicorn waits for the open responses to finish
            await super().shutdown(sockets)

    limits = limits or ServerLimits()
    engine = AsyncLLM(engine_dir, **engine_options)
    try:
        app = build_app(engine, model_name or Path(engine_dir).resolve().name, api_key, limits)
        config = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="off",
                                timeout_graceful_shutdown=10,
                                http=guarded_protocol(limits.header_timeout_s, limits.max_header_bytes),
                                h11_max_incomplete_event_size=limits.max_header_bytes)
        llm = engine.llm  # uvicorn's logger is configured once Config exists
        logging.getLogger("uvicorn.error").info(
            "engine %s: %s, %d threads, %d KV blocks of %d tokens, at most %d sequences and %d tokens per step, "
            "prefix caching %s, speculative decoding %s", engine_dir, llm.executor.isa, llm.num_threads,
            llm.num_kv_blocks, llm.block_size, llm.scheduler.max_batch_size, llm.scheduler.max_num_tokens,
            "on" if llm.blocks.enable_prefix_caching else "off", llm.llm_engine.speculative or "off")
        # uvicorn re-raises the signal that stopped it once it is done; with the default
        # SIGTERM action that would turn a clean shutdown into "killed by SIGTERM" (-15).
        previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
        try:
            Server(config).run()
        finally:
            signal.signal(signal.SIGTERM, previous)
    finally:
        engine.shutdown()
