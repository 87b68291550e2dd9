"""The GPU check's reference for a quantized engine (quant_reference.py: HF with the codes and
scales read back from the engine file, dequantized in torch) against the reference the cpu
tests build (tests/cuda_interpreter/test_quantized.py, test_fp8.py, test_kv_codes.py: every
linear requantized by the format's own quantize/dequantize in NumPy, fp8 inputs rounded by
quantization/fp8.py, the KV cache's codec in attention): the same logits, on the tiny 8B
stand-in of the rehearsal (head_dim 128, untied lm_head stored int8). That the int4 nibbles,
the fused q/k/v and gate/up rows, the scales (w4k's two levels of them) and the E4M3 rounding
are read as the engine means them is what this checks; without them the logits move by orders
of magnitude more. w4k's weights are also the bits of superblock.dequantize's."""

import copy
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_models as models  # noqa: E402
from quant_reference import fake_quantized_hf  # noqa: E402

from hf_kv_quant import register_hf_kvq  # noqa: E402

from bessemer.quantization import fp8  # noqa: E402
from bessemer.quantization.config import QuantConfig  # noqa: E402
from bessemer.quantization.formats import WeightCalibration, scheme_format, weight_format  # noqa: E402


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("quant-ref") / "hf"
    models.make_checkpoint(models.TINY_SHAPES["8b"], path, "cpu")
    return path


def _cpu_tests_reference(ckpt: Path, engine: str):
    """HF fp32 as the cpu tests fake-quantize it: NumPy quantize + dequantize of each linear
    (lm_head: int8, the build's default), fp8 inputs per token, the KV codec in attention."""
    from transformers import AutoModelForCausalLM

    options = models.ENGINES[engine]
    quant = QuantConfig(**options["quant"])
    attn = register_hf_kvq("fp8") if options.get("kv_cache_dtype") == "fp8" else "eager"
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32, attn_implementation=attn).eval()
    with torch.no_grad():
        for name, mod in model.named_modules():
            if not isinstance(mod, torch.nn.Linear):
                continue
            w = mod.weight.detach().numpy().astype(np.float32)
            fmt = scheme_format("int8", w.shape[1]) if name == "lm_head" else weight_format(quant, w.shape[1])
            mod.weight.copy_(torch.from_numpy(fmt.dequantize(fmt.quantize(w, WeightCalibration()))))
            if quant.mode == "fp8" and name != "lm_head":
                def round_input(_m, args):
                    rows = args[0].detach().float().numpy().reshape(-1, args[0].shape[-1])  # (tokens, K)
                    q = fp8.fake_quant_activation(rows, fp8.token_scales(rows))
                    return (torch.from_numpy(q.reshape(args[0].shape)),)

                mod.register_forward_pre_hook(round_input)
    return model


@pytest.mark.slow  # three cuda builds: their kernels compile unless the quant rehearsal ran first
@pytest.mark.parametrize("engine", ["8b-w4a16", "8b-fp8-kvfp8", "8b-w4k"])
def test_the_reference_from_the_engines_codes_is_the_cpu_tests_reference(engine, checkpoint, tmp_path):
    from transformers import AutoModelForCausalLM

    from bessemer.builder.build import build_engine

    # the rehearsal's build options: its kernels, compiled once per session (conftest's cache)
    built = build_engine(checkpoint, tmp_path / "engine", models.build_config(engine, **models.REHEARSAL_BUILD))
    bf16 = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.bfloat16, attn_implementation="eager").eval()
    ours, notes = fake_quantized_hf(bf16, built)
    theirs = _cpu_tests_reference(checkpoint, engine)
    plain = copy.deepcopy(bf16).float()
    ids = torch.tensor([np.random.default_rng(3).integers(0, 512, 24).tolist()])
    with torch.no_grad():
        a, b, c = (m(ids).logits[0].numpy() for m in (ours, theirs, plain))
    scale = np.abs(b).max()
    assert notes["kv"] == ("fp8" if "kvfp8" in engine else None)
    print(f"{engine}: |ours - cpu tests'| {np.abs(a - b).max():.3g}, |unquantized - cpu tests'| "
          f"{np.abs(c - b).max():.3g}, max |logit| {scale:.3g}")
    assert np.abs(a - b).max() <= 1e-5 * scale
    assert np.abs(c - b).max() >= 100 * max(np.abs(a - b).max(), 1e-6 * scale)  # the check can fail
    if engine == "8b-w4k":  # the same rounding rule read from the file: every weight the same bits
        linears = [n for n, m in theirs.named_modules() if isinstance(m, torch.nn.Linear)]
        mine, cpu = dict(ours.named_modules()), dict(theirs.named_modules())
        assert notes["weights"] == {"int4_superblock": 4 * models.TINY_SHAPES["8b"]["num_hidden_layers"], "int8": 1}
        for name in linears:
            assert torch.equal(mine[name].weight.view(torch.int32), cpu[name].weight.view(torch.int32)), name
