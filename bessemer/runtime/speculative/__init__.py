"""Speculative decoding: draft k tokens cheaply, verify them in one target step.

`config` says how (n-gram lookup or a draft engine), `ngram` and `draft_model` propose,
`drafting` adds the proposals to a step's decode chunks, `acceptance` decides what the target
accepts (in runtime/sampling_step.py): the drafts equal to its own draws, so the output is
the output without drafts. The engine core (runtime/llm_engine.py) drives them;
the scheduler gives each drafting sequence 1 + k tokens and rolls back the KV of rejected
ones.
"""

from bessemer.runtime.speculative.config import SpeculativeConfig

__all__ = ["SpeculativeConfig", "make_proposer"]


def make_proposer(config: SpeculativeConfig, target, options):
    """The proposer for `config`; `target` is the LLMEngine whose vocabulary drafts must share,
    `options` its RunOptions (targets/__init__.py), from which a draft engine's are derived."""
    if config.method == "ngram":
        from bessemer.runtime.speculative.ngram import NgramProposer

        return NgramProposer(config.ngram_min, config.ngram_max)
    from bessemer.runtime.speculative.draft_model import DraftModelProposer

    return DraftModelProposer(config.draft_engine, target, options)
