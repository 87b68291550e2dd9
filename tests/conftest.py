"""Shared fixtures: tiny random HF checkpoints per family, the real SmolLM2, built engines.

Tiny models are made by transformers itself (the oracle), with norms and biases perturbed
so that every weight matters, and saved with save_pretrained. Engines are built once per
session through the public build_engine API.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Callable

# Under pytest-xdist (`make test` runs `-n 2`) two workers share the 2 cores: each gets one
# torch/BLAS thread, and OpenMP threads that sleep when idle instead of spinning (libgomp's
# default spin would burn the core the other worker is computing on). Set before numpy,
# torch or the engine's OpenMP runtime is loaded, which read them once at load.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from bessemer.datasets import wikitext2_valid  # noqa: E402

# The Triton-interpreter tests run only in their own process, started with TRITON_INTERPRET=1
# by tests/test_cuda_interpreter.py (kernels compiled ahead of time cannot share it).
collect_ignore = [] if os.environ.get("TRITON_INTERPRET") == "1" else ["cuda_interpreter"]

WIKITEXT = wikitext2_valid()  # ships in the package: a fresh clone has everything it needs

TINY_BASE = dict(hidden_size=64, intermediate_size=88, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=250, max_position_embeddings=256,
                 initializer_range=0.08, rms_norm_eps=1e-5)

TINY_FAMILIES = {
    "llama-untied": ("LlamaConfig", dict(tie_word_embeddings=False)),
    "llama-tied": ("LlamaConfig", dict(tie_word_embeddings=True, num_key_value_heads=1)),
    "llama3-rope": ("LlamaConfig", dict(tie_word_embeddings=False, rope_parameters={
        "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 32})),
    "mistral": ("MistralConfig", dict(sliding_window=8, head_dim=16)),
    "qwen2": ("Qwen2Config", dict(tie_word_embeddings=False)),
    # RoPE kinds on the Llama graph (yarn: fixed table + attention factor; dynamic: the
    # default table within max_position_embeddings)
    "llama-yarn": ("LlamaConfig", dict(tie_word_embeddings=False, rope_parameters={
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64})),
    "llama-dynamic": ("LlamaConfig", dict(tie_word_embeddings=False, rope_parameters={
        "rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0})),
    "seed-oss": ("SeedOssConfig", dict(attention_bias=True, attention_out_bias=True, mlp_bias=True,
                                       tie_word_embeddings=False, head_dim=16)),
    # layer 1 of 2 without RoPE
    "smollm3": ("SmolLM3Config", dict(no_rope_layer_interval=2, tie_word_embeddings=True, pad_token_id=0,
                                      bos_token_id=1, eos_token_id=2)),
    "olmo2": ("Olmo2Config", dict(tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # packed qkv_proj / gate_up_proj, a window on every layer, half the dims rotated, longrope
    "phi3": ("Phi3Config", dict(tie_word_embeddings=False, sliding_window=12, pad_token_id=0, bos_token_id=1,
                                eos_token_id=2, rope_parameters={
                                    "rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                                    "short_factor": [1.0, 1.3, 1.9, 2.6], "long_factor": [1.5, 2.0, 3.0, 4.0]},
                                original_max_position_embeddings=64)),
    # per-head q/k RMSNorm (rms_norm_heads)
    "qwen3": ("Qwen3Config", dict(head_dim=16, tie_word_embeddings=False)),
    # embedding/residual/attention/logits multipliers (scale)
    "granite": ("GraniteConfig", dict(embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.0078,
                                      logits_scaling=8.0, tie_word_embeddings=True)),
    # 1+w norms, GELU-tanh MLP (gelu_tanh_mul), sqrt(hidden) embeddings (scale), sandwich norms;
    # layer 0 local (window 6, base 10000), layer 1 global (base 1e6, linear scaling x2)
    "gemma3": ("Gemma3TextConfig", dict(head_dim=16, sliding_window=6, layer_types=["sliding_attention", "full_attention"],
                                        query_pre_attn_scalar=24, rope_parameters={
                                            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}},
                                        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # mixtures of experts (moe): softmax then top-2 of 4, renormalised or not; Qwen2-MoE's
    # sigmoid-gated shared expert; Qwen3-MoE with a dense layer (mlp_only_layers)
    "mixtral": ("MixtralConfig", dict(num_local_experts=4, num_experts_per_tok=2, tie_word_embeddings=False)),
    "qwen2-moe": ("Qwen2MoeConfig", dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                         shared_expert_intermediate_size=48, norm_topk_prob=False,
                                         tie_word_embeddings=False)),
    "qwen3-moe": ("Qwen3MoeConfig", dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, head_dim=16,
                                         norm_topk_prob=True, mlp_only_layers=[1], tie_word_embeddings=False)),
    # alternating window 6 / full layers, yarn, sinks, clamped-swiglu experts with biases
    "gpt-oss": ("GptOssConfig", dict(num_local_experts=4, num_experts_per_tok=2, head_dim=16, sliding_window=6,
                                     intermediate_size=64,  # MXFP4 blocks of 32 along K
                                     tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                     rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0,
                                                      "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                                                      "original_max_position_embeddings": 64})),
}


# the families added with the checks of issue 23 (each is also in the TP, quantization and
# fold tests of tests/test_families.py)
NEW_FAMILIES = ("llama-yarn", "llama-dynamic", "seed-oss", "smollm3", "olmo2", "phi3", "qwen3", "granite",
                "gemma3", "mixtral", "qwen2-moe", "qwen3-moe", "gpt-oss")


def make_tiny_checkpoint(kind: str, out: Path, seed: int = 0, **extra) -> Path:
    import torch
    import transformers

    config_cls, overrides = TINY_FAMILIES[kind]
    config = getattr(transformers, config_cls)(**{**TINY_BASE, **overrides, **extra})
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:  # Gemma's norms compute x * (1 + w): weights around 0
                p.copy_((0.0 if "gemma" in config.model_type else 1.0) + 0.2 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
    model.save_pretrained(out)
    return out


# Set by a test that runs pytest in a child process (test_cuda_interpreter.py) to its own
# run_dir: the child's build_once then finds what the run built (tiny checkpoints, cuda
# engines) instead of building it again in a directory of its own.
RUN_DIR_ENV = "BESSEMER_TEST_RUN_DIR"


@pytest.fixture(scope="session")
def run_dir(request, tmp_path_factory) -> Path:
    """A directory of this run that every pytest-xdist worker sees (the workers' base temp
    dirs' common parent); a plain run's own base temp dir; a child pytest's parent's run_dir
    when RUN_DIR_ENV names it. (A worker is told by its config, not by PYTEST_XDIST_WORKER,
    which the pytest children some tests start inherit.)"""
    if os.environ.get(RUN_DIR_ENV):
        return Path(os.environ[RUN_DIR_ENV])
    base = tmp_path_factory.getbasetemp()
    return base.parent if hasattr(request.config, "workerinput") else base


@contextlib.contextmanager
def run_lock(run_dir: Path, name: str):
    """An exclusive lock named `name`, shared by the workers of this run."""
    with open(run_dir / f"{name}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def build_once(run_dir: Path, name: str, build: Callable[[Path], object]) -> Path:
    """The directory `name`, filled by `build(directory)` once per run: the first xdist worker
    to ask builds it, the others wait on its lock and reuse it. Built in place (a checkpoint
    or an engine keeps the path it was built at); `.done` marks it whole."""
    out = run_dir / name
    done = out.with_name(f"{name}.done")
    with run_lock(run_dir, name):
        if not done.exists():
            shutil.rmtree(out, ignore_errors=True)  # a build that died half way
            out.mkdir(parents=True)
            build(out)
            done.touch()
    return out


def options_name(options: dict) -> str:
    """A short file name for a dict of build options (values with a stable repr)."""
    return hashlib.sha256(repr(sorted(options.items())).encode()).hexdigest()[:12]


@pytest.fixture(scope="session")
def tiny_checkpoint(run_dir):
    def get(kind: str) -> Path:
        return build_once(run_dir, f"hf-{kind}", lambda out: make_tiny_checkpoint(kind, out))

    return get


@pytest.fixture(scope="session")
def tiny_checkpoint_i128(run_dir):
    """The tiny checkpoint of a family at an intermediate size of 128 (every K of 64 and 128 a
    whole number of 32- and 64-wide groups, and two 64-wide K blocks), built once per run."""
    def get(kind: str) -> Path:
        return build_once(run_dir, f"hf-{kind}-i128", lambda out: make_tiny_checkpoint(
            kind, out, intermediate_size=128))

    return get


@pytest.fixture(scope="session")
def tiny_engine(tiny_checkpoint, run_dir):
    from bessemer.builder.build import build_engine
    from bessemer.builder.config import BuildConfig

    def get(kind: str, dtype: str = "float32", **options) -> Path:
        ckpt = tiny_checkpoint(kind)
        return build_once(run_dir, f"engine-{kind}-{dtype}-{options_name(options)}", lambda out: build_engine(
            ckpt, out / "engine", BuildConfig(dtype=dtype, **options))) / "engine"

    return get


def model_graph(model_dir: Path):
    """(the family's graph before passes, its Checkpoint) of a HF checkpoint directory."""
    from bessemer.builder.checkpoint import Checkpoint
    from bessemer.models.registry import family_for

    ckpt = Checkpoint(Path(model_dir))
    family = family_for(ckpt.config)
    return family.build_graph(family.config_from_hf(ckpt.config), ckpt.shapes()), ckpt


def linear_input_keys(model_dir: Path) -> dict[str, str]:
    """{linear module: the key calibration records its input under}, from the model's graph."""
    from bessemer.builder import input_groups as ig

    graph, ckpt = model_graph(model_dir)
    ckpt.close()
    return ig.linear_input_keys(ig.input_groups(graph))


def llama_input_key(module: str) -> str:
    """The oracle's own (name-based) view of a Llama layer: k/v read q_proj's input and
    up_proj reads gate_proj's; what the builder derives from the graph must agree."""
    parent, _, leaf = module.rpartition(".")
    return f"{parent}.{ {'k_proj': 'q_proj', 'v_proj': 'q_proj', 'up_proj': 'gate_proj'}.get(leaf, leaf)}"


def hf_logits(model_dir: Path, token_ids: list[int], dtype: str = "float32") -> np.ndarray:
    import torch

    model = _hf_model(str(model_dir), dtype)
    with torch.no_grad():
        return model(torch.tensor([token_ids])).logits[0].float().numpy()


def assert_engine_matches_hf_model(engine: Path, hf, rtol: float,
                                   prompts=(tuple(range(5, 25)), (7, 8, 9))) -> None:
    """The engine's logits at every position of each prompt (LLM.score, two sequences
    prefilled together) within FAKE_QUANT_LOGITS_ATOL + rtol * max|HF's| of an HF model's
    (usually the checkpoint with the engine's fake-quantized weights)."""
    import torch

    from bessemer.runtime.llm import LLM
    from tolerances import FAKE_QUANT_LOGITS_ATOL

    prompts = [list(p) for p in prompts]
    for ids, out in zip(prompts, LLM(engine, num_threads=2).score(prompts, num_prefill=2)):
        with torch.no_grad():
            ref = hf(torch.tensor([ids])).logits[0].numpy()
        err = np.abs(out - ref).max()
        assert err <= FAKE_QUANT_LOGITS_ATOL + rtol * np.abs(ref).max(), err


_HF_CACHE: dict = {}


def _hf_model(path: str, dtype: str):
    import torch
    from transformers import AutoModelForCausalLM

    key = (path, dtype)
    if key not in _HF_CACHE:
        _HF_CACHE[key] = AutoModelForCausalLM.from_pretrained(
            path, dtype=getattr(torch, dtype), attn_implementation="eager").eval()
    return _HF_CACHE[key]


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    from bessemer.fixtures.smollm2 import ensure_smollm2

    return ensure_smollm2(progress=lambda msg: None)


@pytest.fixture(scope="session")
def smollm2_engine(smollm2_dir, run_dir):
    """The SmolLM2 engine per dtype, built once per run (one build for all xdist workers)."""
    from bessemer.builder.build import build_engine
    from bessemer.builder.config import BuildConfig

    def get(dtype: str = "float32") -> Path:
        return build_once(run_dir, f"smollm2-{dtype}", lambda out: build_engine(
            smollm2_dir, out / "engine", BuildConfig(dtype=dtype, max_seq_len=2048))) / "engine"

    return get


@pytest.fixture(scope="session")
def smollm2_fp32_perplexity(smollm2_engine, run_dir) -> tuple[list[list[int]], float]:
    """(windows, perplexity) of the fp32 SmolLM2 engine on the short CI protocol: the first
    2048 tokens of WikiText-2 valid (its first 20000 characters) in windows of 512. The
    baseline of the perplexity tests of test_smollm2 (vs HF), test_quant_smollm2 and
    test_w8a8_sq (vs quantized engines): scored once per run, by the first xdist worker to
    ask, and read back by the others (the score is a deterministic function of the engine)."""
    from bessemer.runtime.evaluate import perplexity, windows
    from bessemer.runtime.llm import LLM

    def score(out: Path) -> None:
        llm = LLM(smollm2_engine("float32"), num_threads=2)
        wins = windows(llm.tokenizer.encode(WIKITEXT.read_text(encoding="utf-8")[:20000],
                                            add_special_tokens=False), 512, 2048)
        result = {"windows": wins, "perplexity": perplexity(llm.score, wins).perplexity}
        (out / "fp32.json").write_text(json.dumps(result))

    result = json.loads((build_once(run_dir, "smollm2-fp32-perplexity-2048", score) / "fp32.json").read_text())
    return result["windows"], result["perplexity"]


@pytest.fixture(scope="session")
def calibration_text(tmp_path_factory) -> Path:
    """Calibration text held out from evaluation: the second half of WikiText-2 valid.
    Perplexity is scored on the file's first tokens, so calibrating on them would leak."""
    text = WIKITEXT.read_text(encoding="utf-8")
    path = tmp_path_factory.mktemp("calib") / "wikitext-2-valid-second-half.txt"
    path.write_text(text[len(text) // 2:], encoding="utf-8")
    return path


# The calibration protocol of the SmolLM2 4-bit quantization tests (AWQ, GPTQ, mixed precision):
# few samples so CI stays quick; the closing notes' tables use bench/quant.py's larger one.
SMOLLM2_CALIB = dict(calib_samples=16, calib_seq_len=256)


@pytest.fixture(scope="session")
def smollm2_calibration(smollm2_dir, calibration_text, run_dir) -> Path:
    """The held-out calibration text, with SmolLM2's activation statistics on it (Hessians
    included) in the calibration cache: collected once per run by the first xdist worker to ask,
    under a lock, so that the builds of the tests that use this protocol read them from the cache
    instead of each running the HF model (up to three times over, two workers at once)."""
    from bessemer.builder import input_groups as ig
    from bessemer.quantization.calibration import CalibrationSpec, collect

    graph, ckpt = model_graph(smollm2_dir)
    ckpt.close()
    spec = CalibrationSpec(calibration_text, SMOLLM2_CALIB["calib_samples"], SMOLLM2_CALIB["calib_seq_len"])
    with run_lock(run_dir, "smollm2-calibration"):
        collect(smollm2_dir, spec, [g.key for g in ig.input_groups(graph)], hessian=True)
    return calibration_text


def pytest_configure(config):
    # Torch and the engine share the 2 cores; keep torch from oversubscribing them.
    os.environ.setdefault("OMP_NUM_THREADS", "2")


# A test that needs the real SmolLM2 (its checkpoint, or an engine built from it) builds or
# loads a 135M model: seconds to minutes on 2 cores. `make check` leaves them to `make test`;
# the tiny-checkpoint oracles of every family, kernel, format and pass stay in the edit loop.
REAL_MODEL_FIXTURES = {"smollm2_dir", "smollm2_engine"}


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config, items):
    """Under `--dist loadgroup` (make test), the tests of a module that use one of its
    module-scoped fixtures (a server, an engine, a perplexity baseline) run on one worker,
    which sets that fixture up once; every other test goes to whichever worker is free."""
    for item in items:
        if REAL_MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
        fixture_defs = getattr(item, "_fixtureinfo", None)
        if fixture_defs and any(defs[-1].scope == "module" for defs in fixture_defs.name2fixturedefs.values()):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
    # Longest first: xdist hands out the groups (largest first), then the other tests in this
    # order, each to whichever worker asks. With the slow tests (up to two minutes each) ahead
    # of the thousand quick ones, the quick ones even out the two workers at the end instead of
    # one worker finishing a slow test alone. A stable sort: a group's tests keep their order.
    items.sort(key=lambda item: not (item.get_closest_marker("slow") or item.get_closest_marker("xdist_group")))


LOST_GROUPS = pytest.StashKey[set]()


@pytest.hookimpl(trylast=True)  # after pytest-xdist's worker has named the groups
def pytest_collection_finish(session):
    """Notes the tests of a `--dist loadgroup` run whose xdist group was lost (on the workers a
    grouped test's node id ends in "@group"): without it a module fixture is set up on every
    worker, and again each time a worker comes back to its module, minutes of CI on 2 cores."""
    if getattr(session.config.option, "loadgroup", False):  # set on the workers of a loadgroup run
        session.config.stash[LOST_GROUPS] = {  # xdist's rule: an "@" after the last "]"
            item.nodeid for item in session.items
            if item.get_closest_marker("xdist_group") and item.nodeid.rfind("@") <= item.nodeid.rfind("]")}


def pytest_runtest_setup(item):
    if item.nodeid in item.config.stash.get(LOST_GROUPS, ()):
        pytest.fail("pytest-xdist's --dist loadgroup lost this test's group: this pytest and pytest-xdist do not "
                    "work together; install the versions setup.py's test extra pins (pip install -e '.[test]')",
                    pytrace=False)


@pytest.fixture(scope="session", autouse=True)
def kernel_cache(run_dir):
    """One cuda kernel cache for the run (its xdist workers and the interpreter child
    processes, which inherit it): hermetic, and every distinct kernel is compiled once."""
    path = os.environ.get("BESSEMER_KERNEL_CACHE")
    if path is None:
        # shared by the xdist workers too: entries are written atomically and checked on read
        cache = run_dir / "kernel-cache"
        cache.mkdir(exist_ok=True)
        path = os.environ["BESSEMER_KERNEL_CACHE"] = str(cache)
    return path


@pytest.fixture(scope="session")
def cuda_engine(tiny_checkpoint, run_dir, kernel_cache):
    """Tiny cuda engines built through the public API (kernels compiled once per session)."""
    pytest.importorskip("triton", reason="pip install 'bessemer[cuda]' to test the cuda target")
    from bessemer.builder.build import build_engine
    from bessemer.builder.config import BuildConfig

    def get(kind: str, **options) -> Path:
        options = {"dtype": "bfloat16", "kv_block_size": 4, "max_num_tokens": 24, "max_seq_len": 128, **options}
        ckpt = tiny_checkpoint(kind)
        return build_once(run_dir, f"cuda-engine-{kind}-{options_name(options)}", lambda out: build_engine(
            ckpt, out / "engine", BuildConfig(target="cuda", **options))) / "engine"

    return get


@pytest.fixture(scope="session")
def quant_cuda_engine(run_dir, kernel_cache):
    """Tiny cuda engines at an intermediate size of 128 (a whole number of 32-wide groups, and
    two 64-wide K blocks: the decode GEMMs split K), quantized with group size 32 or, for
    quant "none", bf16; built once per run."""
    pytest.importorskip("triton", reason="pip install 'bessemer[cuda]' to test the cuda target")
    from bessemer.builder.build import build_engine
    from bessemer.builder.config import BuildConfig
    from bessemer.quantization.config import QuantConfig

    def get(kind: str, quant: str) -> Path:
        def build(out: Path) -> None:
            ckpt = make_tiny_checkpoint(kind, out / "hf", intermediate_size=128)
            build_engine(ckpt, out / "engine", BuildConfig(
                target="cuda", dtype="bfloat16", kv_block_size=4, max_num_tokens=24, max_seq_len=128,
                quant=None if quant == "none" else QuantConfig(quant, group_size=32)))

        return build_once(run_dir, f"cuda-engine-{kind}-{quant}-g32", build) / "engine"

    return get


def moe_routing_margin(ckpt, ids) -> np.ndarray | None:
    """router_margin of HF fp32 on checkpoint ckpt."""
    return router_margin(_hf_model(str(ckpt), "float32"), ids)


def router_margin(model, ids) -> np.ndarray | None:
    """Per position, the smallest gap over the layers between the k-th and (k+1)-th router
    logit of an HF MoE model (None for a model that does not report its router logits)."""
    import torch

    with torch.no_grad():
        out = model(torch.tensor([ids]), output_router_logits=True)
    if not getattr(out, "router_logits", None):
        return None
    k = model.config.num_experts_per_tok
    gaps = [np.diff(np.sort(r.float().numpy(), axis=-1)[:, -k - 1:-k + 1 or None], axis=-1)[:, 0]
            for r in out.router_logits]
    return np.min(np.stack(gaps), axis=0)
