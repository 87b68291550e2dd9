"""A checkpoint (or hub id) given where an engine goes: built once into the content-addressed
engine cache (builder/engine_cache.py), reused afterwards; an engine directory as before."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bessemer.builder.config import BuildConfig
from bessemer.builder.engine_cache import engine_key, resolve_engine
from bessemer.errors import InvalidOptionError
from bessemer.runtime.llm import LLM, SamplingParams
from test_cli import assert_clean_error, run

KIND = "llama-untied"
BUILD = BuildConfig(max_seq_len=64, max_num_tokens=64, max_batch_size=4)
PROMPT = [3, 17, 42, 9, 101]
GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)


def engines_in(cache: Path) -> list[Path]:
    return [p for p in cache.iterdir() if p.is_dir() and not p.name.startswith(".") and p.name != "hashes"]


def test_llm_model_builds_once_then_reuses(tiny_checkpoint, tmp_path, monkeypatch):
    """LLM(model=checkpoint) generates what an explicitly built engine does (same
    BuildConfig); a second LLM(model=...) loads the cached engine without building."""
    import bessemer.builder.build as build_module

    ckpt, cache = tiny_checkpoint(KIND), tmp_path / "cache"
    builds = []
    real_build = build_module.build_engine
    monkeypatch.setattr(build_module, "build_engine", lambda *a, **k: builds.append(a) or real_build(*a, **k))

    first = LLM(model=ckpt, build_config=BUILD, engine_cache=cache, num_threads=1)
    explicit = LLM(real_build(ckpt, tmp_path / "explicit", BUILD), num_threads=1)
    assert first.generate([PROMPT], GREEDY)[0].token_ids == explicit.generate([PROMPT], GREEDY)[0].token_ids
    assert len(builds) == 1
    [engine] = engines_in(cache)
    mtime = engine.stat().st_mtime_ns

    again = resolve_engine(ckpt, BUILD, cache)
    second = LLM(model=ckpt, build_config=BUILD, engine_cache=cache, num_threads=1)
    assert len(builds) == 1 and again == engine and engines_in(cache) == [engine]
    # not rebuilt: no second build call and the file untouched (a tiny build takes tens of
    # milliseconds, so its wall time against a lookup's says nothing on a shared machine)
    assert engine.stat().st_mtime_ns == mtime
    assert second.generate([PROMPT], GREEDY)[0].token_ids == explicit.generate([PROMPT], GREEDY)[0].token_ids


def test_key_follows_content_and_options(tiny_checkpoint, tmp_path):
    """The key is the checkpoint's content, not its path; a build option, a config edit or a
    weight rewrite of the same size gives another key."""
    cache = tmp_path / "cache"
    src = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint(KIND), src)
    base = engine_key(src, BUILD, cache)
    assert engine_key(tiny_checkpoint(KIND), BUILD, cache) == base  # a copy elsewhere: same engine
    assert engine_key(src, BuildConfig(max_seq_len=32, max_num_tokens=64, max_batch_size=4), cache) != base
    assert engine_key(src, BuildConfig(max_seq_len=64, max_num_tokens=64, max_batch_size=4, dtype="bfloat16"),
                      cache) != base

    config = json.loads((src / "config.json").read_text())
    config["rms_norm_eps"] = 1e-6
    (src / "config.json").write_text(json.dumps(config))
    edited = engine_key(src, BUILD, cache)
    assert edited != base

    weights = src / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x55  # the last byte of the last tensor: same size, same header, new content
    before = weights.stat()
    weights.write_bytes(bytes(data))
    os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000))
    assert engine_key(src, BUILD, cache) not in (base, edited)


def test_an_unchanged_checkpoint_is_not_read_again(tiny_checkpoint, tmp_path, monkeypatch):
    """The content hash is remembered by stat: keying the same files again reads none of
    them (a multi-GB checkpoint is hashed once, not at every start)."""
    import bessemer.builder.hash_memo as hash_memo

    cache = tmp_path / "cache"
    reads = []
    real = hash_memo.sha256_file
    monkeypatch.setattr(hash_memo, "sha256_file", lambda path: reads.append(path) or real(path))
    first = engine_key(tiny_checkpoint(KIND), BUILD, cache)
    assert any(p.suffix == ".safetensors" for p in reads)
    reads.clear()
    assert engine_key(tiny_checkpoint(KIND), BUILD, cache) == first and reads == []


def test_an_engine_dir_loads_as_before(tiny_engine):
    engine = tiny_engine(KIND)
    assert resolve_engine(engine) == engine
    assert LLM(engine, num_threads=1).generate([PROMPT], GREEDY)[0].token_ids == \
        LLM(model=engine, num_threads=1).generate([PROMPT], GREEDY)[0].token_ids
    with pytest.raises(InvalidOptionError, match="build options apply to a checkpoint"):
        resolve_engine(engine, BUILD)
    with pytest.raises(InvalidOptionError, match="not both"):
        LLM(engine, model=engine)


def test_bad_model_arguments_are_one_line(tiny_engine, tmp_path):
    hub_offline = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    proc = subprocess.run(["run-engine", "nobody-here/no-such-model", "--prompt", "x",
                           "--engine-cache", str(tmp_path / "cache")],
                          capture_output=True, text=True, timeout=300, env=hub_offline)
    assert_clean_error(proc, "nobody-here/no-such-model is not a local directory and the hub cannot be reached",
                       "download it and pass the directory")
    assert proc.returncode == 1
    proc = subprocess.run([sys.executable, "-m", "bessemer.cli.main", "serve", "nobody-here/no-such-model"],
                          capture_output=True, text=True, timeout=300, env=hub_offline)
    assert_clean_error(proc, "the hub cannot be reached")
    proc = run("run-engine", str(tmp_path / "nope"), "--prompt", "x")
    assert_clean_error(proc, "does not exist")
    proc = run("run-engine", str(tiny_engine(KIND)), "--prompt", "x", "--dtype", "bfloat16")
    assert_clean_error(proc, "is an engine, built already")
    assert proc.returncode == 1


def test_a_hub_id_without_huggingface_hub_is_one_line(monkeypatch):
    from bessemer.builder import hub
    from bessemer.errors import BessemerError

    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import fails as if not installed
    with pytest.raises(BessemerError, match="pip install huggingface_hub") as e:
        hub.download("org/model", lambda m: None)
    assert "\n" not in str(e.value) and "download it and pass the directory" in str(e.value)


RACE = """
import sys
from bessemer.builder.config import BuildConfig
from bessemer.builder.engine_cache import resolve_engine
path = resolve_engine(sys.argv[1], BuildConfig(max_seq_len=64, max_num_tokens=64, max_batch_size=4), sys.argv[2],
                      lambda m: print(m, flush=True))
