"""Bessemer: ahead-of-time LLM engine builder and CPU runtime.

Public API: `build_engine` (bessemer.builder), `LLM` and `SamplingParams` (bessemer.runtime).
Imports are lazy so that `import bessemer` stays cheap and the runtime never pulls in torch.
"""

from bessemer import thread_policy

thread_policy.apply()  # before anything loads the native module (libgomp reads it then)

__version__ = "0.1.0"

__all__ = ["LLM", "SamplingParams", "build_engine", "BessemerError", "__version__"]


def __getattr__(name):
    if name in ("LLM", "SamplingParams"):
        from bessemer.runtime import llm

        return getattr(llm, name)
    if name == "build_engine":
        from bessemer.builder.build import build_engine

        return build_engine
    if name == "BessemerError":
        from bessemer.errors import BessemerError

        return BessemerError
    raise AttributeError(name)
