"""Issue 31, serving you can trust: inputs that crashed a command with a traceback, read
forever or gave a wrong answer now get one `error:` line naming the problem and the fix,
a non-zero exit, and no half-written output."""

import json
import os
import shutil
import subprocess
from dataclasses import replace

import pytest
from click.testing import CliRunner

from bessemer.errors import BessemerError, EngineLoadError
from bessemer.runtime.engine import Engine
from conftest import make_tiny_checkpoint
from test_cli import assert_clean_error, no_leftovers, run

WORDS = [f"w{i}" for i in range(200)]


@pytest.fixture(scope="module")
def worded_engine(tiny_engine, tmp_path_factory):
    """The tiny llama engine (vocabulary 250) with a word-level tokenizer of 201 ids, so
    that commands that read text (run-engine, eval) can run it."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    d = tmp_path_factory.mktemp("worded") / "engine"
    shutil.copytree(tiny_engine("llama-untied"), d)
    tok = Tokenizer(models.WordLevel({"<unk>": 0, **{w: i + 1 for i, w in enumerate(WORDS)}}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(d / "tokenizer.json"))
    return d


@pytest.fixture(scope="module")
def other_vocabulary(tmp_path_factory):
    """A checkpoint of the tiny llama's family and shapes but a vocabulary of 120."""
    return make_tiny_checkpoint("llama-untied", tmp_path_factory.mktemp("hf-vocab120"), vocab_size=120)


def diff(engine, reference, *ids):
    return run("bessemer", "diff", str(engine), "--reference", str(reference), "--ids",
               ",".join(str(i) for i in ids), "-q")


# ---- bessemer diff / eval --reference ----

def test_diff_refuses_a_cuda_engine(cuda_engine, tiny_checkpoint):
    """Was: KeyError: 'steps' (a cuda plan has `forward`, and no cpu executor runs it)."""
    proc = diff(cuda_engine("qwen2"), tiny_checkpoint("qwen2"), 1, 2, 3)
    assert_clean_error(proc, "is a cuda engine", "--target cpu")


def test_diff_refuses_ids_outside_the_vocabulary(tiny_engine, tiny_checkpoint):
    """Was: IndexError from HF's embedding (and the engine's ids were never checked)."""
    for bad in (250, -1):
        assert_clean_error(diff(tiny_engine("llama-untied"), tiny_checkpoint("llama-untied"), 1, bad, 3),
                           f"token id {bad}", "vocabulary of 250")


def test_diff_refuses_a_prompt_longer_than_the_engine_runs(tiny_engine, tiny_checkpoint):
    """Was: every plan prefix ran the whole prompt (an hour on a real model), past max_seq_len,
    and reported agreement. Now refused before transformers is even loaded."""
    proc = diff(tiny_engine("llama-untied"), tiny_checkpoint("llama-untied"), *[5] * 300)
    assert_clean_error(proc, "300 tokens", "at most 256", "max_seq_len 256")


def test_diff_and_eval_refuse_a_reference_with_another_vocabulary(worded_engine, other_vocabulary, tmp_path):
    """Was: IndexError (ids past the reference's embedding) or, with ids inside both, a
    perplexity of logits over another vocabulary."""
    assert_clean_error(diff(worded_engine, other_vocabulary, 1, 2, 3), "vocabulary of 120 tokens", "one of 250")
    text = tmp_path / "text.txt"
    text.write_text(" ".join(WORDS[i % 200] for i in range(0, 600, 7)))
    proc = run("bessemer", "eval", str(worded_engine), "--dataset", str(text), "--context-len", "16",
               "--max-tokens", "48", "--reference", str(other_vocabulary), "--threads", "2", "-q")
    assert_clean_error(proc, "vocabulary of 120 tokens", "one of 250")


def test_a_reference_that_is_an_engine_is_refused(worded_engine, tmp_path):
    """Was: transformers' ValueError traceback on the engine's config.json."""
    text = tmp_path / "text.txt"
    text.write_text("w1 w2 w3 w4 w5 w6 w7 w8")
    proc = run("bessemer", "eval", str(worded_engine), "--dataset", str(text), "--context-len", "4",
               "--reference", str(worded_engine), "-q")
    assert_clean_error(proc, "is a Bessemer engine, not a HF checkpoint", "the engine was built from")
    assert_clean_error(diff(worded_engine, worded_engine, 1, 2), "is a Bessemer engine, not a HF checkpoint")


# ---- run-engine's files ----

