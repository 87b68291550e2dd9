"""build-engine owns only what it wrote: it replaces an engine directory, never a directory
that merely has a config.json, never the checkpoint (or a folder inside it or above it), and
a killed build's temp directory is removed by the next build of the same output."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

from test_cli import assert_clean_error, no_leftovers, run


def test_a_project_with_a_config_json_is_not_replaced(tiny_checkpoint, tmp_path):
    proj = tmp_path / "proj"
    (proj / "src").mkdir(parents=True)
    (proj / "config.json").write_text("{}")
    (proj / "src" / "main.py").write_text("x = 1\n")
    proc = run("build-engine", str(tiny_checkpoint("llama-untied")), "--output", str(proj))
    assert_clean_error(proc, "not a Bessemer engine", "--output")
    assert (proj / "src" / "main.py").read_text() == "x = 1\n" and no_leftovers(tmp_path)


def test_the_checkpoint_is_never_the_output(tiny_checkpoint, tmp_path):
    src = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint("llama-untied"), src)
    before = sorted(p.name for p in src.iterdir())
    for out, needle in ((src, "is the checkpoint"), (src / "engine", "inside the checkpoint"),
                        (tmp_path, "containing the checkpoint")):
        assert_clean_error(run("build-engine", str(src), "--output", str(out)), needle)
    assert sorted(p.name for p in src.iterdir()) == before and no_leftovers(tmp_path)


def test_an_engine_is_replaced_by_a_rebuild(tiny_checkpoint, tmp_path):
    out = tmp_path / "engine"
    src = tiny_checkpoint("llama-untied")
    run("build-engine", str(src), "--output", str(out), "-q", check=True)
    run("build-engine", str(src), "--output", str(out), "-q", "--dtype", "bfloat16", check=True)
    assert json.loads((out / "config.json").read_text())["build"]["dtype"] == "bfloat16"
    assert no_leftovers(tmp_path)


def test_a_killed_builds_temp_dir_is_removed_by_the_next_build(tiny_checkpoint, tmp_path):
    out = tmp_path / "engine"
    # a temp dir as a build killed mid-write leaves it: named with a process id that is gone
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".engine.tmp-{dead.pid}-abc123"
    stale.mkdir()
    (stale / "rank0.engine").write_bytes(b"\0" * 1024)
    run("build-engine", str(tiny_checkpoint("llama-untied")), "--output", str(out), "-q", check=True)
    assert not stale.exists() and no_leftovers(tmp_path)


def test_sigterm_during_a_build_leaves_nothing(smollm2_dir, tmp_path):
    out = tmp_path / "engine"
    proc = subprocess.Popen(["build-engine", str(smollm2_dir), "--output", str(out)],
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not any(p.name.startswith(".engine.tmp-") for p in tmp_path.iterdir()):
        time.sleep(0.05)
    assert any(p.name.startswith(".engine.tmp-") for p in tmp_path.iterdir()), "the build never started writing"
    os.kill(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0 and "Traceback" not in err
    assert not out.exists() and no_leftovers(tmp_path), list(tmp_path.iterdir())


def test_nan_weights_are_refused_naming_the_tensor(tiny_checkpoint, tmp_path):
    import numpy as np
    from safetensors.numpy import load_file, save_file

    src = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint("llama-untied"), src)
    (file,) = src.glob("*.safetensors")
    tensors = load_file(str(file))
    name = next(n for n in sorted(tensors) if n.endswith("mlp.down_proj.weight"))
    tensors[name][0, 0] = np.nan
    save_file(tensors, str(file), metadata={"format": "pt"})
    out = tmp_path / "engine"
    assert_clean_error(run("build-engine", str(src), "--output", str(out)), name, "NaN")
    assert not out.exists() and no_leftovers(tmp_path)
