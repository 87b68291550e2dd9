"""Model families: HF config -> ModelConfig and build_graph(cfg) -> Graph."""
