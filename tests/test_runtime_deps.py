"""The runtime must run an engine without torch or transformers (DEVELOPERS.md)."""

import subprocess
import sys


def test_generation_imports_neither_torch_nor_transformers(smollm2_engine):
    code = (
        "import sys\n"
        "from bessemer import LLM, SamplingParams\n"
        f"out = LLM({str(smollm2_engine('bfloat16'))!r}, num_threads=2).generate(['Hi'], SamplingParams(max_tokens=3))\n"
        "assert len(out[0].token_ids) == 3\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
