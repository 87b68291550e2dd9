"""Compiling a client's constraint where a crash hurts nobody: a helper process.

llguidance compiles a grammar in native code; a grammar built to exhaust it (a chain of tens
of thousands of rules) overflows the stack and the process dies with SIGSEGV, which no
Python `try` catches. So every new constraint is compiled first in this helper process, on
a thread whose stack is the size of the server's own compile thread; only one that compiles
here is compiled again in the server, on the same code path and the same stack, so it cannot
crash there. If the helper dies or hangs, the request gets a 400 and the next constraint
starts a fresh helper.

Wire format on the helper's stdin and stdout: a 4-byte little-endian length, then that many
bytes of UTF-8 JSON: requests {"grammar": str}, answers {"error": str} ("" when it compiles).
"""

from __future__ import annotations

import json
import os
import select
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

from bessemer.errors import RequestError

# The compile threads' stack (virtual: only the pages a compile touches are committed). At
# ~3 KB per nested rule it holds ~80,000 levels; ConstraintLimits.max_rules allows 10,000.
COMPILE_STACK_BYTES = 256 * 2**20


def run_on_big_stack(target, name: str) -> threading.Thread:
    """Starts `target` on a daemon thread with COMPILE_STACK_BYTES of stack."""
    previous = threading.stack_size(COMPILE_STACK_BYTES)
    try:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
    finally:
        threading.stack_size(previous)
    return thread


def load_tokenizer(llg, tokenizer_json: Path, vocab_size: int, eos_ids: set[int]):
    eos = min(eos_ids) if eos_ids else None
    return llg.LLTokenizer(tokenizer_json.read_text(), n_vocab=vocab_size, eos_token=eos)


def compile_matcher(llg, tokenizer, grammar: str, words: int):
    """(a fresh LLMatcher, "") or (None, the error): the grammar is built and its first mask
    computed, which finds a grammar that admits nothing (`root ::= root`, a schema that is
    only `{"$ref": "#"}`) before any token is generated. Needs a COMPILE_STACK_BYTES stack."""
    import numpy as np

    matcher = llg.LLMatcher(tokenizer, grammar, log_level=0)
    if not matcher.is_error():
        mask = np.empty(words, dtype=np.int32)
        matcher.unsafe_compute_mask_ptr(mask.ctypes.data, mask.nbytes)
    if matcher.is_error():
        error = first_line(matcher.get_error())
        # a bare stop reason ("NoExtensionBias"): the grammar matches no string at all
        return None, error if " " in error else f"it matches no output at all ({error})"
    matcher.reset()
    return matcher, ""


def first_line(error) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:300] if text else "unknown error"


# ---- the server's side ----
class GrammarWorker:
    """The helper process of one engine, started on first use; used from one thread."""

    def __init__(self, tokenizer_json: Path, vocab_size: int, eos_ids: set[int]):
        self._args = [str(tokenizer_json), str(vocab_size), ",".join(str(t) for t in sorted(eos_ids))]
        self._proc: subprocess.Popen | None = None

    def check(self, grammar: str, timeout_s: float) -> str:
        """The compile error of `grammar` in the helper ("" when it compiles). Raises
        RequestError when the helper crashed on it or ran past `timeout_s`."""
        proc = self._start()
        try:
            _send(proc.stdin, {"grammar": grammar})
            return _receive(proc.stdout, time.monotonic() + timeout_s)["error"]
        except TimeoutError:
            self.close()
            raise RequestError(f"the constraint took over {timeout_s:g} s to compile (--constraint-timeout); "
                               "send a simpler one") from None
        except (OSError, EOFError, ValueError):
            try:
                code = proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                code = None
            self.close()
            how = f"the compiler crashed on it (signal {-code})" if code is not None and code < 0 else \
                "the compiler failed on it"
            raise RequestError(f"the constraint cannot be compiled: {how}; it is too large or too deeply "
                               "nested, send a smaller one") from None

    def _start(self) -> subprocess.Popen:
        if self._proc is None or self._proc.poll() is not None:
            self._proc = subprocess.Popen([sys.executable, "-m", "bessemer.runtime.grammar_worker", *self._args],
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        return self._proc

    def close(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            for pipe in (self._proc.stdin, self._proc.stdout):
                pipe.close()
            self._proc = None


def _send(pipe, message: dict) -> None:
    data = json.dumps(message).encode()
    pipe.write(struct.pack("<I", len(data)) + data)
    pipe.flush()


def _receive(pipe, deadline: float) -> dict:
    """One message from `pipe`, or TimeoutError past `deadline`; EOFError when it closed."""
    fd, data, need = pipe.fileno(), b"", 4
    size = None
    while True:
        while len(data) < need:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
            chunk = os.read(fd, need - len(data))
            if not chunk:
                raise EOFError
            data += chunk
        if size is not None:
            return json.loads(data)
        size, data = struct.unpack("<I", data)[0], b""
        need = size


# ---- the helper's side ----
def _serve(tokenizer_json: str, vocab_size: int, eos_ids: set[int]) -> None:
    import llguidance as llg

    tokenizer = load_tokenizer(llg, Path(tokenizer_json), vocab_size, eos_ids)
    words = (vocab_size + 31) // 32
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while True:
        head = stdin.read(4)
        if len(head) < 4:  # the server closed the pipe (or exited): so does the helper
            return
        request = json.loads(stdin.read(struct.unpack("<I", head)[0]))
        try:
            _, error = compile_matcher(llg, tokenizer, request["grammar"], words)
        except Exception as e:  # noqa: BLE001 - any failure is the grammar's error, reported back
            error = first_line(e)
        _send(stdout, {"error": error})


def main(argv: list[str]) -> None:
    tokenizer_json, vocab_size, eos = argv
    eos_ids = {int(t) for t in eos.split(",") if t}
    run_on_big_stack(lambda: _serve(tokenizer_json, int(vocab_size), eos_ids), "bessemer-grammar-check").join()


if __name__ == "__main__":
    main(sys.argv[1:])
