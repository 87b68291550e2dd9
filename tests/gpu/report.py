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
    if rest == "kv_capacity_tokens":  # the budget over the engine's bytes per token: no GPU needed
        return None
    return "no GPU"


class _Rows:
    """The table's rows: (metric, value, target, status), statuses marked for a rehearsal."""

    def __init__(self, results: dict):
        self.results, self.rows = results, []

    def add(self, metric: str, value: str, target: str, status: str, path: str) -> None:
        cpu = _cpu_status(self.results, path)
        if cpu and status != "n/a":
            status = f"{cpu}: {status}" if cpu.endswith("compared)") else cpu
        self.rows.append((metric, value, target, status))

    def row(self, metric: str, value, spec: str, target: str, ok, path: str) -> None:
        self.add(metric, _fmt(value, spec), target, _status(value, ok), path)

    def render(self, title: str) -> str:
        """The rows, one per stage that did not complete, the title and the stage times."""
        results, rows = self.results, list(self.rows)
        for stage, node in results["stages"].items():
            for key, word in (("error", "FAILED"), ("cut", "CUT"), ("skipped", "skipped")):
                if key in node:
                    rows.append((f"stage {stage}", word, "", node[key][:70]))
            if node.get("pass") is False:  # ran, and a comparison does not hold: its engine is not timed
                rows.append((f"stage {stage}", "FAILED", "", f"does not hold: {', '.join(node.get('failed_checks', []))}"))
        width = [max(len(str(r[i])) for r in rows + [("metric", "value", "target", "status")]) for i in range(4)]
        lines = ["  ".join(str(c).ljust(w) for c, w in zip(("metric", "value", "target", "status"), width))]
        lines.append("  ".join("-" * w for w in width))
        lines += ["  ".join(str(c).ljust(w) for c, w in zip(r, width)) for r in rows]
        if results.get("rehearsal"):
            title += " REHEARSAL on CPU (tiny shapes; 'no GPU' and 'fake driver' figures mean nothing)"
        times = ", ".join(f"{stage} {node['seconds']:.0f}" for stage, node in results["stages"].items()
                          if "seconds" in node)
        return f"{title}, {results.get('elapsed_s', 0):.0f}s\n" + "\n".join(lines) + f"\nstage seconds: {times}"


def peak_label(results: dict) -> str:
    """The peak every percentage is of ("H100 SXM HBM 3.35 TB/s"), from the environment stage."""
    return results.get("peaks", {}).get("label", "device peak (environment did not complete)")


def logits_row(table: "_Rows", results: dict, engine: str, reference: str) -> None:
    path = f"correctness-{engine}.logits"
    node = _get(results, path)
    node = node or {}
    bound = node.get("bound", "<= 2 x HF bf16's error").replace(" x HF bf16's error", "")
    table.row(f"{engine}: logits err / {reference} bf16 err", node.get("ratio"), ".3f", bound,
              node.get("pass") is not False, path + ".ratio")


