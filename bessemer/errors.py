"""The one exception type users see: a one-line message naming the problem and the fix."""


class BessemerError(Exception):
    """A user-facing error. The CLI prints `error: <message>` and exits non-zero."""


class UnsupportedModelError(BessemerError):
    pass


class InvalidOptionError(BessemerError):
    pass


class EngineLoadError(BessemerError):
    pass


class RequestError(BessemerError):
    """A request the engine cannot serve (e.g. a prompt longer than max_seq_len)."""


class TensorParallelError(BessemerError):
    """A rank of a tensor-parallel engine died, hung or failed; the engine is stopped."""


class DeviceError(BessemerError):
    """No usable GPU: no CUDA driver, no device, a driver too old, or a GPU of another
    architecture than the engine's."""
