"""The built-in held-out texts: python-code (the third genre of bench/quant.py) ships in the
package, is the file its README names, and shares nothing with the calibration text."""

from __future__ import annotations

import hashlib
import re
import sys
from pathlib import Path

from bessemer.datasets import BUILTIN_TEXTS, python_code, text_path, wikitext2_valid
from bessemer.runtime.evaluate import read_dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))


def test_python_code_is_the_file_its_readme_records():
    path = python_code()
    assert path == text_path("python-code") and "python-code" in BUILTIN_TEXTS
    # read from the package, no network: the same bytes on every machine
    readme = (path.parent / "README.md").read_text(encoding="utf-8")
    recorded = re.search(r"sha256 `([0-9a-f]{64})`", readme).group(1)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == recorded
    assert (path.parent / "LICENSE-PSF.txt").read_text().startswith("PYTHON SOFTWARE FOUNDATION LICENSE VERSION 2")
    text = read_dataset("python-code")
    assert text.startswith("import re\n") and "def dataclass(" in text
    # enough for the 8192 scored tokens (code: under 4 characters a token with SmolLM2's tokenizer)
    assert len(text) > 4 * 8192


def _long_lines(text: str) -> set[str]:
    return {ln.strip() for ln in text.splitlines() if len(ln.strip()) >= 40}


def test_python_code_is_not_in_the_calibration_text(tmp_path):
    import quant  # bench/quant.py

    calib = quant.calib_text(tmp_path).read_text(encoding="utf-8")  # what its calibrated modes read
    code = read_dataset("python-code")
    assert calib and code
    # no line of the code (40+ characters) occurs in any calibration text shipped with Bessemer
    for text in (calib, wikitext2_valid().read_text(encoding="utf-8")):
        assert not [ln for ln in _long_lines(code) if ln in text]
    # the test can fail: lines of the calibration text itself are found in it
    assert [ln for ln in list(_long_lines(calib))[:20] if ln in calib]
