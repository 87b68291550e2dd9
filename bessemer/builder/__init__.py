"""Builder: IR, passes, lowering and the engine format."""
