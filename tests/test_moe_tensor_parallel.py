"""Quantized experts under tensor parallelism on the cpu target (issue 34): each rank holds
every expert's slice of the intermediate dimension (gate/up rows, down's K columns) in the
format --quant chose on the full matrices, or (gpt-oss, stacked) whole experts, MXFP4 as
shipped included. Oracle: the same build at --tp 1, which tests/test_moe_quant.py checks
against HF on fake-quantized weights; TP runs real rank processes and must give the same
greedy tokens and logits within TP_LOGITS_* (tests/tolerances.py, as for dense TP)."""

import json

import pytest

from bessemer.builder.build import build_engine
from bessemer.builder.config import BuildConfig
from bessemer.errors import InvalidOptionError
from bessemer.quantization.config import DEFAULT_EXCLUDE, QuantConfig
from conftest import make_tiny_checkpoint
from test_moe_quant import _mxfp4_checkpoints
from test_tensor_parallel import _compare


def _header(engine, rank: int) -> dict:
    from bessemer import _C

    return json.loads(_C.EngineFile(str(engine / f"rank{rank}.engine")).header)


def _plan_ops(engine, rank: int = 0) -> set[str]:
    return {s["op"] for s in _header(engine, rank)["plan"]["steps"]}


def _expert_shapes(engine, rank: int = 0) -> dict[str, tuple]:
    return {t["name"]: tuple(t["shape"]) for t in _header(engine, rank)["tensors"] if ".experts" in t["name"]}


@pytest.fixture(scope="module")
def mixtral_128(tmp_path_factory):
    # intermediate 128: each rank's 64 is whole panels of 16 and whole 4-bit groups of 32
    return make_tiny_checkpoint("mixtral", tmp_path_factory.mktemp("hf-mixtral-128"), intermediate_size=128)


# (checkpoint, --quant, the expert kernel). qwen3-moe's experts of 32 split to 16 per rank,
# less than any 4-bit group (--group-size 32 at least): w8a16 only
CASES = [("qwen3-moe", QuantConfig("w8a16", lm_head="none"), "moe_w8a16"),
         ("mixtral-128", QuantConfig("w8a16", lm_head="none"), "moe_w8a16"),
         ("mixtral-128", QuantConfig("w4a16", group_size=32, lm_head="none"), "moe_w4a16"),
         ("gpt-oss", QuantConfig("w4a16", group_size=32, lm_head="none"), "moe_w4a16"),
         # whole experts per rank: each token's E4M3 scale is its whole row's, as at --tp 1; o_proj
         # stays fp32, its K cut would give each rank's half its own scale (FP8_DYNAMIC_TP_ERROR_RATIO's case)
         ("gpt-oss", QuantConfig("fp8", lm_head="none", fp8_rounding="nearest",
                                 exclude_modules=DEFAULT_EXCLUDE + ("*.self_attn.o_proj",)), "moe_fp8")]


@pytest.mark.parametrize("kind,quant,kernel", CASES, ids=[f"{k}-{q.mode}" for k, q, _ in CASES])
def test_quantized_experts_tp2_equal_tp1(kind, quant, kernel, tiny_checkpoint, mixtral_128, tmp_path):
    ckpt = mixtral_128 if kind == "mixtral-128" else tiny_checkpoint(kind)
    opts = dict(quant=quant, kv_block_size=4, max_num_tokens=24)
    lines = []
    e1 = build_engine(ckpt, tmp_path / "tp1", BuildConfig(**opts))
    e2 = build_engine(ckpt, tmp_path / "tp2", BuildConfig(tp_size=2, **opts), progress=lines.append)
    assert any(line.startswith(("experts: RTN", "experts: E4M3")) for line in lines), lines
    one, two = _expert_shapes(e1), _expert_shapes(e2)
    for rank in (0, 1):
        assert kernel in _plan_ops(e2, rank) and "moe" not in _plan_ops(e2, rank)
    # every rank stores half of each expert stack's codes (intermediate rows / K, or experts)
    codes = [n for n in one if not n.endswith((".scales", ".offsets", "bias"))]
    assert codes and all(two[n][0] * two[n][1] * 2 == one[n][0] * one[n][1] for n in codes), (one, two)
    _compare(e1, e2, 250, f"{kind} {quant.mode}")


def test_mxfp4_experts_kept_as_shipped_at_tp2(tiny_checkpoint, tmp_path):
    """gpt-oss's MXFP4 experts at --tp 2: each rank stores its whole experts' shipped codes."""
    mxfp4, _ = _mxfp4_checkpoints(tiny_checkpoint("gpt-oss"), tmp_path)
    opts = dict(kv_block_size=4, max_num_tokens=24)
    e1 = build_engine(mxfp4, tmp_path / "tp1", BuildConfig(**opts))
    e2 = build_engine(mxfp4, tmp_path / "tp2", BuildConfig(tp_size=2, **opts))
    name = "model.layers.0.mlp.experts.gate_up_proj"
    for rank in (0, 1):
        assert "moe_mxfp4" in _plan_ops(e2, rank) and "moe" not in _plan_ops(e2, rank)
        assert _expert_shapes(e2, rank)[name][0] * 2 == _expert_shapes(e1)[name][0]
    _compare(e1, e2, 250, "gpt-oss mxfp4")


def test_group_straddling_ranks_is_refused(tiny_checkpoint, mixtral_128, tmp_path):
    """A 4-bit group that rank 1's down columns start inside: one clear error naming the
    --group-size and --tp values that fit, and no engine. Mixtral's experts of 128 in groups
    of 128 cut at 64 (groups of 32 or 64 fit); qwen3-moe's of 32 fit no group at --tp 2.
    Attention stays float (its o_proj's K of 64 would be refused first, for the same reason)."""
    for ckpt, group, fixes in ((mixtral_128, 128, "use --group-size 32 or 64 or --tp 1"),
                               (tiny_checkpoint("qwen3-moe"), 32, "use --tp 1")):
        quant = QuantConfig("w4a16", group_size=group, lm_head="none",
                            exclude_modules=DEFAULT_EXCLUDE + ("*.self_attn.*",))
        with pytest.raises(InvalidOptionError) as e:
            build_engine(ckpt, tmp_path / "e", BuildConfig(quant=quant, tp_size=2))
        message = str(e.value)
        assert "\n" not in message and "experts' down: --tp 2 cuts its" in message, message
        assert message.endswith(f"inside a 4-bit group of {group}; {fixes}"), message
        assert not (tmp_path / "e" / "rank0.engine").exists()
