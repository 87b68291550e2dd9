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