@pytest.mark.parametrize("flag, content, needle", [
    ("--grammar", b"\x89PNG\r\n\x1a\n\x00\x00", "is not UTF-8 text (byte 0x89 at offset 0)"),  # was: UnicodeDecodeError
    ("--input-file", b"hello\n\xff\xfe world\n", "is not UTF-8 text (byte 0xff at offset 6)"),  # was: UnicodeDecodeError
    ("--input-file", None, "holds more than 16 MiB"),  # /dev/zero: was read until memory ran out
])
def test_run_engine_refuses_text_files_it_cannot_read(tiny_engine, tmp_path, flag, content, needle):
    path = "/dev/zero"
    if content is not None:
        path = tmp_path / "file"
        path.write_bytes(content)
    prompt = ["--prompt", "x"] if flag != "--input-file" else []
    proc = subprocess.run(["run-engine", str(tiny_engine("llama-untied")), *prompt, flag, str(path)],
                          capture_output=True, text=True, timeout=60)
    assert_clean_error(proc, flag, needle)


def test_a_cuda_draft_engine_without_a_driver_names_the_draft_and_the_driver(tiny_engine, cuda_engine, tmp_path):
    """Was: AttributeError: 'CudaTarget' object has no attribute 'create_executor'. A cuda
    draft now opens its own target's executor (tests/cuda_interpreter/test_speculative_draft.py
    runs one): without a CUDA driver that fails at start, naming the draft engine."""
    draft = cuda_engine("qwen2")
    env = dict(os.environ, BESSEMER_LIBCUDA=str(tmp_path / "no-driver" / "libcuda.so.1"))
    proc = subprocess.run(["run-engine", str(tiny_engine("qwen2")), "--prompt", "x", "--draft-engine", str(draft)],
                          capture_output=True, text=True, timeout=600, env=env)
    assert_clean_error(proc, f"draft engine {draft}", "no CUDA driver")


# ---- a damaged engine config.json ----

@pytest.mark.parametrize("edit, needle", [
    (lambda c: [], "not a JSON object"),  # was: AttributeError: 'list' object has no attribute 'get'
    (lambda c: {**c, "mapping": None}, "mapping is null, not an object"),  # was: TypeError / AttributeError
    (lambda c: {**c, "model": None}, "model is null, not an object"),
    (lambda c: {**c, "mapping": {**c["mapping"], "tp_size": "1"}}, 'mapping.tp_size is "1"'),
    (lambda c: {**c, "mapping": {**c["mapping"], "tp_size": 2}}, "ranks lists 1 file"),
])
def test_damaged_engine_config_shape_is_one_line(tiny_engine, tmp_path, edit, needle):
    d = tmp_path / "engine"
    shutil.copytree(tiny_engine("llama-untied"), d)
    (d / "config.json").write_text(json.dumps(edit(json.loads((d / "config.json").read_text()))))
    with pytest.raises(EngineLoadError, match="config.json is damaged"):
        Engine.load(d)
    assert_clean_error(run("bessemer", "inspect", str(d)), needle)
    assert_clean_error(run("run-engine", str(d), "--prompt", "x"), needle)


def test_inspect_refuses_a_model_section_it_cannot_describe(tiny_engine, tmp_path):
    """Was: KeyError: 'architecture'."""
    d = tmp_path / "engine"
    shutil.copytree(tiny_engine("llama-untied"), d)
    config = json.loads((d / "config.json").read_text())
    config["model"] = {}
    (d / "config.json").write_text(json.dumps(config))
    assert_clean_error(run("bessemer", "inspect", str(d)), "malformed field", "architecture")


# ---- RoPE parameters of the checkpoint ----

LLAMA3 = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64}
LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * 8, "long_factor": [2.0] * 8,
            "original_max_position_embeddings": 64}


@pytest.mark.parametrize("rope, field, wanted", [
    # was: ZeroDivisionError at build
    ({**LLAMA3, "low_freq_factor": 0}, "rope_parameters.low_freq_factor", "a positive number"),
    ({**LLAMA3, "high_freq_factor": 1.0}, "rope_parameters.high_freq_factor", "greater than low_freq_factor"),
    ({k: v for k, v in LLAMA3.items() if k != "factor"}, "rope_parameters.factor", "is missing"),  # was: KeyError
    # were: built silently, an engine that emits token 0 forever
    ({"rope_type": "default", "rope_theta": 0}, "rope_parameters.rope_theta", "a positive number"),
    ({"rope_type": "default", "rope_theta": -10000.0}, "rope_parameters.rope_theta", "a positive number"),
    ({"rope_type": "default", "rope_theta": float("nan")}, "rope_parameters.rope_theta", "a positive number"),
    ({"rope_type": "linear", "rope_theta": 10000.0, "factor": 0}, "rope_parameters.factor", "a positive number"),
    ({"rope_type": "linear", "rope_theta": 10000.0, "factor": -2.0}, "rope_parameters.factor", "a positive number"),
    ({"rope_type": "dynamic", "rope_theta": 10000.0, "factor": float("nan")}, "rope_parameters.factor",
     "a positive number"),
    ({**YARN, "factor": 0}, "rope_parameters.factor", "a positive number"),  # was: 0 read as "no factor"
    ({**YARN, "beta_fast": 1.0, "beta_slow": 32.0}, "rope_parameters.beta_fast", "greater than beta_slow"),
    ({**YARN, "original_max_position_embeddings": 0}, "rope_parameters.original_max_position_embeddings",
     "a positive integer"),
    ({**LONGROPE, "short_factor": [1.0] * 7 + [0.0]}, "rope_parameters.short_factor", "list of positive numbers"),
    ({**LONGROPE, "long_factor": [2.0] * 7 + [float("inf")]}, "rope_parameters.long_factor",
     "list of positive numbers"),
    ({"type": "linear", "factor": None}, "rope_scaling.factor", "a positive number"),  # the older field
])
def test_build_refuses_rope_parameters_out_of_range(tiny_checkpoint, tmp_path, rope, field, wanted):
    from bessemer.builder.build import build_engine

    src = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint("llama-untied"), src)
    cfg = json.loads((src / "config.json").read_text())
    cfg.pop("rope_parameters", None)
    cfg[field.split(".")[0]] = rope
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(BessemerError, match=rf"{field} .*{wanted}"):
        build_engine(src, tmp_path / "engine")
    assert not (tmp_path / "engine").exists()


