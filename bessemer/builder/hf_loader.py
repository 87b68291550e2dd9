"""HF transformers' fp32 model of a checkpoint directory: the reference every oracle uses
(perplexity and validation gates, `bessemer diff --reference`) and the model calibration runs.

The directory is checked before torch is imported: transformers would take an engine's
config.json for a model config and a path that is not a directory for a Hub repo id.
torch and transformers are imported only when a model is loaded.
"""

from __future__ import annotations

from pathlib import Path

from bessemer.errors import BessemerError


def require_hf_checkpoint(model_dir: str | Path, purpose: str, vocab_size: int | None = None) -> Path:
    """`model_dir` if it is a HF checkpoint directory. `vocab_size`, when given, is the
    engine's, which the checkpoint's must equal (token ids index both; logits compare column
    by column)."""
    from bessemer.builder.build import is_engine_dir
    from bessemer.builder.checkpoint import load_hf_config

    d = Path(model_dir)
    if is_engine_dir(d):
        raise BessemerError(f"{d} is a Bessemer engine, not a HF checkpoint; {purpose} needs the HF checkpoint "
                            "directory the engine was built from")
    hf = load_hf_config(d)
    _check_vocabulary(d, (hf.get("text_config") or hf).get("vocab_size"), vocab_size, purpose)
    return d


def _check_vocabulary(model_dir: Path, hf_vocab: int | None, vocab_size: int | None, purpose: str) -> None:
    if None not in (hf_vocab, vocab_size) and hf_vocab != vocab_size:
        raise BessemerError(f"{model_dir} has a vocabulary of {hf_vocab} tokens and the engine one of {vocab_size}; "
                            f"{purpose} needs the HF checkpoint the engine was built from (the same tokenizer)")


def load_hf_model(model_dir: str | Path, purpose: str, threads: int | None = None, vocab_size: int | None = None):
    """HF transformers' fp32 model of a checkpoint: the reference every oracle uses.
    `purpose` names what needs it, for the errors; `vocab_size` as in require_hf_checkpoint."""
    d = require_hf_checkpoint(model_dir, purpose, vocab_size)
    try:
        import torch
        from transformers import AutoModelForCausalLM
    except ImportError:
        raise BessemerError(f"{purpose} needs torch and transformers; run `pip install torch==2.13.0 transformers`") from None
    if threads:
        torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32).eval()
    # the embedding itself, for a config.json without vocab_size
    _check_vocabulary(d, model.get_input_embeddings().num_embeddings, vocab_size, purpose)
    return model
