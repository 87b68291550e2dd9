"""The build flags build-engine, run-engine and serve share, declared once, and the
BuildConfig they make.

run-engine and serve take MODEL_OR_ENGINE: a checkpoint (or hub id) is built into the
engine cache with these flags (builder/engine_cache.py); an engine directory takes none.
"""

from __future__ import annotations

import click

from bessemer.cli.common import fail

QUANT_FLAGS = ("quant", "group_size", "zero_point", "exclude_modules", "lm_head", "embedding", "act_order", "fp8_rounding",
               "fp8_activations", "fp8_act_group", "fp8_smoothing_alpha", "bits_per_weight",
               "calib_data", "calib_samples", "calib_seq_len", "smoothquant_alpha", "calib_backend", "o_proj_smoothing")

# name -> click.option; the parameter names are BuildConfig's / QuantConfig's
SHARED = {
    "dtype": click.option(
        "--dtype", type=click.Choice(["float32", "bfloat16", "float16"]),
        help="Weight (and KV cache) dtype; float16 is for --target cuda. [default: float32, cuda: bfloat16]"),
    "max_seq_len": click.option(
        "--max-seq-len", type=int, help="Longest prompt+output a request may have. [default: min(model, 4096)]"),
    "max_batch_size": click.option("--max-batch-size", type=int, help="Sequences per step. [default: 16]"),
    "max_num_tokens": click.option(
        "--max-num-tokens", type=int, help="Tokens per step; longer prompts are prefilled in chunks. [default: 2048]"),
    "kv_block_size": click.option("--kv-block-size", type=int, help="Tokens per paged KV-cache block. [default: 16]"),
    "kv_cache_dtype": click.option(
        "--kv-cache-dtype", type=click.Choice(["float32", "bfloat16", "int8", "fp8"]),
        help="KV cache storage; int8/fp8 (E4M3): one-byte codes with a dynamic scale per (token, KV head). "
             "[default: --dtype]"),
    "quant": click.option(
        "--quant", help="Quantization: w8a16 | w4a16 | w4a16-awq | w4a16-gptq | w4k | w4k-gptq | w4a8 | w8a8-sq | fp8. [default: none]"),
    "group_size": click.option("--group-size", type=int, help="Group size of 4-bit modes: 32 | 64 | 128. [default: 128]"),
}


def build_options(exclude: tuple[str, ...] = ()):
    """Declares the SHARED flags (less `exclude`, which the command declares its own way)."""
    def decorate(fn):
        for name, option in reversed(SHARED.items()):
            if name not in exclude:
                fn = option(fn)
        return fn

    return decorate


def model_options(exclude: tuple[str, ...] = ()):
    """build_options plus --engine-cache: for commands that take MODEL_OR_ENGINE."""
    def decorate(fn):
        fn = click.option("--engine-cache", type=click.Path(path_type=str), default=None,
                          help="Where engines built from checkpoints are kept and reused. "
                               "[default: $BESSEMER_CACHE/engines or ~/.cache/bessemer/engines]")(fn)
        return build_options(exclude)(fn)

    return decorate


def build_config(options: dict):
    """The BuildConfig of build and quant options (flag names as parameters; None: not
    given), or None when none is given: an engine directory then loads as it is."""
    from bessemer.builder.config import BuildConfig
    from bessemer.quantization.config import QuantConfig

    options = {k: v for k, v in options.items() if v is not None}
    if not options:
        return None
    quant_options = {k: options.pop(k) for k in QUANT_FLAGS if k in options}
    mode = quant_options.pop("quant", None)
    if quant_options and not mode:
        fail(f"--{next(iter(quant_options)).replace('_', '-')} needs --quant MODE")
    if "exclude_modules" in quant_options:
        quant_options["exclude_modules"] = tuple(p.strip() for p in quant_options["exclude_modules"] if p.strip())
    if options.get("target") == "cuda":
        options.setdefault("dtype", "bfloat16")  # the cuda kernels' activation dtype
    return BuildConfig(**options, quant=QuantConfig(mode, **quant_options) if mode else None)
