"""Graph passes: pure (Graph, BuildConfig) -> Graph functions, one per file."""
