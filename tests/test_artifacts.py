"""ci-build / verify: engines.yaml schema errors, skip-when-unchanged, a failing gate,
verify catching a modified byte, and byte-identical rebuilds.

Engines are tiny random models (greedy gate on token-id prompts: they have no tokenizer),
except the failing-gate test, which needs text and uses SmolLM2 with short limits.
"""

from __future__ import annotations

import filecmp
import json
import shutil
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from bessemer.artifacts.runner import ci_build
from bessemer.artifacts.spec import load_spec
from bessemer.artifacts.verify import verify
from bessemer.cli.main import main as cli
from bessemer.datasets import wikitext2_valid
from bessemer.errors import InvalidOptionError

DATASET = wikitext2_valid()
TINY_GREEDY = {"prompts": [[1, 2, 3, 4], [5, 6, 7], [10, 20, 30, 40, 50]], "max_new_tokens": 8,
               "min_agreement": 0.5}


def write_spec(path: Path, engines: list[dict]) -> Path:
    path.write_text(yaml.safe_dump({"version": 1, "engines": engines}, sort_keys=False))
    return path


def tiny_entries(ckpt: Path) -> list[dict]:
    return [{"name": "tiny-fp32", "source": str(ckpt), "build": {"max_seq_len": 64},
             "gates": {"greedy": TINY_GREEDY}},
            {"name": "tiny-w8a16", "source": str(ckpt), "build": {"max_seq_len": 64, "quant": "w8a16"}}]


@pytest.fixture(scope="module")
def tiny_out(tiny_checkpoint, tmp_path_factory):
    """One ci-build of the two tiny entries; tests that modify it work on a copy."""
    base = tmp_path_factory.mktemp("artifacts")
    spec = write_spec(base / "engines.yaml", tiny_entries(tiny_checkpoint("llama-untied")))
    out = base / "out"
    manifest = ci_build(load_spec(spec), out, threads=2)
    return spec, out, manifest


def copy_out(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, copy_function=shutil.copy2)  # keeps mtimes: the reuse check must not need them
    return dst


# ---------------------------------------------------------------- schema

@pytest.fixture
def fake_ckpt(tmp_path):
    """Parsing only checks that a local source has config.json (and tokenizer.json for text gates)."""
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "config.json").write_text("{}")
    return d


BAD_ENTRIES = [
    ({"qant": "w8a16"}, "engines[0] (e): unknown field 'qant'; known: build, gates, name, source"),
    ({"build": {"dtyp": "float32"}}, "engines[0] (e): unknown field 'build.dtyp'; known:"),
    ({"build": {"dtype": "float64"}}, "engines[0] (e): build: --dtype 'float64' is not supported"),
    ({"build": {"max_seq_len": "long"}}, "build.max_seq_len must be a positive integer, got 'long'"),
    ({"build": {"max_batch_size": True}}, "build.max_batch_size must be a positive integer, got True"),
    ({"build": {"group_size": 64}}, "build.group_size needs build.quant"),
    ({"build": {"quant": "int3"}}, "build: --quant 'int3' is not supported"),
    ({"build": {"quant": "w4a16", "group_size": 48}}, "--group-size must be one of 32, 64, 128"),
    ({"build": {"quant": "w4a16-awq"}}, "needs calibration text"),
    ({"build": {"quant": "w4a16-gptq", "calib_data": "nope.txt"}}, "build.calib_data 'nope.txt' is not a file"),
    ({"source": "nowhere"}, "source 'nowhere' is neither smollm2 nor a HF checkpoint directory"),
    ({"name": "../up"}, "engines[0] (../up): name must match"),
    ({"name": "_failed"}, "name must match"),
    ({"gates": {"ppl": {}}}, "unknown field 'gates.ppl'; known: greedy, perplexity"),
    ({"gates": {"perplexity": {"dataset": "missing.txt", "max_increase_pct": 1}}},
     "gates.perplexity.dataset 'missing.txt' is not a file"),
    ({"gates": {"perplexity": {"dataset": str(DATASET)}}}, "missing field 'gates.perplexity.max_increase_pct'"),
    ({"gates": {"perplexity": {"dataset": str(DATASET), "max_increase_pct": "1%"}}},
     "gates.perplexity.max_increase_pct must be a number, got '1%'"),
    ({"gates": {"perplexity": {"dataset": str(DATASET), "max_increase_pct": 1}}},
     "gates.perplexity needs a tokenizer but checkpoint"),
    ({"gates": {"greedy": {"prompts": ["hello"], "min_agreement": 1}}},
     "gates.greedy.prompts (text) needs a tokenizer"),
    ({"gates": {"greedy": {"prompts": [[1, 2]], "min_agreement": 1.01}}},
     "gates.greedy.min_agreement must be between 0 and 1, got 1.01"),
    ({"gates": {"greedy": {"prompts": [[1, "x"]], "min_agreement": 1}}},
     "gates.greedy.prompts[0] must be text or a list of token ids"),
    ({"build": {"max_seq_len": 16}, "gates": {"greedy": {"prompts": [[1] * 10], "max_new_tokens": 8,
                                                         "min_agreement": 1}}},
     "exceeds build.max_seq_len 16"),
    ({"source": "smollm2", "build": {"max_seq_len": 128},
      "gates": {"perplexity": {"dataset": str(DATASET), "context_len": 256, "max_increase_pct": 1}}},
     "gates.perplexity.context_len 256 exceeds build.max_seq_len 128"),
]


