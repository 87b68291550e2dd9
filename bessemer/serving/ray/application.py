"""The Ray Serve application: N engine replicas behind one ingress, and the loop that runs it.

For a Ray Serve app of your own, bind `build_application(...)` into it (or `serve.run` it):

    from ray import serve
    from bessemer.serving.ray.application import build_application
    serve.run(build_application("/models/smollm2-engine", num_replicas=4), route_prefix="/")

or name `from_args` in a Serve config file / KubeRay RayService (`serve deploy`).

Each replica asks Ray for `num_threads` CPUs and runs that many kernel threads, so Ray places
replicas where cores are free and replicas sharing a machine do not oversubscribe it.
"""

from __future__ import annotations

import os
import signal
import threading

from bessemer.serving.limits import ServerLimits
from bessemer.serving.ray.ingress import Ingress
from bessemer.serving.ray.replica import EngineReplica


def build_application(engine_dir: str, num_replicas: int = 2, num_threads: int | None = None,
                      model_name: str | None = None, app_options: dict | None = None,
                      chat_template: str | None = None, engine_options: dict | None = None,
                      max_ongoing_requests: int = 64, max_imbalance: int = 16):
    """A bound Ray Serve application. `engine_dir` must be readable at the same path on every
    node that hosts a replica. `num_threads`: per replica, default this machine's cores
    divided among the replicas; `app_options` go to serving.app.build_app (api_key, limits,
    metrics_prefix, cors, tool_call_parser), `engine_options` to AsyncLLM; a replica takes at
    most `max_ongoing_requests` at once; a request leaves the replica holding its prefix when
    that one has more than `max_imbalance` requests in flight beyond the least loaded one's."""
    try:
        from ray import serve
        from ray.serve.config import RequestRouterConfig
    except ImportError:
        raise ImportError("serving replicas needs Ray Serve: pip install 'bessemer[ray]'") from None
    from bessemer.serving.ray.router import PrefixAffinityRouter

    if num_replicas < 1:
        raise ValueError(f"num_replicas must be at least 1, got {num_replicas}")
    threads = num_threads or max(1, (os.cpu_count() or 1) // num_replicas)
    limits = (app_options or {}).get("limits") or ServerLimits()
    replica = serve.deployment(
        EngineReplica, name="bessemer-engine", num_replicas=num_replicas, max_ongoing_requests=max_ongoing_requests,
        # passive OpenMP workers: see serving/server.py (libgomp reads it when the worker loads the core)
        ray_actor_options={"num_cpus": threads},
        request_router_config=RequestRouterConfig(request_router_class=PrefixAffinityRouter,
                                                  request_router_kwargs={"max_imbalance": max_imbalance}),
        health_check_period_s=5)
    # the ingress only relays bytes: it asks for no CPU so that the replicas get every core
    ingress = serve.deployment(Ingress, name="bessemer-ingress", ray_actor_options={"num_cpus": 0},
                               max_ongoing_requests=max(1000, num_replicas * max_ongoing_requests * 2))
    engine = replica.bind(engine_dir, model_name, app_options, chat_template,
                          {**(engine_options or {}), "num_threads": threads})
    return ingress.bind(engine, num_replicas, limits)


def from_args(args: dict):
    """The application builder for Ray Serve config files and KubeRay's RayService
    (`import_path: bessemer.serving.ray.application:from_args`); `args` are
    build_application's keyword arguments."""
    return build_application(**args)


def serve_forever(application, ray_address: str | None = None, host: str = "127.0.0.1", port: int = 8000,
                  log=print) -> None:
    """Starts (or, with `ray_address`, joins) a Ray cluster, serves `application` on
    host:port until SIGTERM or Ctrl-C, then takes it down."""
    import ray
    from ray import serve

    # "local": a cluster of our own even where another one runs (Ray would otherwise join it)
    ray.init(address=ray_address or "local", include_dashboard=False, log_to_driver=False)
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        serve.start(http_options={"host": host, "port": port})
        serve.run(application, name="bessemer", route_prefix="/")
        log(f"serving on http://{host}:{port} (Ray Serve, cluster {ray.get_runtime_context().gcs_address})")
        stop.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if ray_address is None:  # our own cluster: take it all down
            serve.shutdown()
            ray.shutdown()
        else:  # a shared cluster keeps its other applications
            serve.delete("bessemer")
