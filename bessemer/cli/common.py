"""What every command shares: one-line errors instead of tracebacks, progress on stderr."""

from __future__ import annotations

import functools
import sys
import time
from pathlib import Path

import click

from bessemer.errors import BessemerError

# The most a text input of a command (prompts, a grammar, a schema) may hold: it is read
# whole, so /dev/zero or a wrong multi-GB file is refused at once instead of read forever.
MAX_TEXT_FILE_MIB = 16


def error(message: str) -> None:
    """One `error: ...` line on stderr (fail() also exits)."""
    click.echo(f"error: {message}", err=True)


def fail(message: str) -> None:
    error(message)
    sys.exit(1)


def read_text_file(value: str, flag: str) -> str:
    """The UTF-8 text of the file given to `flag`, at most MAX_TEXT_FILE_MIB; any other
    file is refused with one line naming the fix."""
    path = Path(value)
    if not path.exists():
        fail(f"{flag} {path} does not exist; pass a UTF-8 text file")
    if path.is_dir():
        fail(f"{flag} {path} is a directory; pass a UTF-8 text file")
    limit = MAX_TEXT_FILE_MIB << 20
    with open(path, "rb") as f:  # a pipe or device as well as a file, but never more than the limit
        data = f.read(limit + 1)
    if len(data) > limit:
        fail(f"{flag} {path} holds more than {MAX_TEXT_FILE_MIB} MiB (the limit for text inputs); "
             "pass a smaller UTF-8 text file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        fail(f"{flag} {path} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}); "
             "pass a UTF-8 text file")


def user_errors(fn):
    """Turns library errors into `error: ...` and exit 1 (click itself exits 2 on bad flags)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except BessemerError as e:
            fail(str(e))
        except KeyboardInterrupt:
            fail("interrupted")
        except OSError as e:
            fail(f"{e.strerror or e}: {e.filename or ''}".rstrip(": "))

    return wrapper


class Progress:
    """Prints timestamped progress lines to stderr (stdout stays for results)."""

    def __init__(self, quiet: bool = False):
        self.quiet = quiet
        self.t0 = time.perf_counter()

    def __call__(self, message: str) -> None:
        if not self.quiet:
            click.echo(f"[{time.perf_counter() - self.t0:6.1f}s] {message}", err=True)


def speculative_options(fn):
    """--speculative, --draft-engine, --num-speculative-tokens, --ngram-max (run-engine, serve)."""
    options = [
        click.option("--speculative", type=click.Choice(["ngram", "draft"]), default=None,
                     help="Speculative decoding: prompt lookup (ngram) or a draft engine (draft)."),
        click.option("--draft-engine", type=click.Path(path_type=str), default=None,
                     help="Draft engine directory (same tokenizer); implies --speculative draft."),
        click.option("--num-speculative-tokens", type=int, default=4, show_default=True,
                     help="Draft tokens verified per step."),
        click.option("--ngram-max", type=int, default=4, show_default=True,
                     help="Longest suffix prompt lookup searches for (1..64)."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def speculative_config(speculative: str | None, draft_engine: str | None, num_tokens: int,
                       ngram_max: int) -> dict | None:
    """The flags as RunOptions(speculative=...) takes them (validated when the engine loads)."""
    if speculative is None and draft_engine is None:
        return None
    method = speculative or "draft"
    config = {"method": method, "num_tokens": num_tokens}
    if method == "ngram":
        config["ngram_max"] = ngram_max
    if draft_engine is not None:
        config["draft_engine"] = draft_engine
    return config


def gpu_options(fn):
    """The options of commands that load an engine, for cuda engines: --device,
    --gpu-memory-utilization, --enforce-eager (the command receives them as parameters;
    gpu_kwargs turns them into RunOptions arguments)."""
    for option in reversed([
        click.option("--device", type=int, default=None,
                     help="cuda engines: the GPU to run on (an ordinal within CUDA_VISIBLE_DEVICES). [default: 0]"),
        click.option("--gpu-memory-utilization", type=float, default=None,
                     help="cuda engines: fraction of the GPU's memory this engine may use in all; the KV cache "
                          "gets what the weights and activations leave. [default: 0.9]"),
        click.option("--enforce-eager", is_flag=True, help="cuda engines: no CUDA graphs (every step launched)."),
    ]):
        fn = option(fn)
    return fn


def gpu_kwargs(device, gpu_memory_utilization, enforce_eager) -> dict:
    """RunOptions keyword arguments for the options of gpu_options that were given."""
    given = {"device": device, "gpu_memory_utilization": gpu_memory_utilization,
             "enforce_eager": enforce_eager or None}
    return {k: v for k, v in given.items() if v is not None}
