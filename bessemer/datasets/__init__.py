"""Text that ships with Bessemer, reachable by name wherever a text file is asked for.

`--dataset wikitext2` (bessemer eval, engines.yaml perplexity gates) and `--calib-data wikitext2`
(calibrated quantization) name the WikiText-2 validation split in this package
(wikitext-2/README.md: source and CC BY-SA 3.0 license); `--dataset hamlet` names Shakespeare's
Hamlet (hamlet/README.md: public domain, transcription MIT), a second held-out text that no
calibration uses; `--dataset python-code` names a third, of another genre: a module of CPython's
standard library (python-code/README.md: PSF License); any other value is a file path.
"""

from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).resolve().parent

# name -> file in this package
BUILTIN_TEXTS = {"wikitext2": "wikitext-2/valid.txt", "hamlet": "hamlet/hamlet.txt",
                 "python-code": "python-code/dataclasses.py.txt"}


def text_path(name_or_path: str | Path, base: Path | None = None) -> Path:
    """The file a --dataset / --calib-data value names: a built-in text by name, else a path
    (relative to `base` when given). Existence is checked by the caller, which names its flag."""
    if isinstance(name_or_path, str) and name_or_path in BUILTIN_TEXTS:
        return _HERE / BUILTIN_TEXTS[name_or_path]
    path = Path(name_or_path)
    return base / path if base is not None else path


def wikitext2_valid() -> Path:
    """The WikiText-2 validation split (tests, benchmarks)."""
    return text_path("wikitext2")


def hamlet() -> Path:
    """Shakespeare's Hamlet: a held-out text of another register (tests, benchmarks)."""
    return text_path("hamlet")


def python_code() -> Path:
    """CPython 3.11.7's dataclasses.py: held-out source code, a third genre (tests, benchmarks)."""
    return text_path("python-code")
