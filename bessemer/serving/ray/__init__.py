"""Replicas of one engine behind one endpoint, on Ray Serve (needs the `ray` extra).

    HTTP ─▶ Ray proxy ─▶ Ingress (ingress.py; no engine, 0 CPUs)
              reads the body, keys it by its prompt's prefix (routing_key.py), forwards the
              request as ASGI messages through a Ray handle whose router (router.py) sends
              it to the replica that served the same prefix, or else the least loaded one
           ─▶ EngineReplica × N (replica.py): one AsyncLLM each (own KV and prefix cache,
              `threads` cores) running serving/app.py's FastAPI app unchanged, so the
              endpoints, streaming, cancellation and API keys are one server's.

`application.build_application` is the entry point for users composing their own Ray Serve
app; `application.serve_forever` is what `bessemer serve --replicas N` runs.
"""
