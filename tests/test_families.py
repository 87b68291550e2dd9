"""Model families beyond Llama/Mistral/Qwen2, and a build that is never silently wrong.

Exactness vs HF (fp32, bf16, greedy) and TP2 == TP1 run for every tiny family in
test_models_tiny.py and test_tensor_parallel.py; here: checkpoints labelled with the wrong
architecture are refused, RoPE tables equal transformers' own, the per-channel folds of
AWQ/SmoothQuant are exact on every family's graph, and each family runs quantized
(weight-only modes against HF with the same fake-quantized weights in test_quantization.py;
calibrated modes end to end here)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from conftest import NEW_FAMILIES, TINY_BASE, WIKITEXT, _hf_model, make_tiny_checkpoint, model_graph
from tolerances import CALIBRATED_FAMILY_REL_ERROR, CALIBRATED_MOE_REL_ERROR, INTERPRETER_ATOL

from bessemer.builder.build import build_engine
from bessemer.builder.config import BuildConfig
from bessemer.builder.input_groups import input_groups
from bessemer.ir.interpret import interpret
from bessemer.errors import InvalidOptionError, UnsupportedModelError
from bessemer.quantization.channel_scales import ChannelScales
from bessemer.quantization.config import QuantConfig
from bessemer.runtime.llm import LLM


def _hf_checkpoint(config_cls: str, out: Path, seed: int = 0, **overrides) -> Path:
    """A tiny random checkpoint of any transformers config class (not a TINY_FAMILIES one)."""
    import torch
    import transformers

    config = getattr(transformers, config_cls)(**{**TINY_BASE, **overrides})
    torch.manual_seed(seed)
    transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(out)
    return out


def _relabel(ckpt: Path, architecture: str) -> Path:
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["architectures"] = [architecture]
    (ckpt / "config.json").write_text(json.dumps(cfg))
    return ckpt


# ---------------------------------------------------------------- a build is never silently wrong

@pytest.mark.parametrize("config_cls,overrides,names", [
    # Qwen3's per-head q/k norms are tensors a Llama graph never reads
    ("Qwen3Config", dict(head_dim=16), r"checkpoint tensor model\.layers\.0\.self_attn\.k_norm\.weight \(and \d+ more\) "
                                       r"is not used by the LlamaForCausalLM graph"),
    # Granite's tensors are Llama's: its multipliers give it away
    ("GraniteConfig", dict(embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.0078,
                           logits_scaling=8.0), r"config\.json sets embedding_multiplier=12\.0, which changes"),
    # so do SmolLM3's layers without RoPE
    ("SmolLM3Config", dict(no_rope_layer_interval=2, pad_token_id=0, bos_token_id=1, eos_token_id=2),
     r"config\.json sets no_rope_layers=\[1, 0\], which changes the model's maths and LlamaForCausalLM does not"),
])
def test_checkpoint_labelled_llama_is_refused(config_cls, overrides, names, tmp_path):
    ckpt = _relabel(_hf_checkpoint(config_cls, tmp_path / "hf", **overrides), "LlamaForCausalLM")
    with pytest.raises(UnsupportedModelError, match=names + r".*correct \"architectures\" in config\.json"):
        build_engine(ckpt, tmp_path / "e")
    assert not (tmp_path / "e").exists()


def test_cli_names_the_unused_tensor(tmp_path):
    import subprocess

    ckpt = _relabel(_hf_checkpoint("Qwen3Config", tmp_path / "hf", head_dim=16), "LlamaForCausalLM")
    r = subprocess.run(["build-engine", str(ckpt), "--output", str(tmp_path / "e"), "-q"],
                       capture_output=True, text=True)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: checkpoint tensor model.layers.0")
    assert "_norm.weight" in lines[0] and not (tmp_path / "e").exists()


def test_correct_labels_still_build(tiny_checkpoint, tmp_path):
    """The same guards pass the real thing: a Qwen2 checkpoint's window fields, and an old
    checkpoint's saved rotary inv_freq buffers (explained, not used)."""
    from safetensors.numpy import load_file, save_file

    ckpt = tiny_checkpoint("qwen2")
    old = tmp_path / "old"
    old.mkdir()
    for f in ckpt.iterdir():
        (old / f.name).write_bytes(f.read_bytes())
    tensors = load_file(old / "model.safetensors")
    tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = np.ones(8, np.float32)
    save_file(tensors, old / "model.safetensors", metadata={"format": "pt"})
    build_engine(old, tmp_path / "e")
    tensors["model.layers.0.mlp.extra.weight"] = np.ones((2, 2), np.float32)
    save_file(tensors, old / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(UnsupportedModelError, match=r"model\.layers\.0\.mlp\.extra\.weight is not used"):
        build_engine(old, tmp_path / "e2")


@pytest.mark.parametrize("field,value,message", [
    ("attn_logit_softcapping", 50.0, "attn_logit_softcapping=50.0"),
    ("layer_types", ["sliding_attention", "full_attention"], "layer_types=['sliding_attention', 'full_attention']"),
    ("rope_parameters", {"rope_type": "su2", "rope_theta": 1e4}, "rope_type 'su2' is not supported"),
    ("rope_parameters", {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 2]},
     "rope parameter 'mrope_section' (rope_type default) changes the maths"),
])
def test_config_fields_that_change_the_maths_are_errors(field, value, message, tiny_checkpoint, tmp_path):
    ckpt = tmp_path / "hf"
    ckpt.mkdir()
    for f in tiny_checkpoint("llama-untied").iterdir():
        (ckpt / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg[field] = value
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModelError, match=__import__("re").escape(message)):
        build_engine(ckpt, tmp_path / "e")