def test_build_engine_names_the_rope_field_in_one_line(tiny_checkpoint, tmp_path):
    src = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint("llama3-rope"), src)
    cfg = json.loads((src / "config.json").read_text())
    cfg["rope_parameters"]["low_freq_factor"] = 0
    (src / "config.json").write_text(json.dumps(cfg))
    proc = run("build-engine", str(src), "--output", str(tmp_path / "engine"))
    assert_clean_error(proc, "rope_parameters.low_freq_factor must be a positive number, got 0")
    assert not (tmp_path / "engine").exists() and no_leftovers(tmp_path)


def test_valid_rope_kinds_still_build(tiny_checkpoint, tmp_path):
    """The range checks pass every RoPE kind of the tiny families (Gemma 3's per-layer-type
    objects included)."""
    from bessemer.builder.checkpoint import Checkpoint

    for kind in ("llama3-rope", "llama-yarn", "llama-dynamic", "phi3", "gemma3", "gpt-oss"):
        Checkpoint(tiny_checkpoint(kind)).close()


# ---- a prompt that fails inside a step ----

@pytest.fixture
def second_prompt_fails(monkeypatch):
    """run-engine's second prompt fails inside the step, the way tests/test_sampling.py makes
    a real engine's sampler fail for one sequence: more logprobs than the vocabulary has
    (valid for SamplingParams, which does not know the vocabulary)."""
    from bessemer.runtime.llm import LLM

    generate = LLM.generate

    def generate_with_a_failure(self, prompts, params, **kwargs):
        bad = replace(params, logprobs=self.vocab_size + 10)
        return generate(self, prompts, [bad if i == 1 else params for i in range(len(prompts))], **kwargs)

    monkeypatch.setattr(LLM, "generate", generate_with_a_failure)


def _run_engine(engine, *args):
    from bessemer.cli.run import main

    prompts = [a for p in ("w1 w2 w3", "w4 w5", "w6") for a in ("--prompt", p)]
    return CliRunner().invoke(main, [str(engine), *prompts, "--max-new-tokens", "3", "--ignore-eos",
                                     "--threads", "2", "-q", *args])


def test_run_engine_reports_a_prompt_that_failed_inside_a_step(worded_engine, second_prompt_fails):
    """Was: an empty continuation and exit 0, as if it were the model's answer."""
    result = _run_engine(worded_engine)
    assert result.exit_code == 1, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: prompt 2 failed: ") and "kth" in errors[0]
    assert "Traceback" not in result.stderr
    printed = result.stdout.split("-" * 40)
    assert printed[0].startswith("w1 w2 w3") and printed[1].strip().startswith("w6")  # the others are printed


def test_run_engine_json_carries_the_error(worded_engine, second_prompt_fails):
    """Was: TypeError (no first token time) after an empty continuation."""
    result = _run_engine(worded_engine, "--json")
    assert result.exit_code == 1, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["finish_reason"] for r in rows] == ["length", "error", "length"]
    assert [r["error"] is None for r in rows] == [True, False, True] and "kth" in rows[1]["error"]
    assert rows[1]["ttft_s"] is None and len(rows[0]["token_ids"]) == 3
    assert [line for line in result.stderr.splitlines() if line.startswith("error:")] == [
        f"error: prompt 2 failed: {rows[1]['error']}"]


# ---- bessemer serve ----

@pytest.mark.parametrize("value", ["-1", "nan"])
def test_serve_refuses_a_stream_interval_below_zero_or_not_a_number(tiny_engine, value):
    proc = run("bessemer", "serve", str(tiny_engine("llama-untied")), "--port", "0", "--stream-interval-ms", value)
    assert_clean_error(proc, "--stream-interval-ms must be >= 0")
