"""build-engine MODEL_DIR --output ENGINE_DIR [options]: parse flags, call build_engine."""

from __future__ import annotations

import signal
from pathlib import Path

import click

from bessemer.cli.build_flags import QUANT_FLAGS, build_config, build_options
from bessemer.cli.common import Progress, fail, user_errors

OPTION_FLAGS = ("dtype", "max_seq_len", "max_batch_size", "max_num_tokens", "kv_block_size", "kv_cache_dtype",
                "tp_size", "target", "gpu_arch")


def _terminated(signum, frame):
    raise SystemExit("error: build-engine was terminated (SIGTERM); nothing was written, the previous "
                     "engine (if any) is unchanged")


def _load_yaml(path: str) -> dict:
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except yaml.YAMLError as e:
        fail(f"{path} is not valid YAML ({str(e).splitlines()[0]}); fix the file")
    if not isinstance(data, dict):
        fail(f"{path} must hold a mapping of build options (e.g. `dtype: bfloat16`)")
    known = set(OPTION_FLAGS) | set(QUANT_FLAGS) | {"output", "dump_ir", "workers", "tp"}
    options = {k.replace("-", "_"): v for k, v in data.items()}
    if "tp" in options:
        options["tp_size"] = options.pop("tp")
    unknown = sorted(set(options) - known)
    if unknown:
        fail(f"{path}: unknown option {unknown[0]!r}; known: {', '.join(sorted(known))}")
    return options


