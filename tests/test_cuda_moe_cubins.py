"""The quantized expert kernels (kernels/moe_grouped.py) compiled for sm_90a at a
Qwen3-30B-A3B-like routing (128 experts, top-8) as the cuda lowering instantiates them for
--quant w8a16, w4a16 (symmetric and asymmetric) and fp8 (E4M3 codes, per-token E4M3
activations), and for gpt-oss's MXFP4 experts as shipped
(128 experts, top-4), each cubin checked without a GPU as
tests/test_cuda_smollm2.py checks an engine's: ELF arch, parameter table equal to the
metadata, .reqntid = 32 x num_warps, no register spills; and the grouped GEMMs' dots on
tensor cores (HMMA: 16-row mma.sync tiles; E4M3 x E4M3 too, which Triton runs on sm_90 as fp16
mma.sync on the widened codes, exact). Only the moe launches are compiled (the rest of
the plan is the dense kernels the other cubin tests check)."""

from pathlib import Path

import pytest

pytest.importorskip("triton", reason="pip install 'bessemer[cuda]' to test the cuda target")

from bessemer.builder.config import BuildConfig  # noqa: E402
from bessemer.builder.pipeline import run_passes  # noqa: E402
from bessemer.format.kv import kv_cache_section  # noqa: E402
from bessemer.quantization.config import QuantConfig  # noqa: E402
from bessemer.targets.cuda.compile import compile_kernels  # noqa: E402
from bessemer.targets.cuda.cubin import check_kernel, read_cubin, tensor_core_counts  # noqa: E402
from bessemer.targets.cuda.plan import kernel_entry  # noqa: E402

GROUPED_GEMMS = {"moe_gate_up_grouped_kernel", "moe_down_grouped_kernel"}


@pytest.mark.slow
def test_grouped_expert_cubins_pass_the_checks(tmp_path, kernel_cache):
    from conftest import make_tiny_checkpoint, model_graph
    from test_moe_quant import _mxfp4_checkpoints
    from bessemer.targets.cuda.lower import lower_cuda

    def grouped_specs(model_dir, quant) -> list:
        graph, ckpt = model_graph(model_dir)
        ckpt.close()
        build = BuildConfig(target="cuda", dtype="bfloat16", quant=quant, max_num_tokens=256, max_seq_len=128)
        graph, _ = run_passes(graph, build)
        plan, _ = lower_cuda(graph, build, kv_cache_section(2, 4, 16, "bfloat16"))
        return [s for s in plan.kernel_specs() if s.module.endswith("moe_grouped")]

    qwen = make_tiny_checkpoint("qwen3-moe", tmp_path / "qwen", num_experts=128, num_experts_per_tok=8,
                                moe_intermediate_size=64, intermediate_size=128)
    gpt_oss = make_tiny_checkpoint("gpt-oss", tmp_path / "gpt-oss", num_local_experts=128, num_experts_per_tok=4)
    specs = grouped_specs(_mxfp4_checkpoints(gpt_oss, tmp_path)[0], None)  # MXFP4 as shipped
    for quant in (QuantConfig("w8a16"), QuantConfig("w4a16", group_size=32),
                  QuantConfig("w4a16", group_size=32, zero_point=True),
                  QuantConfig("fp8", fp8_rounding="nearest", fp8_activations="dynamic")):
        specs += [s for s in grouped_specs(qwen, quant) if s not in specs]
    codes = {tuple(dict(s.constexprs).get(c) for c in ("BITS", "MXFP4", "FP8", "SYMMETRIC")) + (s.function,)
             for s in specs if s.function in GROUPED_GEMMS}
    assert codes == {(*code, f) for f in GROUPED_GEMMS for code in (
        (8, False, False, True), (4, False, False, True), (4, False, False, False), (4, True, False, True),
        (8, False, True, True))}
    assert {dict(s.constexprs).get("BLOCK_E") for s in specs} - {None} == {128}
    kernels, _ = compile_kernels(specs, "sm_90", Path(kernel_cache))
    for spec, kernel in zip(specs, kernels):
        entry = kernel_entry(0, spec, kernel.metadata, "sm_90a")
        assert check_kernel(kernel.cubin, entry, "sm_90a") == [], (spec.function, dict(spec.constexprs))
        assert read_cubin(kernel.cubin).reqntid == (32 * entry["num_warps"], 1, 1)
        assert entry["ptxas"]["spill_store_bytes"] == 0, (spec.function, entry["ptxas"])
        shown = ("BITS", "MXFP4", "FP8", "SYMMETRIC", "BLOCK_K")
        ops = tensor_core_counts(kernel.cubin)  # one cuobjdump run: about a second of CPU
        print(spec.function, {k: v for k, v in spec.constexprs if k in shown},
              f"{entry['ptxas']['registers']} registers", ops)
        if spec.function in GROUPED_GEMMS:
            assert "HMMA" in ops, (spec.function, dict(spec.constexprs))