@pytest.mark.parametrize("change, message", BAD_ENTRIES, ids=[m[:40] for _, m in BAD_ENTRIES])
def test_schema_error_names_entry_and_field(tmp_path, fake_ckpt, change, message):
    entry = {"name": "e", "source": str(fake_ckpt), **change}
    spec = write_spec(tmp_path / "engines.yaml", [{"name": "ok", "source": str(fake_ckpt)}, entry])
    with pytest.raises(InvalidOptionError) as e:
        load_spec(spec)
    text = str(e.value)
    assert "\n" not in text
    assert text.startswith(f"{spec}: engines[1]"), text
    assert message.replace("engines[0]", "engines[1]") in text, text


@pytest.mark.parametrize("data, message", [
    ({"engines": []}, "engines must be a non-empty list"),
    ({"engine": []}, "unknown field 'engine'; known: engines, version"),
    ({"version": 2, "engines": [{}]}, "version 2 is not supported"),
    ({"engines": [{"name": "a", "source": "smollm2"}, {"name": "a", "source": "smollm2"}]},
     "engines[1] (a): name 'a' is already used by engines[0]"),
    ({"engines": [{"name": "a"}]}, "engines[0] (a): missing field 'source'"),
    ({"engines": ["a"]}, "engines[0]: must be a mapping, got str"),
])
def test_schema_error_top_level(tmp_path, data, message):
    spec = tmp_path / "engines.yaml"
    spec.write_text(yaml.safe_dump(data))
    with pytest.raises(InvalidOptionError) as e:
        load_spec(spec)
    assert message in str(e.value), str(e.value)


def test_repo_engines_yaml_is_valid():
    spec = load_spec(Path(__file__).resolve().parents[1] / "engines.yaml")
    names = [e.name for e in spec.engines]
    assert {"smollm2-fp32", "smollm2-w8a16"} <= set(names)
    assert all(e.perplexity and e.greedy for e in spec.engines)
    # the gates score the built-in WikiText-2 text, which ships in the package
    assert all(e.perplexity.dataset == DATASET for e in spec.engines)


def test_cli_schema_error_is_one_line(tmp_path, fake_ckpt):
    spec = write_spec(tmp_path / "engines.yaml", [{"name": "x", "source": str(fake_ckpt), "qant": 1}])
    res = CliRunner().invoke(cli, ["ci-build", str(spec), "--out", str(tmp_path / "out")])
    assert res.exit_code == 1
    assert res.stderr.strip().splitlines() == [f"error: {spec}: engines[0] (x): unknown field 'qant'; "
                                               "known: build, gates, name, source"]
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- builds

def test_first_run_passes_and_records_everything(tiny_out):
    _, out, manifest = tiny_out
    assert manifest["ok"] is True
    for name in ("tiny-fp32", "tiny-w8a16"):
        e = manifest["engines"][name]
        assert e["status"] == "pass" and e["dir"] == name
        assert e["files"]["rank0.engine"]["size"] == (out / name / "rank0.engine").stat().st_size
        assert e["build_time_s"] > 0 and e["peak_rss_mib"] > 0
        assert e["builder_version"] and len(e["source_checkpoint_sha256"]) == 64
    assert manifest["engines"]["tiny-w8a16"]["options"]["quant"]["mode"] == "w8a16"
    greedy = manifest["engines"]["tiny-fp32"]["validation"]["greedy"]
    assert greedy["passed"] and greedy["prompts"] == 3 and 0.5 <= greedy["agreement"] <= 1
    assert json.loads((out / "manifest.json").read_text()) == manifest
    assert verify(out) == []


