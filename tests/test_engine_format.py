"""The engine format: round trip, determinism, and refusal of damaged or foreign engines."""

import json
import shutil

import numpy as np
import pytest

from bessemer.format import container as fmt
from bessemer.format.layouts import LAYOUT_IDS, pack_panel16
from bessemer.builder.build import build_engine
from bessemer.builder.config import BuildConfig
from bessemer.errors import EngineLoadError
from bessemer.runtime.llm import LLM


def test_build_is_byte_identical(tiny_checkpoint, tmp_path):
    ckpt = tiny_checkpoint("llama-tied")
    a = build_engine(ckpt, tmp_path / "a", BuildConfig(dtype="bfloat16"))
    b = build_engine(ckpt, tmp_path / "b", BuildConfig(dtype="bfloat16"))
    for name in ("rank0.engine", "config.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_round_trip_header_and_tensors(tiny_checkpoint, tmp_path):
    ckpt = tiny_checkpoint("llama-untied")
    engine = build_engine(ckpt, tmp_path / "e", BuildConfig())
    config = json.loads((engine / "config.json").read_text())
    major, minor, header, data_offset = fmt.read_rank_header(engine / "rank0.engine")
    assert (major, minor) == (fmt.FORMAT_MAJOR, fmt.FORMAT_MINOR)
    assert data_offset % fmt.DATA_ALIGN == 0
    assert config["ranks"][0]["sha256"] == fmt.sha256_file(engine / "rank0.engine")
    # a tensor read back from the file equals the checkpoint tensor, packed
    from safetensors.numpy import load_file

    hf = load_file(str(ckpt / "model.safetensors"))
    entry = next(t for t in header["tensors"] if t["name"] == "model.layers.1.mlp.down_proj.weight")
    raw = (engine / "rank0.engine").read_bytes()[data_offset + entry["offset"]:][: entry["nbytes"]]
    w = hf["model.layers.1.mlp.down_proj.weight"]
    assert entry["layout"] == LAYOUT_IDS["panel16"] and entry["offset"] % fmt.TENSOR_ALIGN == 0
    assert np.frombuffer(raw, np.float32).tobytes() == pack_panel16(w).tobytes()
    # the fused qkv weight is the concatenation of q, k, v
    qkv = next(t for t in header["tensors"] if t["name"] == "model.layers.0.self_attn.qkv_proj.weight")
    assert qkv["shape"] == [64 + 32 + 32, 64]


def _copy(engine, tmp_path):
    dst = tmp_path / "copy"
    shutil.copytree(engine, dst)
    return dst


def test_corrupted_rank_file_is_refused(tiny_engine, tmp_path):
    engine = _copy(tiny_engine("llama-untied"), tmp_path)
    path = engine / "rank0.engine"
    data = bytearray(path.read_bytes())
    data[-100] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(EngineLoadError, match="corrupt"):
        LLM(engine)


def test_truncated_rank_file_is_refused(tiny_engine, tmp_path):
    engine = _copy(tiny_engine("llama-untied"), tmp_path)
    path = engine / "rank0.engine"
    path.write_bytes(path.read_bytes()[:5000])
    with pytest.raises(EngineLoadError, match="truncated"):
        LLM(engine)


def test_other_format_major_is_refused(tiny_engine, tmp_path):
    engine = _copy(tiny_engine("llama-untied"), tmp_path)
    config = json.loads((engine / "config.json").read_text())
    config["bessemer_format"]["major"] = 99
    (engine / "config.json").write_text(json.dumps(config))
    with pytest.raises(EngineLoadError, match=r"format 99\..*not supported.*rebuild"):
        LLM(engine)


def test_other_target_is_refused(tiny_engine, tmp_path):
    engine = _copy(tiny_engine("llama-untied"), tmp_path)
    config = json.loads((engine / "config.json").read_text())
    config["target"] = "tensorrt"
    (engine / "config.json").write_text(json.dumps(config))
    with pytest.raises(EngineLoadError, match="tensorrt"):
        LLM(engine)


def test_rank_file_header_bounds_are_checked(tiny_engine, tmp_path):
    """A file whose own header claims more bytes than it has is refused by the C++ reader,
    even when config.json was edited to match (no checksum verification)."""
    engine = _copy(tiny_engine("llama-untied"), tmp_path)
    path = engine / "rank0.engine"
    data = bytearray(path.read_bytes())
    data[16:24] = (len(data) * 2).to_bytes(8, "little")
    path.write_bytes(bytes(data))
    with pytest.raises(EngineLoadError):
        LLM(engine, verify_checksum=False)


def _resign(engine, mutate):
    """Rewrite rank0's header with `mutate(header)` applied and sign the result in config.json,
    as an attacker (or a buggy tool) could: the checksum then passes and only the loader's own
    checks stand between the file and the kernels."""
    path = engine / "rank0.engine"
    major, minor, header, data_offset = fmt.read_rank_header(path)
    mutate(header)
    # JSON has no NaN/Infinity; a number too large for a double is how one reaches the parser
    blob = fmt.header_bytes(header).replace(b'"OVERFLOW"', b"1e999")
    pad = fmt.align_up(fmt.PREAMBLE.size + len(blob), fmt.DATA_ALIGN)
    out = fmt.PREAMBLE.pack(fmt.MAGIC, major, minor, 0, len(blob)) + blob
    path.write_bytes(out + b"\0" * (pad - len(out)) + path.read_bytes()[data_offset:])
    config = json.loads((engine / "config.json").read_text())
    config["ranks"][0].update(sha256=fmt.sha256_file(path), size=path.stat().st_size)
    (engine / "config.json").write_text(json.dumps(config))


def _share_bytes(header):
    a, b = header["tensors"][0], header["tensors"][1]
    b["offset"] = a["offset"] + fmt.TENSOR_ALIGN * (a["nbytes"] > fmt.TENSOR_ALIGN)


def _read_before_write(header):
    steps = header["plan"]["steps"]
    first_reader = next(i for i, s in enumerate(steps) if s["ins"])
    steps.insert(0, steps.pop(first_reader))


@pytest.mark.parametrize("mutate, message", [
    (_share_bytes, r"overlaps tensor"),
    (lambda h: h["plan"].update(steps=[]), r"plan has no steps"),
    (lambda h: h["plan"]["steps"][1]["attrs"].update(eps=float("nan")), r"header JSON: invalid value"),
    (lambda h: h["plan"]["steps"][1]["attrs"].update(eps="OVERFLOW"), r"attr 'eps' must be a finite number"),
    (_read_before_write, r"reads view \[\d+, \d+, \d+\] that no earlier step wrote"),
    (lambda h: h["plan"]["steps"].pop(), r"logits view .* is never written"),
])
def test_re_signed_engine_with_an_inconsistent_header_is_refused(tiny_engine, tmp_path, mutate, message):
    engine = _copy(tiny_engine("llama-untied"), tmp_path)
    _resign(engine, mutate)
    with pytest.raises(EngineLoadError, match=message):
        LLM(engine)
