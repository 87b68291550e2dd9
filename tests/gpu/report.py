"""The GPU check's summary table: every figure the issue asks for, its target, and whether
it was met (results.json has the details). In a CPU rehearsal a figure only a GPU can give
is shown as "no GPU" whatever its value (the fake driver computes nothing, its times are
host times), and comparisons run on the fake driver's output say "fake driver"."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _get(results: dict, path: str):
    node = results["stages"]
    for key in path.split("."):
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def _status(value, ok) -> str:
    if value is None:
        return "n/a"
    return "ok" if ok else "MISSED"


def _fmt(value, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def _cpu_status(results: dict, path: str) -> str | None:
    """In a rehearsal: why the figure at `path` means nothing on CPU (None: it was computed)."""
    if not results.get("rehearsal"):
        return None
    stage, _, rest = path.partition(".")
    if stage.startswith("correctness-"):
        if rest.startswith("graph_vs_eager"):
            return "no GPU (launches compared)"
        node = results["stages"].get(stage, {})
        return None if node.get("computed_by", "").startswith("triton") else "fake driver"
    return "no GPU"


def summary_table(results: dict) -> str:
    g = lambda path: _get(results, path)  # noqa: E731
    rows = []

    def add(metric: str, value: str, target: str, status: str, path: str) -> None:
        cpu = _cpu_status(results, path)
        if cpu and status != "n/a":
            status = f"{cpu}: {status}" if cpu.endswith("compared)") else cpu
        rows.append((metric, value, target, status))

    def row(metric: str, value, spec: str, target: str, ok, path: str) -> None:
        add(metric, _fmt(value, spec), target, _status(value, ok), path)

    for name in ("135m", "1b"):
        path = f"correctness-{name}.logits.ratio"
        ratio = g(path)
        row(f"{name}: logits err / HF bf16 err", ratio, ".3f", "<= 2", ratio is not None and ratio <= 2, path)
        for check, label in (("batch_vs_alone", "batch == alone"), ("prefix_cache", "prefix hit == miss")):
            path = f"correctness-{name}.{check}"
            node = g(path)
            value = None if node is None else ("identical" if node["identical"] else "within ties")
            add(f"{name}: {label}", value or "n/a", "same tokens", _status(value, node and node["pass"]), path)
        path = f"correctness-{name}.graph_vs_eager"
        node = g(path)
        value = None if node is None else ("bitwise" if node["pass"] else "differs")
        if node is not None and results.get("rehearsal"):
            value = "same launches" if node["pass"] else "different launches"
        add(f"{name}: graph == eager decode", value or "n/a", "bit for bit", _status(value, node and node["pass"]), path)
    path = "correctness-135m.no_torch_at_run_time"
    node = g(path)
    rows.append(("no torch/Triton at run time", "n/a" if node is None else node["output"], "4 []",
                 _status(node, node and node["pass"])))
    path = "decode-8b.generate_tok_s"
    tok_s = g(path)
    row("8B batch-1 decode tok/s", tok_s, ".1f", ">= 255", tok_s is not None and tok_s >= 255, path)
    per_token = g("decode-8b.bytes_per_token")
    row("8B bytes per token (GB)", None if per_token is None else per_token / 1e9, ".3f", "", True,
        "decode-8b.bytes_per_token")
    frac = g("decode-8b.hbm_fraction")
    row("8B % of 4.8 TB/s (generate)", None if frac is None else 100 * frac, ".1f", ">= 80",
        frac is not None and frac >= 0.8, "decode-8b.hbm_fraction")
    frac = g("decode-8b.hbm_fraction_executor")
    row("8B % of 4.8 TB/s (executor step)", None if frac is None else 100 * frac, ".1f", "", True,
        "decode-8b.hbm_fraction_executor")
    ms = g("decode-135m.generate_ms_per_token")
    row("135M decode ms/token (generate)", ms, ".3f", "<= 0.5", ms is not None and ms <= 0.5,
        "decode-135m.generate_ms_per_token")
    row("135M decode ms/step (executor)", g("decode-135m.executor_step_ms"), ".3f", "", True,
        "decode-135m.executor_step_ms")
    ratio = g("prefill-8b.ratio_to_torch_matmul")
    row("8B 2048-token prefill / torch.matmul rate", ratio, ".3f", ">= 0.70", ratio is not None and ratio >= 0.7,
        "prefill-8b.ratio_to_torch_matmul")
    for key, label, spec in (("engine_tflop_s", "8B prefill TFLOP/s (engine)", ".1f"),
                             ("torch_matmul_tflop_s", "8B GEMM TFLOP/s (torch.matmul)", ".1f"),
                             ("ttft_s", "8B TTFT 2048 tokens (s)", ".4f")):
        row(label, g(f"prefill-8b.{key}"), spec, "", True, f"prefill-8b.{key}")
    out = g("throughput-8b.output_tok_s")
    row("8B 128x(128->512) output tok/s", out, ".0f", "> 6612", out is not None and out > 6612,
        "throughput-8b.output_tok_s")
    for stage, label in (("hf-eager-8b", "8B vs HF eager bf16"), ("hf-compiled-8b", "8B vs HF static+compile"),
                         ("hf-compiled-1b", "1B vs HF static+compile (8B did not fit)")):
        speedup = g(f"{stage}.engine_speedup")
        if speedup is not None or stage != "hf-compiled-1b":
            row(label + " (x)", speedup, ".2f", "> 1", speedup is not None and speedup > 1, f"{stage}.engine_speedup")
    for stage, node in results["stages"].items():
        for key, word in (("error", "FAILED"), ("cut", "CUT"), ("skipped", "skipped")):
            if key in node:
                rows.append((f"stage {stage}", word, "", node[key][:70]))
    width = [max(len(str(r[i])) for r in rows + [("metric", "value", "target", "status")]) for i in range(4)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(("metric", "value", "target", "status"), width))]
    lines.append("  ".join("-" * w for w in width))
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(r, width)) for r in rows]
    title = ("GPU check REHEARSAL on CPU (tiny shapes; 'no GPU' and 'fake driver' figures mean nothing)"
             if results.get("rehearsal") else "GPU check")
    times = ", ".join(f"{stage} {node['seconds']:.0f}" for stage, node in results["stages"].items() if "seconds" in node)
    return f"{title}, {results.get('elapsed_s', 0):.0f}s\n" + "\n".join(lines) + f"\nstage seconds: {times}"


if __name__ == "__main__":  # the table of a results.json (check.sh, after a run was killed)
    results = json.loads(Path(sys.argv[1]).read_text())
    print(summary_table(results))