def test_longrope_is_exact_only_within_its_original_context(tiny_checkpoint, tmp_path):
    with pytest.raises(InvalidOptionError, match=r"--max-seq-len 65 exceeds the original context 64 of longrope .*"
                                                 r"use --max-seq-len 64 or less"):
        build_engine(tiny_checkpoint("phi3"), tmp_path / "e", BuildConfig(max_seq_len=65))
    engine = build_engine(tiny_checkpoint("phi3"), tmp_path / "e")
    assert json.loads((engine / "config.json").read_text())["build"]["max_seq_len"] == 64


# ---------------------------------------------------------------- RoPE tables vs transformers

@pytest.mark.parametrize("params,max_positions,head_dim", [
    ({"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64}, 256, 16),
    ({"rope_type": "yarn", "rope_theta": 1e6, "factor": 8.0, "original_max_position_embeddings": 4096,
      "beta_fast": 16, "mscale": 0.707, "mscale_all_dim": 1.0, "truncate": False}, 32768, 128),
    ({"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 4096,
      "short_factor": list(np.linspace(1.0, 2.0, 48)), "long_factor": list(np.linspace(1.0, 9.0, 48)),
      "partial_rotary_factor": 0.75}, 131072, 128),
    ({"rope_type": "dynamic", "rope_theta": 500000.0, "factor": 4.0}, 8192, 64),
    ({"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 8192}, 131072, 64),
])
def test_rope_tables_equal_transformers(params, max_positions, head_dim):
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from bessemer.models.rope import rope_tables

    hf = transformers.LlamaConfig(hidden_size=head_dim * 4, num_attention_heads=4, head_dim=head_dim,
                                  max_position_embeddings=max_positions, rope_parameters=dict(params))
    inv_hf, scale_hf = ROPE_INIT_FUNCTIONS[params["rope_type"]](hf, "cpu")  # within the original context
    inv, scale, rotary_dim = rope_tables(params, head_dim, max_positions)
    assert rotary_dim == 2 * len(inv_hf) and scale == pytest.approx(scale_hf, rel=1e-12)
    np.testing.assert_allclose(inv, inv_hf.numpy(), rtol=2e-7, atol=0)


# ---------------------------------------------------------------- quantization reads roles on every family

FOLDED = {  # which linear inputs take 1/s in a producer: q/k/v, gate/up (pre-norms) and down_proj (up rows)
    "olmo2": ("down_proj",),  # post-norm: q/k/v and gate/up read the residual stream itself
    "mixtral": ("q_proj",),  # the router's input is also read by the experts: no fold
    "gpt-oss": ("q_proj",),
    "qwen2-moe": ("down_proj", "q_proj"),  # the shared expert's down_proj: into its up rows
}


@pytest.mark.parametrize("kind", ["llama-untied", *NEW_FAMILIES])
def test_channel_scale_folds_are_exact(kind, tiny_checkpoint):
    """W diag(s) on every weight reading an input with a fold, 1/s into the fold: the graph
    computes the same logits (Phi-3: up's rows of the packed gate_up_proj; OLMo2: only
    down_proj has a fold)."""
    graph, ckpt = model_graph(tiny_checkpoint(kind))
    groups = input_groups(graph)
    folded = sorted({g.key.rsplit(".", 1)[1] for g in groups if g.fold is not None})
    expect = FOLDED.get(kind, ("down_proj", "gate_up_proj", "qkv_proj") if kind == "phi3" else
                        ("down_proj", "gate_proj", "q_proj"))
    assert folded == sorted(expect)
    rng = np.random.default_rng(0)
    scales = ChannelScales()
    for g in groups:
        if g.fold is not None:
            k = graph.weight_shapes[g.weights[0]][1]
            scales.smooth(g, rng.uniform(0.25, 4.0, k).astype(np.float32))

    def smoothed(name):
        t = scales.transforms.get(name)
        return ckpt.get(name) if t is None else t.apply(ckpt.get(name))

    ids = list(range(3, 40))
    ref = interpret(graph, ckpt.get, ids)
    assert np.abs(interpret(graph, smoothed, ids) - ref).max() <= INTERPRETER_ATOL * max(1.0, np.abs(ref).max())


@pytest.fixture(scope="module")
def calibration_text(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("calib") / "text.txt"
    path.write_text(WIKITEXT.read_text(encoding="utf-8")[:60_000], encoding="utf-8")
    return path


def _with_word_tokenizer(ckpt: Path, out: Path) -> Path:
    """Calibration reads text through the checkpoint's tokenizer: a word-level one over 250 ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    out.mkdir()
    for f in ckpt.iterdir():
        (out / f.name).write_bytes(f.read_bytes())
    words = [w for w, _ in Counter(WIKITEXT.read_text(encoding="utf-8")[:200_000].split()).most_common(249)]
    tok = Tokenizer(models.WordLevel({"<unk>": 0, **{w: i + 1 for i, w in enumerate(words)}}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(out / "tokenizer.json"))
    return out


CALIBRATED = [("w4a16-awq", dict(group_size=32)), ("w4a16-gptq", dict(group_size=32)),
              ("w8a8-sq", dict(calib_backend="native", o_proj_smoothing="kernel")), ("fp8", {})]


# quantized linears per family besides qkv, o, gate_up, down of its 2 layers (MoE: routers
# stay fp32; Qwen2-MoE's shared expert and its gate are linears)
CALIBRATED_LINEARS = {"mixtral": 2 * 2, "qwen2-moe": 2 * 5, "qwen3-moe": 2 + 4}
# ... plus the experts' gate_up and down per moe layer: GPTQ per expert in w4a16-gptq, AWQ per
# expert in w4a16-awq, E4M3 in fp8 (per-token activation scales); w8a8-sq
# has no expert kernel: experts stay fp32
EXPERT_WEIGHTS = {"mixtral": 2 * 2, "qwen2-moe": 2 * 2, "qwen3-moe": 2}


@pytest.mark.parametrize("mode,options", CALIBRATED, ids=[m for m, _ in CALIBRATED])
@pytest.mark.parametrize("kind", ["olmo2", "phi3", "smollm3", "seed-oss", "qwen3", "gemma3", "granite",
                                  "mixtral", "qwen2-moe", "qwen3-moe"])
def test_calibrated_modes_build_and_stay_close(kind, mode, options, tiny_checkpoint, calibration_text,
                                               tmp_path, monkeypatch):
    monkeypatch.setenv("BESSEMER_CACHE", str(tmp_path / "cache"))
    ckpt = _with_word_tokenizer(tiny_checkpoint(kind), tmp_path / "hf")
    quant = QuantConfig(mode, calib_data=str(calibration_text), calib_samples=4, calib_seq_len=64,
                        lm_head="none", **options)
    engine = build_engine(ckpt, tmp_path / "e", BuildConfig(quant=quant, kv_block_size=4))
    report = json.loads((engine / "build_report.json").read_text())
    experts = EXPERT_WEIGHTS.get(kind, 0) if quant.algorithm in ("awq", "gptq") or mode == "fp8" else 0
    assert len(report["quant_error"]) == CALIBRATED_LINEARS.get(kind, 2 * 4) + experts  # qkv, o, gate_up, down per layer
    llm = LLM(engine, num_threads=2)
    ids = list(range(5, 45))
    ref = _hf_model(str(tiny_checkpoint(kind)), "float32")
    import torch

    with torch.no_grad():
        expected = ref(torch.tensor([ids])).logits[0].numpy()
    rel = np.abs(llm.score([ids])[0] - expected).max() / np.abs(expected).max()
    print(f"{kind} {mode}: max |engine - HF fp32| / max |HF| = {rel:.4f}")
    assert rel <= (CALIBRATED_MOE_REL_ERROR if kind in CALIBRATED_LINEARS else CALIBRATED_FAMILY_REL_ERROR)[mode]


@pytest.mark.parametrize("kind", ["phi3", "olmo2"])
def test_calibrated_tp2_equals_tp1(kind, calibration_text, tmp_path, monkeypatch):
    """One AWQ calibration, each rank its slice: Phi-3's packed rows and OLMo2's all-heads
    q/k shard like any other weight (intermediate 128: 64 per rank, whole 4-bit groups)."""
    from test_tensor_parallel import _compare

    monkeypatch.setenv("BESSEMER_CACHE", str(tmp_path / "cache"))
    ckpt = _with_word_tokenizer(make_tiny_checkpoint(kind, tmp_path / "base", intermediate_size=128), tmp_path / "hf")
    quant = QuantConfig("w4a16-awq", calib_data=str(calibration_text), calib_samples=4, calib_seq_len=64, group_size=32)
    opts = dict(quant=quant, kv_block_size=4, max_num_tokens=24)
    e1 = build_engine(ckpt, tmp_path / "tp1", BuildConfig(**opts))
    e2 = build_engine(ckpt, tmp_path / "tp2", BuildConfig(tp_size=2, **opts))
    _compare(e1, e2, 250, f"{kind} w4a16-awq")


@pytest.mark.parametrize("kind", ["phi3", "olmo2"])
def test_w8a8_sq_tp2_stays_close_to_hf(kind, calibration_text, tmp_path, monkeypatch):
    """w8a8's per-token int8 scales of a row-split input (o_proj, down_proj) are each rank's
    own, so TP2 is not TP1 bit for bit (on Llama too); it must stay as close to HF."""
    import torch

    monkeypatch.setenv("BESSEMER_CACHE", str(tmp_path / "cache"))
    base = make_tiny_checkpoint(kind, tmp_path / "base")
    ckpt = _with_word_tokenizer(base, tmp_path / "hf")
    quant = QuantConfig("w8a8-sq", calib_data=str(calibration_text), calib_samples=4, calib_seq_len=64,
                        calib_backend="native", o_proj_smoothing="kernel", lm_head="none")
    engine = build_engine(ckpt, tmp_path / "tp2", BuildConfig(quant=quant, tp_size=2, kv_block_size=4))
    ids = list(range(5, 45))
    with torch.no_grad():
        expected = _hf_model(str(base), "float32")(torch.tensor([ids])).logits[0].numpy()
    llm = LLM(engine)
    try:
        rel = np.abs(llm.score([ids])[0] - expected).max() / np.abs(expected).max()
    finally:
        llm.close()
    print(f"{kind} w8a8-sq tp2: max |engine - HF fp32| / max |HF| = {rel:.4f}")
    assert rel <= CALIBRATED_FAMILY_REL_ERROR["w8a8-sq"]


# ---------------------------------------------------------------- a target without a kernel for an op

def test_target_without_a_kernel_is_refused_naming_the_ops(tiny_checkpoint):
    """check_target refuses a graph with ops the target has no kernel for: every family's
    ops have cpu and cuda kernels now, but the cuda target has no collectives (a rank of a
    tensor-parallel graph: all_reduce after the row-split linears)."""
    from bessemer.builder.config import BuildConfig
    from bessemer.builder.passes.shard_tensor_parallel import shard_tensor_parallel
    from bessemer.builder.pipeline import check_target

    graph, _ = model_graph(tiny_checkpoint("gpt-oss"))
    check_target(graph, "cuda")  # sinks and experts: kernels now
    rank = shard_tensor_parallel(graph, BuildConfig(tp_size=2, tp_rank=0))
    with pytest.raises(UnsupportedModelError, match="all_reduce, which the cuda target has no kernel for yet"):
        check_target(rank, "cuda")


def test_gemma3_multimodal_checkpoint_builds_its_text_model(tmp_path):
    """A Gemma3ForConditionalGeneration checkpoint: the text model's graph (vision tower and
    projector tensors named as ignored) equals HF's logits on text."""
    import torch
    import transformers

    text = dict(TINY_BASE, head_dim=16, sliding_window=6, layer_types=["sliding_attention", "full_attention"],
                vocab_size=300, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                  patch_size=14)
    config = transformers.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4,
                                       image_token_index=299, boi_token_index=297, eoi_token_index=298)
    torch.manual_seed(0)
    model = transformers.Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and "language_model" in name:
                p.copy_(0.2 * torch.randn_like(p))
    model.save_pretrained(tmp_path / "hf")
    graph, ckpt = model_graph(tmp_path / "hf")
    assert graph.nodes[0].name == "language_model.model.embed_tokens"
    ids = list(range(3, 40))
    with torch.no_grad():
        ref = model(input_ids=torch.tensor([ids])).logits[0].numpy()
    assert np.abs(interpret(graph, ckpt.get, ids) - ref).max() <= INTERPRETER_ATOL


# ---------------------------------------------------------------- MXFP4 (gpt-oss experts as stored)

def _encode_mxfp4(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Test-side encoder: (E, K, N) float -> blocks (E, N, K/32, 16), scales (E, N, K/32)."""
    from bessemer.quantization.mxfp4 import FP4_VALUES

    rows = np.swapaxes(w, -1, -2)  # (E, N, K)
    groups = rows.reshape(rows.shape[:-1] + (-1, 32))
    amax = np.abs(groups).max(axis=-1)
    exp = np.clip(np.ceil(np.log2(np.maximum(amax, 1e-30) / 6.0)), -127, 127).astype(np.int32)
    scaled = groups / np.ldexp(1.0, exp)[..., None]
    codes = np.abs(np.abs(scaled)[..., None] - FP4_VALUES[:8]).argmin(axis=-1) + 8 * (scaled < 0)
    codes = codes.astype(np.uint8)
    # contiguous: safetensors' numpy writer stores an array's memory order as it is
    return (np.ascontiguousarray(codes[..., 0::2] | (codes[..., 1::2] << 4), dtype=np.uint8),
            np.ascontiguousarray(exp + 127, dtype=np.uint8))


def test_mxfp4_decode_equals_transformers():
    import torch
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    from bessemer.quantization.mxfp4 import decode_mxfp4

    rng = np.random.default_rng(0)
    blocks = rng.integers(0, 256, (3, 8, 4, 16), dtype=np.uint8)
    scales = rng.integers(120, 134, (3, 8, 4), dtype=np.uint8)
    ref = convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(scales), dtype=torch.float32)
    np.testing.assert_array_equal(decode_mxfp4(blocks, scales), ref.numpy())


def test_gpt_oss_mxfp4_checkpoint_reads_its_experts_dequantized(tiny_checkpoint, tmp_path):
    """gpt-oss with its experts stored as MXFP4 pairs: the graph reads them dequantized and
    equals HF run on the same (dequantized) weights."""
    import torch
    from safetensors.numpy import load_file, save_file

    from bessemer.quantization.mxfp4 import decode_mxfp4

    src = tiny_checkpoint("gpt-oss")
    tensors = load_file(src / "model.safetensors")
    packed, dense = dict(tensors), dict(tensors)
    for name in [n for n in tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        blocks, scales = _encode_mxfp4(tensors[name])
        del packed[name]
        packed[f"{name}_blocks"], packed[f"{name}_scales"] = blocks, scales
        dense[name] = decode_mxfp4(blocks, scales)
    for out, t in (("mxfp4", packed), ("dense", dense)):
        (tmp_path / out).mkdir()
        (tmp_path / out / "config.json").write_bytes((src / "config.json").read_bytes())
        save_file(t, tmp_path / out / "model.safetensors", metadata={"format": "pt"})
    graph, ckpt = model_graph(tmp_path / "mxfp4")
    name = "model.layers.0.mlp.experts.down_proj"  # a tensor-parallel rank's experts decode alone
    np.testing.assert_array_equal(ckpt.get(name, (1, 3, 0, 64)), ckpt.get(name)[1:3])
    ids = list(range(3, 30))
    hf = _hf_model(str(tmp_path / "dense"), "float32")
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].numpy()
    assert np.abs(interpret(graph, ckpt.get, ids) - ref).max() <= INTERPRETER_ATOL


# ---------------------------------------------------------------- new-op families through run-engine

RUN_ENGINE_FAMILIES = ["qwen3", "gemma3", "granite", "mixtral", "qwen2-moe", "qwen3-moe", "gpt-oss"]


@pytest.mark.parametrize("kind", RUN_ENGINE_FAMILIES)
def test_run_engine_chat_greedy_equals_hf(kind, smollm2_dir, tmp_path):
    """`build-engine` and `run-engine --chat` on the cpu target for each family whose ops got
    kernels: a tiny checkpoint of the family with SmolLM2's tokenizer and chat template (the
    families' own templates need the model hub, which is not reachable here); the greedy
    tokens run-engine prints equal HF generate's on the same templated ids."""
    import shutil
    import subprocess

    import torch
    from transformers import AutoModelForCausalLM

    from bessemer.runtime.tokenizer import Tokenizer

    ckpt = make_tiny_checkpoint(kind, tmp_path / "hf", vocab_size=49152)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        shutil.copy(smollm2_dir / name, ckpt / name)
    engine = tmp_path / "engine"

    def cli(*args):
        proc = subprocess.run(list(args), capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    cli("build-engine", str(ckpt), "-o", str(engine), "--max-seq-len", "256")
    out = json.loads(cli("run-engine", str(engine), "--prompt", "What is 2+2?", "--chat", "--json",
                         "--max-new-tokens", "8", "--ignore-eos", "-q").strip().splitlines()[-1])
    ids = Tokenizer(engine).encode_chat([{"role": "user", "content": "What is 2+2?"}])
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False, eos_token_id=None,
                             pad_token_id=0)[0, len(ids):].tolist()
    assert out["num_prompt_tokens"] == len(ids) and out["token_ids"] == ref
