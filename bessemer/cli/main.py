"""`bessemer` command group: build, run, eval, serve, inspect."""

from __future__ import annotations

import json

import click

from bessemer.cli import artifacts, build, evaluate, run, serve
from bessemer.cli.common import user_errors


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="bessemer")
def main():
    """Bessemer: ahead-of-time LLM engines for the CPU."""


main.add_command(build.main, name="build")
main.add_command(run.main, name="run")
main.add_command(evaluate.main, name="eval")
main.add_command(serve.main, name="serve")
main.add_command(artifacts.ci_build, name="ci-build")
main.add_command(artifacts.verify, name="verify")


@main.command()
@click.argument("engine_dir", type=click.Path(path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@user_errors
def inspect(engine_dir, as_json):
    """Show an engine's config, versions, sizes, plan and kernels."""
    from bessemer.runtime.inspect import describe, format_description

    info = describe(engine_dir)
    click.echo(json.dumps(info, indent=2) if as_json else format_description(info))


if __name__ == "__main__":
    main()
