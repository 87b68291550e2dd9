"""`bessemer` command group: build, run, eval, serve, bench, inspect, diff."""

from __future__ import annotations

import json

import click

from bessemer.cli import artifacts, bench, build, evaluate, run, serve
from bessemer.cli.common import Progress, fail, user_errors


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="bessemer")
def main():
    """Bessemer: ahead-of-time LLM engines for the CPU."""


main.add_command(build.main, name="build")
main.add_command(run.main, name="run")
main.add_command(evaluate.main, name="eval")
main.add_command(serve.main, name="serve")
main.add_command(bench.main, name="bench")
main.add_command(artifacts.ci_build, name="ci-build")
main.add_command(artifacts.verify, name="verify")


@main.command()
@click.argument("engine_dir", type=click.Path(path_type=str), required=False)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--device", "show_device", is_flag=True,
              help="Show the GPUs the CUDA driver sees (name, compute capability, memory), through the "
                   "cuda executor's own driver handle.")
@user_errors
def inspect(engine_dir, as_json, show_device):
    """Show an engine's config, versions, sizes, plan and kernels (and/or the GPUs: --device)."""
    from bessemer.errors import InvalidOptionError

    if engine_dir is None and not show_device:
        raise InvalidOptionError("give an ENGINE_DIR to inspect, or --device to show the GPUs")
    info = {}
    if engine_dir is not None:
        from bessemer.runtime.inspect import describe

        info = describe(engine_dir)
    if show_device:
        from bessemer.targets.cuda.device import device_report

        info["device"] = device_report()
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    text = []
    if engine_dir is not None:
        from bessemer.runtime.inspect import format_description

        text.append(format_description(info))
    if show_device:
        from bessemer.targets.cuda.device import format_device_report

        text.append(format_device_report(info["device"]))
    click.echo("\n".join(text))


@main.command()
@click.argument("engine_dir", type=click.Path(path_type=str))
@click.option("--reference", "model_dir", required=True, type=click.Path(path_type=str),
              help="The HF checkpoint directory to compare with (run by transformers).")
@click.option("--prompt", help="Text to run (tokenized by the engine's tokenizer).")
@click.option("--ids", help="Token ids to run instead, comma-separated.")
@click.option("--rtol", type=float, help="Per-node max|err| / max|HF| allowed. [default: 1e-4 fp32, 3e-2 bf16, 0.1 quantized]")
@click.option("--quiet", "-q", is_flag=True, help="No progress lines.")
@user_errors
def diff(engine_dir, model_dir, prompt, ids, rtol, quiet):
    """Every node of ENGINE_DIR against HF transformers on the same tokens; the first node
    over tolerance is where they diverge (exit 1 then)."""
    from pathlib import Path

    from bessemer.artifacts.diff import diff_engine, format_diff

    if (prompt is None) == (ids is None):
        fail("pass exactly one of --prompt TEXT or --ids 1,2,3")
    if ids is not None:
        try:
            tokens = [int(t) for t in ids.split(",") if t.strip()]
        except ValueError:
            fail(f"--ids must be comma-separated integers, got {ids!r}")
    else:
        from bessemer.runtime.tokenizer import Tokenizer

        tokens = Tokenizer(Path(engine_dir)).encode(prompt)
    if not tokens:
        fail("the prompt has no tokens")
    rows, tol = diff_engine(engine_dir, model_dir, tokens, rtol, Progress(quiet))
    click.echo(format_diff(rows, tol))
    if not all(r.ok for r in rows):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
