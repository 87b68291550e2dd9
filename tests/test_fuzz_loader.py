"""The engine loader under a seeded mutation fuzzer (tests/fuzz_loader.py) for a bounded
time: every damaged rank file is refused cleanly or runs; no crash, hang or stray
exception. `BESSEMER_FUZZ_SECONDS` makes the run longer on demand."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow  # a fixed 15 s of fuzzing
def test_mutated_rank_files_are_refused_or_run_never_crash(tiny_engine, tmp_path):
    seconds = float(os.environ.get("BESSEMER_FUZZ_SECONDS", "15"))
    last = tmp_path / "last-case.txt"
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("fuzz_loader.py")),
                           str(tiny_engine("llama-untied")), "--seconds", str(seconds), "--seed", "7",
                           "--work", str(tmp_path), "--last", str(last)],
                          capture_output=True, text=True, timeout=seconds + 120)
    case = last.read_text().strip() if last.exists() else "?"
    assert proc.returncode in (0, 1), f"the loader crashed (exit {proc.returncode}) on: {case}\n{proc.stderr[-2000:]}"
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["findings"] == [], result["findings"][:5]
    assert result["executions"] >= 200 and result["refused"] > 0 and result["ran"] > 0, result
