"""What the random-weight checkpoints of bench/ share (make_shape_checkpoint.py: dense Llama
widths; make_moe_checkpoint.py: gpt-oss-20b / Qwen3-30B-A3B): drawing the tensors, writing
them one decoder layer per safetensors shard (so one layer is in memory at a time, and an 8B
or 20B checkpoint is made on a 24 GB machine), and caching the finished directory.

A tensor is (name, shape, kind): "bf16" drawn N(0, INIT_STD), "norm" ones, and MXFP4's
"codes" (uniform bytes) and "scales" (E8M0 of 2^-8, so random E2M1 codes span +-0.023 like a
0.02-std weight).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Callable

from bessemer.cache_root import cache_root

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")
INIT_STD = 0.02  # the configs' initializer_range
MXFP4_SCALE = 127 - 8  # E8M0 exponent bias 127: 2^-8


def tokenizer_source(tokenizer_dir: Path | None) -> Path:
    """The SmolLM2 checkpoint whose tokenizer (and so its 49152-token vocabulary) the random
    checkpoints use: the test fixture's files, no download."""
    d = tokenizer_dir or cache_root() / "smollm2-135m-instruct"
    if not (d / "tokenizer.json").exists():
        sys.exit(f"no SmolLM2 tokenizer in {d}; run `python -m bessemer.fixtures.smollm2` (it caches the fixture) "
                 "or pass --tokenizer-dir")
    return d


def _layer_of(name: str) -> int:
    parts = name.split(".")
    return int(parts[2]) if parts[:2] == ["model", "layers"] else -1


def _draw(kind: str, shape: tuple[int, ...], gen):
    import torch

    if kind == "norm":
        return torch.ones(shape, dtype=torch.bfloat16)
    if kind == "codes":
        return torch.randint(0, 256, shape, generator=gen, dtype=torch.uint8)
    if kind == "scales":
        return torch.full(shape, MXFP4_SCALE, dtype=torch.uint8)
    return (torch.randn(shape, generator=gen) * INIT_STD).to(torch.bfloat16)


def write_layer_shards(tensors: list[tuple[str, tuple[int, ...], str]], out: Path, seed: int) -> None:
    """One safetensors shard per decoder layer (and one for the rest), and HF's index."""
    import torch
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(seed)
    groups: dict[int, list] = {}
    for t in tensors:
        groups.setdefault(_layer_of(t[0]), []).append(t)
    weight_map, total = {}, len(groups)
    for i, (layer, group) in enumerate(sorted(groups.items()), 1):
        shard = {name: _draw(kind, shape, gen) for name, shape, kind in group}
        file = f"model-{i:05d}-of-{total:05d}.safetensors"
        save_file(shard, str(out / file), metadata={"format": "pt"})
        weight_map.update({n: file for n in shard})
        print(f"  layer {layer}: {len(shard)} tensors -> {file} ({i}/{total})", file=sys.stderr, flush=True)
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1))


def make_cached(out: Path, tokenizer_dir: Path, write: Callable[[Path], None], marker: dict) -> Path:
    """`out`, made once: write(tmp) writes weights and config.json into a temporary directory,
    the tokenizer files are copied beside them, and the directory is renamed when complete
    (an interrupted run leaves no checkpoint that looks finished)."""
    if (out / ".complete").exists():
        return out
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    write(tmp)
    for f in TOKENIZER_FILES:
        if (tokenizer_dir / f).exists():
            shutil.copy(tokenizer_dir / f, tmp / f)
    (tmp / ".complete").write_text(json.dumps(marker))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def main(doc: str, shapes, make: Callable[[str, int, Path | None], Path]) -> None:
    """The command line of a checkpoint script: --shape, --seed, --tokenizer-dir; prints the
    directory."""
    import argparse

    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--shape", choices=sorted(shapes), required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokenizer-dir", type=Path, help="SmolLM2 checkpoint whose tokenizer files are copied "
                                                      "(default: the test fixture in the cache root)")
    args = ap.parse_args()
    print(make(args.shape, args.seed, args.tokenizer_dir))
