"""What `bessemer inspect` shows: read from config.json and the rank headers only."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from bessemer.errors import EngineLoadError
from bessemer.quantization.bits import bits_per_weight, format_bits
from bessemer.runtime.engine import Engine

# config.json keys every engine has; any other top-level key is a field of its target
# (targets/<name>: Target.header_fields, e.g. the cpu target's isa_baseline)
COMMON_KEYS = ("bessemer_format", "bessemer_version", "target", "model", "build", "quant", "mapping",
               "plugins", "passes", "ranks", "tokenizer_files")


def _rank_row(entry: dict, major: int, minor: int, header: dict) -> dict:
    plan = header["plan"]
    steps = plan["forward"] if header.get("target") == "cuda" else plan["steps"]
    return {
        "file": entry["file"], "size_bytes": entry["size"], "sha256": entry["sha256"],
        "format": f"{major}.{minor}", "num_tensors": len(header["tensors"]),
        "num_kernel_calls": len(steps), "num_buffers": len(plan["buffers"]),
        "kernel_calls": dict(Counter(f"{s['op']}@{s.get('version', 1)}" for s in steps)),
        "activation_floats_per_token": sum(b["width"] for b in plan["buffers"]),
        **({"compiled_kernels": [_kernel_row(k) for k in header["kernels"]],
            "gemms": _gemm_rows(plan["forward"], header["kernels"])} if "kernels" in header else {}),
    }


def describe(engine_dir: str | Path) -> dict:
    d = Path(engine_dir)
    config = Engine.read_config(d)
    ranks, tables = [], []
    for rank, entry in enumerate(config["ranks"]):
        # what the loader checks (present, size, sha256, header format): a damaged engine is
        # reported as damaged, not described as if it were fine
        engine = Engine.load(d, rank=rank)
        try:
            ranks.append(_rank_row(entry, *engine.file_format, engine.header))
            tables.append([(t["name"], tuple(t["shape"]), t["nbytes"]) for t in engine.header["tensors"]])
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise EngineLoadError(f"rank file {d / entry['file']} has a malformed header ({type(e).__name__}: {e}); "
                                  "rebuild the engine") from None
    report = d / "build_report.json"
    quant_error = {}
    if report.exists():
        import json

        quant_error = json.loads(report.read_text()).get("quant_error") or {}
    # the loader checked what it runs on; these fields only describe the engine
    return {"quant_error": quant_error, "bits_per_weight": bits_per_weight(tables), "engine": str(d), "format": config["bessemer_format"], "bessemer_version": config.get("bessemer_version"),
            "target": config["target"],
            "target_fields": {k: v for k, v in sorted(config.items()) if k not in COMMON_KEYS},
            "model": config["model"], "build": config["build"], "quant": config.get("quant"),
            "mapping": config["mapping"], "plugins": config.get("plugins") or [], "passes": config.get("passes") or [],
            "ranks": ranks, "build_report": str(report) if report.exists() else None}


def format_description(info: dict) -> str:
    try:
        return _format_description(info)
    except (KeyError, TypeError, AttributeError, ValueError) as e:  # a field of config.json missing or mistyped
        raise EngineLoadError(f"{info['engine']}/config.json has a malformed field ({type(e).__name__}: {e}); "
                              "the engine's config.json is damaged, rebuild the engine") from None


def _format_description(info: dict) -> str:
    m, b = info["model"], info["build"]
    lines = [
        f"engine        {info['engine']}",
        f"format        {info['format']['major']}.{info['format']['minor']} (bessemer {info['bessemer_version']})",
        f"target        {info['target']}" + "".join(f", {k} {v}" for k, v in info["target_fields"].items()),
        f"model         {m['architecture']}: {m['num_hidden_layers']} layers, hidden {m['hidden_size']}, "
        f"heads {m['num_attention_heads']}/{m['num_key_value_heads']} x {m['head_dim']}, vocab {m['vocab_size']}, "
        f"rope {m['rope_parameters'].get('rope_type')}, tied embeddings {m['tie_word_embeddings']}",
        f"build         dtype {b['dtype']}, kv cache {b['kv_cache_dtype'] or b['dtype']}, max_seq_len {b['max_seq_len']}, "
        f"max_batch_size {b['max_batch_size']}, max_num_tokens {b['max_num_tokens']}, kv_block_size {b['kv_block_size']}",
        f"quantization  {info['quant'] or 'none'}",
        f"weights       {format_bits(info['bits_per_weight'])}",
        *_quant_error_lines(info["quant_error"]),
        f"mapping       tp {info['mapping']['tp_size']}, pp {info['mapping']['pp_size']}",
        f"passes        {', '.join(info['passes']) or 'none'}",
        f"plugins       {', '.join(info['plugins'])}",
    ]
    for r in info["ranks"]:
        lines.append(f"rank file     {r['file']}: {r['size_bytes'] / 2**20:.1f} MiB, format {r['format']}, "
                     f"{r['num_tensors']} tensors, {r['num_kernel_calls']} kernel calls, {r['num_buffers']} buffers")
        lines.append("  kernels     " + ", ".join(f"{k} x{v}" for k, v in sorted(r["kernel_calls"].items())))
        lines.append(f"  sha256      {r['sha256']}")
        lines += _kernel_lines(r.get("compiled_kernels") or [])
        lines += _gemm_lines(r.get("gemms") or [])
    return "\n".join(lines)


def _kernel_row(k: dict) -> dict:
    """One compiled kernel of a cuda engine, as inspect shows it."""
    shape = {n: v for n, v in k["constexprs"].items() if n in ("N", "K", "BLOCK_M", "HEAD_DIM", "SLIDING_WINDOW", "V")}
    return {"id": k["id"], "function": k["function"], "shape": shape, "arch": k["arch"],
            "registers": k["ptxas"]["registers"], "shared_bytes": k["shared"], "num_warps": k["num_warps"],
            "spill_bytes": k["ptxas"]["spill_store_bytes"] + k["ptxas"]["spill_load_bytes"],
            "tensor_cores": ",".join(f"{op} x{n}" for op, n in sorted(k["tensor_core_ops"].items())) or "-",
            "cubin_bytes": k["cubin_bytes"]}


def _kernel_lines(kernels: list[dict]) -> list[str]:
    if not kernels:
        return []
    lines = [f"  compiled    {len(kernels)} kernels (id function [shape] arch regs shared warps spills tensor-cores)"]
    for k in kernels:
        shape = ",".join(f"{n}={v}" for n, v in k["shape"].items())
        lines.append(f"    {k['id']:3d} {k['function']:32s} [{shape}] {k['arch']} {k['registers']:3d} regs "
                     f"{k['shared_bytes'] / 1024:6.1f} KiB {k['num_warps']:2d} warps spills {k['spill_bytes']} "
                     f"{k['tensor_cores']}")
    return lines


def _programs(grid: list, rows: int) -> int:
    """Programs a launch grid (plan.py: an int or {count, per, times} per dimension) starts
    for a step of `rows` rows."""
    total = 1
    for g in grid:
        total *= g if isinstance(g, int) else -(-rows // g["per"]) * g["times"]
    return total


def _gemm_rows(forward: list, kernels: list) -> list[dict]:
    """The lowering's choices per distinct linear GEMM of a cuda plan (function, N, K): how
    many linears share it and, per bucket of the step's rows, the tile, warps, stages, parts
    of K and programs along K (split-K), and the programs launched for the bucket's most rows
    (the last, open bucket: per BLOCK_M rows)."""
    rows: dict[tuple, dict] = {}
    for item in forward:
        if item["op"] != "linear" or "cases" not in item:
            continue
        first = kernels[item["cases"][0]["kernel"]]
        c = first["constexprs"]
        key = (first["function"], c["N"], c["K"])
        if key in rows:
            rows[key]["linears"] += 1
            continue
        buckets = []
        for case in item["cases"]:
            k = kernels[case["kernel"]]
            e = k["constexprs"]
            most = case["max_rows"] or e["BLOCK_M"]
            buckets.append({"max_rows": case["max_rows"], "tile": [e["BLOCK_M"], e["BLOCK_N"], e["BLOCK_K"]],
                            "num_warps": k["options"]["num_warps"], "num_stages": k["options"]["num_stages"],
                            "k_parts": e.get("K_PARTS", 1), "split_k": e.get("SPLIT_K", 1),
                            "programs": _programs(case["grid"], most), "at_rows": most})
        rows[key] = {"function": key[0], "N": key[1], "K": key[2], "linears": 1, "first": item["node"],
                     "buckets": buckets}
    return list(rows.values())


def _gemm_lines(gemms: list[dict]) -> list[str]:
    if not gemms:
        return []
    lines = [f"  gemms       {len(gemms)} linear shapes (function N x K, linears, K parts; per bucket of rows: "
             "tile M x N x K, warps/stages, programs along K, programs at its most rows)"]
    for g in gemms:
        buckets = "; ".join(
            f"{'<=' + str(b['max_rows']) if b['max_rows'] else 'more'}: {'x'.join(map(str, b['tile']))} "
            f"{b['num_warps']}w/{b['num_stages']}s split {b['split_k']}, {b['programs']} programs at {b['at_rows']}"
            for b in g["buckets"])
        lines.append(f"    {g['function']:16s} {g['N']:6d} x {g['K']:<6d} x{g['linears']:<3d} "
                     f"K parts {g['buckets'][0]['k_parts']:2d} | {buckets}  ({g['first']})")
    return lines


def _quant_error_lines(quant_error: dict) -> list[str]:
    """Per-tensor SQNR of the quantized weights (from build_report.json), worst first."""
    if not quant_error:
        return []
    ranked = sorted(quant_error.items(), key=lambda kv: kv[1]["sqnr_db"])
    values = [v["sqnr_db"] for _, v in ranked]
    lines = [f"quant error   {len(values)} tensors, SQNR min {values[0]:.1f} dB, "
             f"mean {sum(values) / len(values):.1f} dB, max {values[-1]:.1f} dB"]
    lines += [f"  {name:52s} {v['sqnr_db']:6.2f} dB" for name, v in ranked]
    return lines
