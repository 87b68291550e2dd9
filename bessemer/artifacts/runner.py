"""ci_build: build every engine of an engines.yaml, validate it, publish it or quarantine it.

Per engine, in file order:
  1. hash its inputs (inputs_hash.py). If they and the gates equal those of the last run that
     passed, and every file in OUT/<name> still matches its sha256, the engine is `skipped`:
     reused as is, with that run's results. Same inputs but changed gates: revalidate only.
  2. otherwise build into OUT/.staging/<name>, in a child process (spawned, so its peak RSS
     in build_report.json is this build's alone, and torch threads in this process don't
     leak into it);
  3. run its gates against HF transformers;
  4. publish: pass -> OUT/<name>; fail -> OUT/_failed/<name>, and any older OUT/<name> is
     removed, so nothing under OUT/<name> is ever an engine that failed its gates;
  5. rewrite OUT/manifest.json (atomic) so that an interrupted job keeps what it finished.
A build error is recorded as a failure of that engine and the job goes on with the others.
The caller (CLI) prints format_summary(manifest) and exits non-zero unless manifest["ok"].
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import sys
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Callable

import bessemer
from bessemer.artifacts.gates import References, run_gates
from bessemer.artifacts.inputs_hash import builder_source_hash, checkpoint_hash, digest, engine_inputs, gates_record
from bessemer.artifacts.manifest import (FAILED_DIR, MANIFEST_VERSION, PASSING, file_records, mismatches,
                                         read_manifest, write_manifest)
from bessemer.artifacts.spec import EngineSpec, Spec
from bessemer.errors import BessemerError

STAGING_DIR = ".staging"
Progress = Callable[[str], None]


def _child_build(model_dir: str, out_dir: str, build, label: str, verbose: bool) -> None:
    from bessemer.builder.build import build_engine

    say = (lambda msg: print(f"  [{label}] {msg}", file=sys.stderr, flush=True)) if verbose else None
    build_engine(model_dir, out_dir, build, progress=say)


def _build(spec: EngineSpec, model_dir: Path, out_dir: Path, verbose: bool) -> dict:
    """build_engine in a fresh process; returns its build_report.json."""
    ctx = multiprocessing.get_context("spawn")
    try:
        with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
            pool.submit(_child_build, str(model_dir), str(out_dir), spec.build, spec.name, verbose).result()
    except BrokenProcessPool:
        raise BessemerError(f"the build of {spec.name} died (out of memory?); see the log above") from None
    return json.loads((out_dir / "build_report.json").read_text())


def _move(src: Path, dst: Path) -> None:
    """Replace dst (if any) with src; both under OUT, so os.replace is a rename."""
    if dst.exists():
        shutil.rmtree(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    os.replace(src, dst)


def _publish(out: Path, name: str, engine_dir: Path, passed: bool) -> str:
    """Moves a validated engine to OUT/<name> or OUT/_failed/<name>; returns that dir, relative."""
    target = Path(name) if passed else Path(FAILED_DIR) / name
    other = out / (Path(FAILED_DIR) / name if passed else name)
    if engine_dir != out / target:
        _move(engine_dir, out / target)
    if other.exists():  # a stale copy from an earlier run must not contradict this result
        shutil.rmtree(other)
    return target.as_posix()


def _validate(spec, engine_dir, model_dir, refs, threads, say) -> tuple[dict, str | None]:
    try:
        results = run_gates(engine_dir, spec, refs.get(model_dir), threads, say)
    except BessemerError as e:
        return {}, str(e)
    return results, None


def _reusable(prior: dict | None, out: Path, name: str, inputs_hash: str) -> bool:
    return bool(prior and prior.get("status") in PASSING and prior.get("inputs_hash") == inputs_hash
                and prior.get("dir") == name and not mismatches(out / name, prior.get("files", {})))


def build_one(spec: EngineSpec, out: Path, prior: dict | None, force: bool, refs: References,
              builder_sha: str, threads: int | None, say: Progress, verbose: bool) -> dict:
    """One engine through steps 1-4; returns its manifest entry."""
    model_dir = spec.checkpoint_dir(say)
    inputs = engine_inputs(checkpoint_hash(model_dir), spec.build, builder_sha)
    gates = gates_record(spec)
    entry = {"source": spec.source, "source_checkpoint_sha256": inputs["checkpoint_sha256"],
             "inputs": inputs, "inputs_hash": digest(inputs), "gates": gates, "gates_hash": digest(gates),
             "builder_version": bessemer.__version__,
             "options": {"build": inputs["build"], "quant": inputs["quant"]}}
    if not force and _reusable(prior, out, spec.name, entry["inputs_hash"]):
        entry.update(files=prior["files"], build_time_s=prior.get("build_time_s"),
                     peak_rss_mib=prior.get("peak_rss_mib"))
        if prior.get("gates_hash") == entry["gates_hash"]:
            say("inputs, gates and files unchanged since the last passing run: skipped")
            return {**entry, "status": "skipped", "dir": spec.name, "validation": prior.get("validation", {})}
        say("inputs unchanged, gates changed: revalidating the existing engine")
        engine_dir = out / spec.name
    else:
        engine_dir = out / STAGING_DIR / spec.name
        if engine_dir.exists():
            shutil.rmtree(engine_dir)
        say(f"building from {model_dir}")
        try:
            report = _build(spec, model_dir, engine_dir, verbose)
        except BessemerError as e:
            say(f"build failed: {e}")
            shutil.rmtree(out / spec.name, ignore_errors=True)  # an older engine there no longer stands
            return {**entry, "status": "fail", "dir": None, "files": {}, "validation": {}, "error": str(e)}
        entry.update(build_time_s=report["timings_s"]["total"], peak_rss_mib=report["peak_rss_mib"])
        entry["files"] = file_records(engine_dir)
    results, error = _validate(spec, engine_dir, model_dir, refs, threads, say)
    passed = error is None and all(r["passed"] for r in results.values())
    entry.update(status="pass" if passed else "fail", validation=results,
                 dir=_publish(out, spec.name, engine_dir, passed))
    if error:
        entry["error"] = error
    return entry


def ci_build(spec: Spec, out: str | os.PathLike, only=None, force: bool = False, threads: int | None = None,
             progress: Progress | None = None) -> dict:
    """Builds and validates the selected engines into `out`; returns the manifest written there."""
    say = progress or (lambda msg: None)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    selected = spec.select(only)
    old = read_manifest(out) or {}
    previous = old.get("engines", {})
    names = {e.name for e in spec.engines}
    # Entries the file no longer lists leave the manifest, with the directories we made for them.
    for name, entry in previous.items():
        if name not in names and entry.get("dir") and (out / entry["dir"]).is_dir():
            shutil.rmtree(out / entry["dir"])
    engines = {n: e for n, e in previous.items() if n in names}
    manifest = {"manifest_version": MANIFEST_VERSION, "bessemer_version": bessemer.__version__,
                "spec": spec.path.name, "engines": engines}
    refs, builder_sha = References(threads), builder_source_hash()
    for i, engine in enumerate(selected, 1):
        tag = f"[{i}/{len(selected)} {engine.name}]"
        say(f"{tag} start")
        entry = build_one(engine, out, previous.get(engine.name), force, refs, builder_sha, threads,
                          lambda msg, tag=tag: say(f"{tag} {msg}"), verbose=progress is not None)
        engines[engine.name] = entry
        manifest["engines"] = {n: engines[n] for n in sorted(engines)}
        manifest["ok"] = all(e["status"] in PASSING for e in engines.values())
        write_manifest(out, manifest)
        say(f"{tag} {entry['status']}")
    shutil.rmtree(out / STAGING_DIR, ignore_errors=True)
    return manifest


def _gate_cell(name: str, r: dict) -> str:
    mark = "ok" if r["passed"] else "FAIL"
    if name == "perplexity":
        return f"ppl {r['increase_pct']:+.3f}% (<= {r['max_increase_pct']}) {mark}"
    return f"greedy {r['agreement']:.2f} (>= {r['min_agreement']}) {mark}"


def format_summary(manifest: dict, names=None) -> str:
    """One row per engine: status, build time, peak RSS, each gate's value vs its bound."""
    rows = [("engine", "status", "build s", "peak RSS MiB", "gates")]
    for name, e in manifest["engines"].items():
        if names and name not in names:
            continue
        gates = "; ".join(_gate_cell(g, r) for g, r in e.get("validation", {}).items()) or "-"
        if e.get("error"):
            gates = f"error: {e['error']}"
        fmt = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
        rows.append((name, e["status"], fmt(e.get("build_time_s"), ".1f"), fmt(e.get("peak_rss_mib"), ".0f"), gates))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + "  " + r[4] for r in rows]
    failed = [n for n, e in manifest["engines"].items() if e["status"] not in PASSING and (not names or n in names)]
    lines.append(f"{len(rows) - 1} engine(s); " + (f"FAILED: {', '.join(failed)}" if failed else "all passed"))
    return "\n".join(lines)
