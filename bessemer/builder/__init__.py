"""Builder: the passes, lowering and the build itself (the IR is bessemer.ir)."""
