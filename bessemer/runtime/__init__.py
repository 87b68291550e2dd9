"""Runtime: engine loading, executor, KV cache, scheduler, sampler and the LLM API."""