def test_skip_when_unchanged_then_rebuild_on_change(tiny_out, tmp_path):
    spec_path, src, _ = tiny_out
    out = copy_out(src, tmp_path / "out")
    rank = out / "tiny-fp32" / "rank0.engine"
    before = (rank.stat().st_mtime_ns, rank.stat().st_ino)
    manifest = ci_build(load_spec(spec_path), out, threads=2)
    assert {e["status"] for e in manifest["engines"].values()} == {"skipped"}
    assert manifest["ok"] is True
    assert (rank.stat().st_mtime_ns, rank.stat().st_ino) == before  # not rewritten
    assert manifest["engines"]["tiny-fp32"]["validation"]["greedy"]["passed"]  # results carried over

    # A changed gate revalidates the same files; a changed option rebuilds.
    entries = tiny_entries(Path(load_spec(spec_path).engines[0].source))
    entries[0]["gates"]["greedy"] = {**TINY_GREEDY, "max_new_tokens": 4}
    entries[1]["build"]["max_batch_size"] = 4
    spec2 = write_spec(tmp_path / "engines.yaml", entries)
    manifest = ci_build(load_spec(spec2), out, threads=2)
    fp32, w8 = manifest["engines"]["tiny-fp32"], manifest["engines"]["tiny-w8a16"]
    assert fp32["status"] == "pass" and fp32["validation"]["greedy"]["max_new_tokens"] == 4
    assert (rank.stat().st_mtime_ns, rank.stat().st_ino) == before
    assert w8["status"] == "pass" and w8["options"]["build"]["max_batch_size"] == 4
    assert w8["inputs_hash"] != tiny_out[2]["engines"]["tiny-w8a16"]["inputs_hash"]

    # A file that no longer matches its sha256 is never reused; --force always rebuilds.
    with open(rank, "r+b") as f:
        f.seek(4096)
        byte = f.read(1)
        f.seek(4096)
        f.write(bytes([byte[0] ^ 0xFF]))
    manifest = ci_build(load_spec(spec2), out, only=["tiny-fp32"], threads=2)
    assert manifest["engines"]["tiny-fp32"]["status"] == "pass"
    assert manifest["engines"]["tiny-w8a16"]["status"] == "pass"  # not selected: entry kept as is
    assert verify(out) == []
    manifest = ci_build(load_spec(spec2), out, only=["tiny-w8a16"], force=True, threads=2)
    assert manifest["engines"]["tiny-w8a16"]["status"] == "pass"


