"""OpenAI-compatible HTTP serving over AsyncLLM (needs the `serve` extra: fastapi, uvicorn).

`server.run` loads the engine and runs uvicorn; `app.build_app` builds the FastAPI app;
`protocol` holds the wire format, `streams` the per-request merging, `metrics` Prometheus.
"""
