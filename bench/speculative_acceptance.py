"""What the equal-draw acceptance rule costs a draft engine on sampled requests, exactly.

At each position of the target's own sampled text (chat prompts, --max-tokens per prompt,
seed 1), from the target's and the draft engine's logits there (LLM.score), with p and q
their sampling distributions (temperature, top-k, top-p), the probability that a draft is
accepted under:
  rejection rule   sum min(p, q): accept with min(1, p/q), else draw from max(0, p - q)
                   (Leviathan et al. 2023; this engine's rule before seeded streams)
  equal draw       the rule the engine uses (speculative/acceptance.py): the draft and the
                   target both draw by inverse CDF in vocabulary order at the position's
                   uniform; accepted iff equal: the overlap of the two CDFs' intervals
  gumbel coupling  (not implemented; what a per-token Gumbel-max draw would accept, which
                   needs a number per vocabulary entry and the device sampler changed too)
                   Monte-Carlo over 64 Gumbel vectors per position
Averaged over positions. Prompt lookup (n-gram) drafts are unaffected: for a point mass q
the two rules both accept with p(draft).

    python bench/speculative_acceptance.py --target ENGINE --draft ENGINE [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from speculative import GROUNDED, OPEN  # noqa: E402  (the prompts of bench/speculative.py)

SETTINGS = ((1.0, 0, 1.0), (0.7, 0, 1.0), (1.0, 50, 0.9))  # temperature, top_k, top_p


def dense(logits: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """(vocab,) probabilities of sampler.distribution, zero outside what it keeps."""
    from bessemer.runtime.sampler import distribution

    cands, probs = distribution(logits, temperature, top_k, top_p)
    out = np.zeros(len(logits))
    out[cands] = probs
    return out


def acceptance(p: np.ndarray, q: np.ndarray, gumbels: np.ndarray) -> tuple[float, float, float]:
    """p, q: (vocab,); gumbels: (samples, vocab). Rejection rule, equal draw, Gumbel coupling."""
    fp, fq = np.cumsum(p), np.cumsum(q)
    overlap = np.maximum(0.0, np.minimum(fp, fq) - np.maximum(fp - p, fq - q)).sum()
    with np.errstate(divide="ignore"):
        same = np.mean(np.argmax(np.log(p) + gumbels, 1) == np.argmax(np.log(q) + gumbels, 1))
    return float(np.minimum(p, q).sum()), float(overlap), float(same)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True, type=Path)
    ap.add_argument("--draft", required=True, type=Path)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    from bessemer.runtime.llm import LLM, SamplingParams

    target, draft = LLM(args.target, num_threads=args.threads), LLM(args.draft, num_threads=args.threads)
    prompts = [target.tokenizer.encode_chat([{"role": "user", "content": p}]) for p in GROUNDED + OPEN]
    rng = np.random.default_rng(0)
    print("| temperature, top_k, top_p | positions | rejection rule | equal draw (used) | gumbel coupling |")
    print("|---|---|---|---|---|")
    for temperature, top_k, top_p in SETTINGS:
        params = SamplingParams(max_tokens=args.max_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                                seed=1, ignore_eos=True)
        texts = [ids + out.token_ids for ids, out in zip(prompts, target.generate(prompts, params))]
        sums, n = np.zeros(3), 0
        for ids, lt, ld in zip(prompts, target.score(texts), draft.score(texts)):
            for i in range(len(ids) - 1, len(lt) - 1):  # rows that predict a generated token
                p, q = dense(lt[i], temperature, top_k, top_p), dense(ld[i], temperature, top_k, top_p)
                sums += acceptance(p, q, rng.gumbel(size=(64, len(p))))
                n += 1
        r, e, g = sums / n
        print(f"| {temperature}, {top_k}, {top_p} | {n} | {r:.3f} | {e:.3f} | {g:.3f} |", flush=True)


if __name__ == "__main__":
    main()