def summary_table(results: dict) -> str:
    g = lambda path: _get(results, path)  # noqa: E731
    table = _Rows(results)
    add, row = table.add, table.row
    peak = peak_label(results)

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
    logits_row(table, results, "8b", "HF")
    path = "correctness-135m.no_torch_at_run_time"
    node = g(path)
    table.rows.append(("no torch/Triton at run time", "n/a" if node is None else node["output"], "4 []",
                 _status(node, node and node["pass"])))
    path = "decode-8b.generate_tok_s"
    tok_s = g(path)
    row("8B batch-1 decode tok/s", tok_s, ".1f", ">= 255", tok_s is not None and tok_s >= 255, path)
    per_token = g("decode-8b.bytes_per_token")
    row("8B bytes per token (GB)", None if per_token is None else per_token / 1e9, ".3f", "", True,
        "decode-8b.bytes_per_token")
    frac = g("decode-8b.hbm_fraction")
    row(f"8B % of {peak} (generate)", None if frac is None else 100 * frac, ".1f", ">= 80",
        frac is not None and frac >= 0.8, "decode-8b.hbm_fraction")
    frac = g("decode-8b.hbm_fraction_executor")
    row(f"8B % of {peak} (executor step)", None if frac is None else 100 * frac, ".1f", "", True,
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
    frac = g("prefill-8b.engine_peak_fraction")
    row(f"8B prefill % of {g('prefill-8b.engine_peak_fraction_of') or 'the dense bf16 peak'}",
        None if frac is None else 100 * frac, ".1f", "", True, "prefill-8b.engine_peak_fraction")
    out = g("throughput-8b.output_tok_s")
    row("8B 128x(128->512) output tok/s", out, ".0f", "> 6612", out is not None and out > 6612,
        "throughput-8b.output_tok_s")
    for stage, label in (("hf-eager-8b", "8B vs HF eager bf16"), ("hf-compiled-8b", "8B vs HF static+compile"),
                         ("hf-compiled-1b", "1B vs HF static+compile (8B did not fit)")):
        speedup = g(f"{stage}.engine_speedup")
        if speedup is not None or stage != "hf-compiled-1b":
            row(label + " (x)", speedup, ".2f", "> 1", speedup is not None and speedup > 1, f"{stage}.engine_speedup")
    return table.render("GPU check")


# issue 22's targets on the H200 (8B shape): % of HBM bandwidth on the bytes read per token
INT4_HBM_FRACTION, FP8_HBM_FRACTION, FP8_PREFILL_VS_BF16, INT4_VS_BF16_DECODE = 0.60, 0.70, 1.6, 2.5


def quant_summary_table(results: dict) -> str:
    """--suite quant: the quantized engines' figures against issue 22's targets."""
    g = lambda path: _get(results, path)  # noqa: E731
    table = _Rows(results)
    peak = peak_label(results)
    for engine in ("8b-w4a16", "8b-fp8", "8b-fp8-kvfp8", "8b-w4k"):
        logits_row(table, results, engine, "fake-quantized HF")
    logits_row(table, results, "8b", "HF")
    # w4k's own figures have no target (None: reported); its ratio to int4 g128's is below
    for name, label, frac_target, tok_target in (("8b-w4a16", "int4 g128", INT4_HBM_FRACTION, 640),
                                                 ("8b-fp8", "fp8", FP8_HBM_FRACTION, 420),
                                                 ("8b-w4k", "w4k", None, None)):
        tok_s = g(f"decode-{name}.generate_tok_s")
        table.row(f"8B {label} batch-1 decode tok/s", tok_s, ".1f",
                  "report" if tok_target is None else f">= {tok_target}",
                  tok_s is not None and (tok_target is None or tok_s >= tok_target), f"decode-{name}.generate_tok_s")
        per_token = g(f"decode-{name}.bytes_per_token")
        table.add(f"8B {label} bytes per token", "n/a" if per_token is None else f"{per_token / 1e9:.2f} GB", "",
                  "n/a" if per_token is None else "ok", f"decode-{name}.bytes_per_token")
        frac = g(f"decode-{name}.hbm_fraction")
        table.row(f"8B {label} % of {peak}", None if frac is None else 100 * frac, ".1f",
                  "report" if frac_target is None else f">= {100 * frac_target:.0f}",
                  frac is not None and (frac_target is None or frac >= frac_target), f"decode-{name}.hbm_fraction")
    # issue 39 asks w4k's decode to be no slower than w4a16 g32's (4 + 16/32 bits a linear
    # weight); the suite's int4 engine is g128 (4 + 16/128), whose linears are 11% smaller
    # than w4k's (4 + 16/32 + 32/256): the ratio is reported, not judged, and each engine's %
    # of the HBM peak above tells the bytes read apart from the kernel's use of the bandwidth
    w4k, w4a16 = g("decode-8b-w4k.generate_tok_s"), g("decode-8b-w4a16.generate_tok_s")
    table.row("8B w4k / int4 g128 batch-1 decode tok/s (x)", w4k / w4a16 if w4k and w4a16 else None, ".2f",
              "report (issue 39: >= 1 vs g32)", True, "decode-8b-w4k.generate_tok_s")
    ratio = g("prefill-8b-fp8.ratio_to_torch_matmul")
    table.row("8B fp8 2048-token prefill GEMMs / bf16 torch.matmul (x)", ratio, ".2f", f">= {FP8_PREFILL_VS_BF16}",
              ratio is not None and ratio >= FP8_PREFILL_VS_BF16, "prefill-8b-fp8.ratio_to_torch_matmul")
    frac = g("prefill-8b-fp8.engine_peak_fraction")
    table.row(f"8B fp8 prefill % of {g('prefill-8b-fp8.engine_peak_fraction_of') or 'the dense fp8 peak'}",
              None if frac is None else 100 * frac, ".1f", "", True, "prefill-8b-fp8.engine_peak_fraction")
    ratios = g("decode-batches-8b.ratio.8b-w4a16") or {}
    ends = None
    for batch, r in sorted(ratios.items(), key=lambda kv: int(kv[0])):
        table.row(f"8B int4 / bf16 decode, batch {batch} (x)", r, ".2f",
                  f">= {INT4_VS_BF16_DECODE}" if int(batch) <= 8 else "report",
                  r >= INT4_VS_BF16_DECODE or int(batch) > 8, f"decode-batches-8b.ratio.8b-w4a16.{batch}")
        if ends is None and r < INT4_VS_BF16_DECODE:
            ends = int(batch)
    if ratios:
        table.add(f"8B int4 >= {INT4_VS_BF16_DECODE}x bf16 up to batch", "all measured" if ends is None else
                  f"below from batch {ends}", "", "ok", "decode-batches-8b.ratio")
    kv8, kv16 = g("throughput-8b-fp8-kvfp8.kv_capacity_tokens"), g("throughput-8b-fp8.kv_capacity_tokens")
    cap = kv8 / kv16 if kv8 and kv16 else None
    b8, b16 = g("throughput-8b-fp8-kvfp8.kv_bytes_per_token"), g("throughput-8b-fp8.kv_bytes_per_token")
    ideal = b16 / b8 if b8 and b16 else None  # 2 D / (D + 4): the codes' byte, plus a 4-byte scale per row
    table.row("fp8 KV: cache tokens in the same GiB vs bf16 KV (x)", cap, ".2f",
              "n/a" if ideal is None else f"{ideal:.2f} (2D/(D+4))",
              cap is not None and ideal is not None and cap >= 0.99 * ideal, "throughput-8b-fp8-kvfp8.kv_capacity_tokens")
    t8, t16 = g("throughput-8b-fp8-kvfp8.output_tok_s"), g("throughput-8b-fp8.output_tok_s")
    speed = t8 / t16 if t8 and t16 else None
    table.row("fp8 KV: 128x(1024->512) output tok/s vs bf16 KV (x)", speed, ".2f", "report", True,
              "throughput-8b-fp8-kvfp8.output_tok_s")
    return table.render("GPU check, quantized engines")


if __name__ == "__main__":  # the table of a results.json (check.sh, after a run was killed)
    results = json.loads(Path(sys.argv[1]).read_text())
    print((quant_summary_table if results.get("suite") == "quant" else summary_table)(results))
