"""config.json is read before any checksum covers it: damaged values are refused with one
line at load (and by inspect), never followed, hashed forever or spun on."""

import json
import re
import shutil

import pytest

from bessemer.errors import EngineLoadError
from bessemer.runtime.engine import Engine
from test_cli import assert_clean_error, run


def _damaged(tiny_engine, tmp_path, edit):
    d = tmp_path / "engine"
    shutil.copytree(tiny_engine("llama-untied"), d)
    config = json.loads((d / "config.json").read_text())
    edit(config)
    (d / "config.json").write_text(json.dumps(config))
    return d


@pytest.mark.parametrize("case, edit, needle", [
    ("zero batch", lambda c: c["build"].update(max_batch_size=0), "max_batch_size"),
    ("zero tokens", lambda c: c["build"].update(max_num_tokens=0), "max_num_tokens"),
    ("string limit", lambda c: c["build"].update(kv_block_size="16"), "kv_block_size"),
    ("parent path", lambda c: c["ranks"][0].update(file="../rank0.engine"), "plain file name"),
    ("absolute path", lambda c: c["ranks"][0].update(file="/dev/zero"), "plain file name"),
    ("no ranks", lambda c: c.update(ranks=[]), "no rank files"),
    ("bad digest", lambda c: c["ranks"][0].update(sha256="zz"), "sha256"),
    ("not an object", lambda c: c["ranks"].__setitem__(0, 7), "ranks[0]"),
])
def test_damaged_config_is_refused_at_load_and_by_inspect(tiny_engine, tmp_path, case, edit, needle):
    d = _damaged(tiny_engine, tmp_path, edit)
    with pytest.raises(EngineLoadError, match=re.escape(needle)):
        Engine.load(d)
    assert_clean_error(run("bessemer", "inspect", str(d)), needle)


def test_a_rank_file_that_is_a_device_is_refused(tiny_engine, tmp_path):
    d = _damaged(tiny_engine, tmp_path, lambda c: None)
    (d / "rank0.engine").unlink()
    (d / "rank0.engine").symlink_to("/dev/zero")  # a link to a regular file elsewhere is fine
    with pytest.raises(EngineLoadError, match="not a regular file"):
        Engine.load(d)


def test_inspect_reports_a_damaged_rank_file_as_damaged(tiny_engine, tmp_path):
    d = _damaged(tiny_engine, tmp_path, lambda c: None)
    rank = d / "rank0.engine"
    data = bytearray(rank.read_bytes())
    data[-100] ^= 0xFF  # one weight byte
    rank.write_bytes(bytes(data))
    assert_clean_error(run("bessemer", "inspect", str(d)), "corrupt")
    rank.write_bytes(bytes(data[:len(data) // 2]))  # truncated
    assert_clean_error(run("bessemer", "inspect", str(d)), "truncated")


@pytest.mark.parametrize("name, content, needle", [
    ("tokenizer_config.json", "{not json", "tokenizer_config.json is not valid JSON"),
    ("tokenizer_config.json", "[1, 2]", "is not a JSON object"),
    ("generation_config.json", "{\"eos_token_id\": \"two\"}", "eos_token_id"),
    ("generation_config.json", b"\xff\xfe{", "generation_config.json is not valid JSON"),
    ("tokenizer.json", "{\"model\": 5}", "cannot be read as a tokenizer"),
])
def test_damaged_tokenizer_files_are_one_line(smollm2_engine, tmp_path, name, content, needle):
    src = smollm2_engine("bfloat16")
    d = tmp_path / "engine"
    d.mkdir()
    for f in src.iterdir():
        (d / f.name).symlink_to(f)
    (d / name).unlink(missing_ok=True)
    (d / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    assert_clean_error(run("run-engine", str(d), "--prompt", "hi", "--max-new-tokens", "2"), needle)