def test_verify_detects_modified_missing_and_extra_files(tiny_out, tmp_path):
    out = copy_out(tiny_out[1], tmp_path / "out")
    runner = CliRunner()
    assert runner.invoke(cli, ["verify", str(out)]).exit_code == 0
    rank = out / "tiny-w8a16" / "rank0.engine"
    data = bytearray(rank.read_bytes())
    data[len(data) // 2] ^= 0x01  # one flipped bit, same size
    rank.write_bytes(bytes(data))
    (out / "tiny-fp32" / "tokenizer_config.json").write_text("{}")  # not in the manifest
    (out / "tiny-fp32" / "build_report.json").unlink()
    problems = verify(out)
    assert problems == ["tiny-fp32: build_report.json is missing",
                        "tiny-fp32: tokenizer_config.json is not in the manifest",
                        "tiny-w8a16: rank0.engine sha256 differs from the manifest (modified or corrupt)"]
    res = runner.invoke(cli, ["verify", str(out)])
    assert res.exit_code == 1 and "rank0.engine sha256 differs" in res.stdout
    assert res.stderr.strip() == f"error: 3 problem(s) in {out}"


def test_rebuild_is_byte_identical(tiny_out, tmp_path):
    spec_path, out1, first = tiny_out
    second = ci_build(load_spec(spec_path), tmp_path / "out2", threads=2)
    for name in ("tiny-fp32", "tiny-w8a16"):
        a, b = first["engines"][name], second["engines"][name]
        assert b["status"] == "pass"  # a fresh OUT: built, not skipped
        assert a["inputs_hash"] == b["inputs_hash"]
        for f in ("rank0.engine", "config.json"):
            assert a["files"][f] == b["files"][f]
            assert filecmp.cmp(out1 / name / f, tmp_path / "out2" / name / f, shallow=False)


@pytest.mark.slow
def test_failing_gate_fails_the_job_and_is_not_published(smollm2_dir, tiny_checkpoint, tmp_path):
    entries = [
        {"name": "smollm2-strict", "source": "smollm2", "build": {"max_seq_len": 256},
         # an fp32 engine cannot beat HF by 1%: this gate must fail; the greedy one must pass
         "gates": {"perplexity": {"dataset": str(DATASET), "context_len": 128, "max_tokens": 256,
                                  "max_increase_pct": -1},
                   "greedy": {"prompts": ["The capital of France is"], "max_new_tokens": 4, "min_agreement": 1}}},
        # the rest of the CI matrix (SmolLM2 w8a16, a tiny model) passes beside it
        {"name": "smollm2-w8a16", "source": "smollm2", "build": {"max_seq_len": 256, "quant": "w8a16"},
         "gates": {"perplexity": {"dataset": str(DATASET), "context_len": 128, "max_tokens": 256,
                                  "max_increase_pct": 1.0}}},
        tiny_entries(tiny_checkpoint("llama-untied"))[0],
    ]
    spec = write_spec(tmp_path / "engines.yaml", entries)
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, ["ci-build", str(spec), "--out", str(out), "--threads", "2", "-q"])
    assert res.exit_code == 1, res.output
    assert res.stderr.strip() == (f"error: 1 engine(s) failed: smollm2-strict; they are in {out}/_failed, "
                                  f"details in {out}/manifest.json")
    table = res.stdout
    assert "smollm2-strict  fail" in table and "(<= -1.0) FAIL" in table and "greedy 1.00 (>= 1.0) ok" in table
    assert "smollm2-w8a16   pass" in table and "tiny-fp32       pass" in table
    assert "3 engine(s); FAILED: smollm2-strict" in table
    manifest = json.loads((out / "manifest.json").read_text())
    strict = manifest["engines"]["smollm2-strict"]
    assert manifest["ok"] is False and strict["status"] == "fail" and strict["dir"] == "_failed/smollm2-strict"
    assert not strict["validation"]["perplexity"]["passed"] and strict["validation"]["greedy"]["passed"]
    assert abs(strict["validation"]["perplexity"]["increase_pct"]) < 0.1  # it failed on the bound, not on a bug
    assert not (out / "smollm2-strict").exists() and (out / "_failed" / "smollm2-strict" / "rank0.engine").is_file()
    assert verify(out) == []

    # Fixing the gate rebuilds it (a failed engine is never reused) and publishes it.
    entries[0]["gates"]["perplexity"]["max_increase_pct"] = 0.1
    manifest = ci_build(load_spec(write_spec(spec, entries)), out, threads=2)
    assert manifest["ok"] is True and manifest["engines"]["smollm2-strict"]["status"] == "pass"
    assert manifest["engines"]["tiny-fp32"]["status"] == manifest["engines"]["smollm2-w8a16"]["status"] == "skipped"
    assert (out / "smollm2-strict").is_dir() and not (out / "_failed" / "smollm2-strict").exists()


def test_verify_never_follows_paths_the_manifest_made_up(tiny_out, tmp_path):
    out = copy_out(tiny_out[1], tmp_path / "out")
    secret = tmp_path / "secret.txt"
    secret.write_text("not yours")
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["engines"]["tiny-fp32"]["dir"] = "../"
    manifest["engines"]["tiny-w8a16"]["files"]["../../secret.txt"] = {"size": 9, "sha256": "0" * 64}
    (out / "manifest.json").write_text(json.dumps(manifest))
    problems = verify(out)
    assert any("tiny-fp32: status" in p and "not tiny-fp32" in p for p in problems), problems
    assert any("tiny-w8a16: manifest names files outside" in p for p in problems), problems
    assert not any("secret" in p and "sha256" in p for p in problems)


def test_verify_checks_a_standalone_engine(tiny_out, tmp_path):
    engine = copy_out(tiny_out[1], tmp_path / "out") / "tiny-fp32"
    assert verify(engine) == []
    rank = engine / "rank0.engine"
    data = bytearray(rank.read_bytes())
    data[-10] ^= 0x01
    rank.write_bytes(bytes(data))
    problems = verify(engine)
    assert len(problems) == 1 and "corrupt" in problems[0], problems