@click.command(name="build-engine", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("model_dir", type=click.Path(path_type=str))
@click.option("--output", "-o", type=click.Path(path_type=str), help="Engine directory to write.")
@build_options()
@click.option("--target", type=click.Choice(["cpu", "cuda"]),
              help="What the engine runs on: cpu, or cuda (NVIDIA GPUs; kernels compiled ahead of time here, "
                   "no GPU needed; needs pip install 'bessemer[cuda]'). [default: cpu]")
@click.option("--gpu-arch", type=click.Choice(["sm_90"]), help="--target cuda: the GPU to compile for. [default: sm_90]")
@click.option("--tp", "tp_size", type=int, help="Tensor-parallel ranks: one rank file each, run as that many processes. [default: 1]")
@click.option("--workers", type=int, help="Build this many ranks at once, each in its own process. [default: 1]")
@click.option("--zero-point", is_flag=True, default=None, help="Asymmetric 4-bit codes.")
@click.option("--exclude-modules", help="Comma-separated fnmatch patterns left unquantized. "
              "[default: model.embed_tokens]")
@click.option("--lm-head", type=click.Choice(["int8", "int4", "none"]),
              help="lm_head (and a table tied to the embedding) in any quant mode: int8 per channel, int4 "
                   "(symmetric, groups of 32), or none (build dtype). [default: int8]")
@click.option("--embedding", type=click.Choice(["none", "int8", "int4"]),
              help="An untied embedding table in any quant mode: none (build dtype), int8 per row or int4 "
                   "(symmetric, groups of 32), gathered row by row; saves size, not time. A table tied to "
                   "lm_head follows --lm-head. [default: none]")
@click.option("--bits-per-weight", type=float,
              help="w4a16 / w4a16-gptq: mixed precision within this budget (all matrices, lm_head included): "
                   "the linears whose quantization adds the most output error on the calibration text keep "
                   "more bits (int4 g64 / g32 / g32 asymmetric / int8); the build report lists what went where.")
@click.option("--calib-data", type=click.Path(path_type=str), help="Calibration text file, or `wikitext2` (AWQ, GPTQ, SmoothQuant, FP8).")
@click.option("--calib-samples", type=int, help="Calibration windows. [default: 64]")
@click.option("--calib-seq-len", type=int, help="Tokens per calibration window. [default: 512]")
@click.option("--smoothquant-alpha", type=float, help="w8a8-sq: migration strength alpha in [0, 1]. [default: 0.5]")
@click.option("--calib-backend", type=click.Choice(["auto", "native", "modelopt"]),
              help="w8a8-sq: activation statistics from nvidia-modelopt or our hooks. [default: auto = modelopt if installed]")
@click.option("--smoothquant-o-proj", "o_proj_smoothing", type=click.Choice(["none", "kernel"]),
              help="w8a8-sq: leave o_proj unsmoothed, or smooth it with a multiplier in the kernel. [default: none]")
@click.option("--act-order/--no-act-order", default=None,
              help="GPTQ: quantize columns by decreasing activation energy. [default: on for w4a16-gptq, off for fp8]")
@click.option("--fp8-rounding", type=click.Choice(["nearest", "gptq"]),
              help="fp8: E4M3 codes by round to nearest, or by GPTQ on the same per-channel grid. [default: gptq]")
@click.option("--fp8-activations", type=click.Choice(["dynamic", "static"]),
              help="fp8: activation scales per token in the kernel, or one calibrated scale per linear input. "
                   "[default: dynamic]")
@click.option("--fp8-act-group", type=click.Choice(["16", "32", "64", "128"]), default=None,
              help="fp8 dynamic: refine each token's scale by a power of two per group of this many input "
                   "columns. [default: one scale per token]")
@click.option("--fp8-smoothing-alpha", type=float,
              help="fp8: SmoothQuant migration of activation outliers into the weights, strength in [0, 1]. "
                   "[default: none]")
@click.option("--dump-ir", type=click.Path(path_type=str), help="Write the graph after each pass phase here.")
@click.option("--config", "config_file", type=click.Path(path_type=str), help="YAML file with the same options; flags win.")
@click.option("--quiet", "-q", is_flag=True, help="No progress output.")
@user_errors
def main(model_dir, output, dtype, target, gpu_arch, max_seq_len, max_batch_size, max_num_tokens, kv_block_size, kv_cache_dtype, tp_size,
         workers, quant, group_size, zero_point, exclude_modules, lm_head, embedding, bits_per_weight, calib_data, calib_samples,
         calib_seq_len, smoothquant_alpha, calib_backend, o_proj_smoothing, act_order, fp8_rounding, fp8_activations,
         fp8_act_group, fp8_smoothing_alpha, dump_ir, config_file, quiet):
    """Compile a HuggingFace checkpoint directory into a Bessemer engine."""
    # SIGTERM unwinds like an error: the build's cleanup removes its temp directory
    signal.signal(signal.SIGTERM, _terminated)
    from bessemer.builder.build import build_engine

    options = _load_yaml(config_file) if config_file else {}
    flags = dict(dtype=dtype, target=target, gpu_arch=gpu_arch, max_seq_len=max_seq_len, max_batch_size=max_batch_size,
                 max_num_tokens=max_num_tokens, kv_block_size=kv_block_size, kv_cache_dtype=kv_cache_dtype,
                 tp_size=tp_size, workers=workers, output=output, dump_ir=dump_ir,
                 quant=quant, group_size=group_size, zero_point=zero_point, act_order=act_order,
                 fp8_rounding=fp8_rounding, fp8_activations=fp8_activations, lm_head=lm_head,
                 embedding=embedding,
                 fp8_act_group=int(fp8_act_group) if fp8_act_group else None, fp8_smoothing_alpha=fp8_smoothing_alpha,
                 bits_per_weight=bits_per_weight,
                 calib_data=calib_data, calib_samples=calib_samples, calib_seq_len=calib_seq_len,
                 smoothquant_alpha=smoothquant_alpha, calib_backend=calib_backend, o_proj_smoothing=o_proj_smoothing,
                 exclude_modules=exclude_modules.split(",") if exclude_modules is not None else None)
    options.update({k: v for k, v in flags.items() if v is not None})
    output = options.pop("output", None)
    dump_ir = options.pop("dump_ir", None)
    workers = options.pop("workers", 1)
    if not output:
        fail("no output directory given; pass --output ENGINE_DIR")
    build = build_config(options)
    path = build_engine(model_dir, output, build, dump_ir=dump_ir, progress=Progress(quiet), workers=workers)
    click.echo(str(path))


if __name__ == "__main__":
    main()
