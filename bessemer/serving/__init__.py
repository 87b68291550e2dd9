"""OpenAI-compatible HTTP serving over AsyncLLM (needs the `serve` extra: fastapi, uvicorn).

`server.run` loads the engine and runs uvicorn; `app.build_app` builds the FastAPI app;
`protocol` holds the wire format, `streams` the per-request merging, `metrics` the Prometheus
series (`prometheus` their text format), `stats_log` the periodic stats line,
`utility_routes` the models, tokenize, detokenize and version routes, `drain` the graceful
shutdown, `cors` the CORS flags.
"""
