"""Maps HF `architectures[0]` to the model file that understands it."""

from __future__ import annotations

import importlib
from types import ModuleType

from bessemer.errors import UnsupportedModelError

ARCHITECTURES = {
    "Gemma3ForCausalLM": "bessemer.models.gemma3",
    "Gemma3ForConditionalGeneration": "bessemer.models.gemma3",  # its text model
    "GptOssForCausalLM": "bessemer.models.gpt_oss",
    "GraniteForCausalLM": "bessemer.models.granite",
    "LlamaForCausalLM": "bessemer.models.llama",
    "MistralForCausalLM": "bessemer.models.mistral",
    "MixtralForCausalLM": "bessemer.models.moe",
    "Olmo2ForCausalLM": "bessemer.models.olmo2",
    "Phi3ForCausalLM": "bessemer.models.phi3",
    "Qwen2ForCausalLM": "bessemer.models.qwen2",
    "Qwen2MoeForCausalLM": "bessemer.models.moe",
    "Qwen3ForCausalLM": "bessemer.models.qwen3",
    "Qwen3MoeForCausalLM": "bessemer.models.moe",
    "SeedOssForCausalLM": "bessemer.models.seed_oss",
    "SmolLM3ForCausalLM": "bessemer.models.smollm3",
}


def family_for(hf_config: dict) -> ModuleType:
    archs = hf_config.get("architectures") or []
    if not archs:
        raise UnsupportedModelError(
            "config.json has no 'architectures' entry; add e.g. \"architectures\": [\"LlamaForCausalLM\"]")
    if archs[0] not in ARCHITECTURES:
        raise UnsupportedModelError(
            f"architecture {archs[0]!r} is not supported; supported: {', '.join(sorted(ARCHITECTURES))}")
    return importlib.import_module(ARCHITECTURES[archs[0]])
