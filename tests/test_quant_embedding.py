"""--embedding: an untied embedding table stored int8 per row or int4 (symmetric groups of 32)
and gathered row by row. Oracle: HF on the same checkpoint with its embed_tokens replaced by
the format's dequantized table (every linear left unquantized, so the table is the only
difference), at the fp32 fake-quantization tolerance."""

from __future__ import annotations

import numpy as np
import pytest

from bessemer.builder.build import build_engine
from bessemer.builder.config import BuildConfig
from bessemer.errors import InvalidOptionError
from bessemer.quantization.config import QuantConfig
from bessemer.quantization.formats import WeightCalibration, scheme_format
from conftest import assert_engine_matches_hf_model
from tolerances import FP32_LOGITS_RTOL

def table_only(scheme: str) -> QuantConfig:
    # every linear excluded (lm_head too: an exclusion matching it wins): only the table changes
    return QuantConfig("w8a16", exclude_modules=("*",), embedding=scheme)


def hf_with_table(ckpt, scheme: str):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(ckpt, torch_dtype=torch.float32).eval()
    table = model.get_input_embeddings().weight  # (vocab, hidden)
    fmt = scheme_format(scheme, table.shape[1])
    w = table.detach().numpy().astype(np.float32)
    with torch.no_grad():
        table.copy_(torch.from_numpy(fmt.dequantize(fmt.quantize(w, WeightCalibration()))))
    assert model.get_output_embeddings().weight.data_ptr() != table.data_ptr(), "the checkpoint must be untied"
    return model


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_untied_table_matches_hf_with_the_dequantized_table(scheme, tiny_checkpoint, tmp_path):
    ckpt = tiny_checkpoint("llama-untied")
    plain = build_engine(ckpt, tmp_path / "plain", BuildConfig(max_seq_len=64, quant=table_only("none")))
    engine = build_engine(ckpt, tmp_path / scheme, BuildConfig(max_seq_len=64, quant=table_only(scheme)))
    size = lambda e: sum(p.stat().st_size for p in e.glob("rank*"))  # noqa: E731
    assert size(engine) < size(plain), "a quantized table is smaller than its fp32 one"
    hf = hf_with_table(ckpt, scheme)
    assert_engine_matches_hf_model(engine, hf, FP32_LOGITS_RTOL)


def test_a_tied_table_is_refused_naming_lm_head(tiny_checkpoint, tmp_path):
    with pytest.raises(InvalidOptionError, match="ties its table to lm_head.*drop --embedding"):
        build_engine(tiny_checkpoint("llama-tied"), tmp_path / "e",
                     BuildConfig(max_seq_len=64, quant=QuantConfig("w8a16", embedding="int8")))
    assert not (tmp_path / "e").exists()


def test_unknown_scheme_and_cuda_int4_are_refused():
    with pytest.raises(InvalidOptionError, match="--embedding must be one of none, int8, int4"):
        QuantConfig("w4a16", embedding="int2")
    with pytest.raises(InvalidOptionError, match="--target cuda has no embedding kernel for int4_group tables"):
        BuildConfig(target="cuda", dtype="bfloat16", quant=QuantConfig("w4a16", embedding="int4"))