print("engine:", path)
"""


def test_two_processes_build_the_same_key_once(tiny_checkpoint, tmp_path):
    """Both processes wait on the key's lock (held here until both report waiting, so the
    race is certain, not a matter of timing); then one builds and the other reuses."""
    import fcntl

    ckpt, cache = tiny_checkpoint(KIND), tmp_path / "cache"
    cache.mkdir()
    with open(cache / f"{engine_key(ckpt, BUILD, cache)}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        procs = [subprocess.Popen([sys.executable, "-c", RACE, str(ckpt), str(cache)], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True) for _ in range(2)]
        heads = []
        for p in procs:
            lines = []
            while not lines or "waiting for it" not in lines[-1]:
                line = p.stdout.readline()
                assert line, "".join(lines)  # exited before reaching the lock
                lines.append(line)
            heads.append("".join(lines))
    outs = [head + p.communicate(timeout=300)[0] for head, p in zip(heads, procs)]
    assert all(p.returncode == 0 for p in procs), outs
    assert sum("engine cache: building" in out for out in outs) == 1, outs
    assert sum("built by another process" in out for out in outs) == 1, outs
    assert len({out.splitlines()[-1] for out in outs}) == 1, outs
    assert len(engines_in(cache)) == 1
    assert not [p for p in cache.iterdir() if ".tmp-" in p.name]


def _word_tokenizer(vocab_size: int, out: Path) -> None:
    """A tokenizer.json for the tiny random checkpoints: word i is `w{i}` (serving needs one)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab_size)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(out / "tokenizer.json"))


def test_serve_a_checkpoint_dir(tiny_checkpoint, tmp_path):
    pytest.importorskip("fastapi")
    from test_serve import Server

    ckpt = tmp_path / "tiny-model"
    shutil.copytree(tiny_checkpoint(KIND), ckpt)
    _word_tokenizer(json.loads((ckpt / "config.json").read_text())["vocab_size"], ckpt)
    cache = tmp_path / "cache"
    server = Server(ckpt, tmp_path / "serve.log", "--engine-cache", str(cache), "--max-seq-len", "64",
                    "--max-num-tokens", "64", "--threads", "1")
    try:
        server.wait_ready(timeout=300)
        out = server.client().completions.create(model="smollm2", prompt="w3 w17 w42", max_tokens=4,
                                                 temperature=0)
        assert out.choices[0].finish_reason in ("length", "stop") and out.usage.completion_tokens >= 1
    finally:
        server.stop()
    [engine] = engines_in(cache)
    assert json.loads((engine / "config.json").read_text())["build"]["max_num_tokens"] == 64
    assert "engine cache: building" in (tmp_path / "serve.log").read_text()
