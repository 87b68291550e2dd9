"""bessemer ci-build engines.yaml --out DIR, and bessemer verify DIR: parse flags, call the library."""

from __future__ import annotations

import click

from bessemer.cli.common import Progress, fail, user_errors


@click.command(name="ci-build", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("spec_file", type=click.Path(path_type=str))
@click.option("--out", required=True, type=click.Path(path_type=str), help="Output dir: <name>/ per engine + manifest.json.")
@click.option("--only", multiple=True, help="Build only this engine (repeatable).")
@click.option("--force", is_flag=True, help="Rebuild even when the inputs are unchanged.")
@click.option("--threads", type=int, default=None, help="Threads for the engine and HF while validating.")
@click.option("--quiet", "-q", is_flag=True, help="No progress output.")
@user_errors
def ci_build(spec_file, out, only, force, threads, quiet):
    """Build, validate against HF and publish every engine of an engines.yaml (schema: bessemer/artifacts/spec.py)."""
    from bessemer.artifacts.runner import ci_build as run, format_summary
    from bessemer.artifacts.spec import load_spec

    spec = load_spec(spec_file)
    names = [e.name for e in spec.select(only)]
    manifest = run(spec, out, only=only, force=force, threads=threads, progress=None if quiet else Progress())
    click.echo(format_summary(manifest, names))
    failed = [n for n in names if manifest["engines"][n]["status"] == "fail"]
    if failed:
        fail(f"{len(failed)} engine(s) failed: {', '.join(failed)}; they are in {out}/_failed, "
             f"details in {out}/manifest.json")


@click.command(name="verify", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("out", type=click.Path(path_type=str))
@user_errors
def verify(out):
    """Re-check every file of a ci-build output against its manifest.json."""
    from bessemer.artifacts.verify import verify as check

    problems = check(out)
    for p in problems:
        click.echo(p)
    if problems:
        fail(f"{len(problems)} problem(s) in {out}")
    click.echo(f"{out}: every file matches manifest.json")
