"""What every command shares: one-line errors instead of tracebacks, progress on stderr."""

from __future__ import annotations

import functools
import sys
import time

import click

from bessemer.errors import BessemerError


def fail(message: str) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(1)


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
                     help="Longest suffix prompt lookup searches for."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def speculative_config(speculative: str | None, draft_engine: str | None, num_tokens: int,
                       ngram_max: int) -> dict | None:
    """The flags as LLM(speculative=...) takes them (validated there)."""
    if speculative is None and draft_engine is None:
        return None
    method = speculative or "draft"
    config = {"method": method, "num_tokens": num_tokens}
    if method == "ngram":
        config["ngram_max"] = ngram_max
    if draft_engine is not None:
        config["draft_engine"] = draft_engine
    return config
