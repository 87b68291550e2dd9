"""Which kernels of an engine are not batch-invariant: each plan step of one layer (and the
final logits) computed for one request alone, and for the same request inside other step
shapes; any bit that differs is reported.

    python bench/batch_invariance.py ENGINE_DIR [ENGINE_DIR ...] [--threads 2] [--layer 0]

The request is a prompt of N tokens. Its reference is one prefill step of the N tokens alone;
the same rows are then computed
  * batch-K:   in one step with K other sequences (prefills of other lengths and decode rows,
               before and after it), K = 1..63;
  * chunks-C:  prefilled in chunks of C tokens over several steps (each chunk reads the
               earlier ones from the KV cache, as a prefix-cache hit or chunked prefill does);
  * decode:    its last token as a decode row (its prefix cached), alone and with others.
A step whose output differs in a scenario where every earlier step matched is marked CAUSE:
that kernel is to fix; later steps differ because their inputs do. Runs the engine's own kernels through a
plan cut after each step (bessemer/artifacts/diff.py prefix_executor).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

from bessemer.artifacts.diff import prefix_executor
from bessemer.format.step import StepBatch
from bessemer.runtime.engine import Engine

PROMPT_TOKENS = 40
MAX_BLOCKS_PER_SEQ = 8  # 128 positions at block size 16: every sequence here fits


class Request:
    """One sequence of a step: tokens[start:stop] run in it, tokens[:start] already cached."""

    def __init__(self, tokens: np.ndarray, start: int, stop: int, first_block: int):
        self.tokens, self.start, self.stop, self.first_block = tokens, start, stop, first_block


def run_step(executor, width: int, requests: list[Request]) -> list[np.ndarray]:
    """One executor step over `requests`; each one's output rows [stop - start, width]."""
    ids, pos, cu, ctx = [], [], [0], []
    tables = np.full((len(requests), MAX_BLOCKS_PER_SEQ), -1, np.int32)
    for i, r in enumerate(requests):
        ids += list(r.tokens[r.start:r.stop])
        pos += list(range(r.start, r.stop))
        cu.append(len(ids))
        ctx.append(r.stop)
        tables[i] = np.arange(r.first_block, r.first_block + MAX_BLOCKS_PER_SEQ)
    out = executor.step(StepBatch.of(ids, pos, cu, ctx, tables, np.arange(len(ids))))
    rows = out[:, :width] / np.float32(2)
    return [rows[cu[i]:cu[i + 1]] for i in range(len(requests))]


def scenarios(rng: np.random.Generator, vocab: int):
    """(name, steps): steps is a list of (requests, index of the target in them); the target's
    rows over the steps, concatenated, must equal its one-step prefill alone."""
    target = rng.integers(0, vocab, PROMPT_TOKENS)
    n = PROMPT_TOKENS
    next_block = iter(range(MAX_BLOCKS_PER_SEQ, 10 ** 6, MAX_BLOCKS_PER_SEQ))

    def other() -> Request:
        length = int(rng.integers(1, 60))
        tokens = rng.integers(0, vocab, length + 1)
        if rng.random() < 0.5:  # a decode row (its cache content is whatever is there)
            return Request(tokens, length, length + 1, next(next_block))
        return Request(tokens, 0, length, next(next_block))

    for k in (1, 3, 7, 15, 31, 63):
        others = [other() for _ in range(k)]
        at = int(rng.integers(0, k + 1))
        reqs = others[:at] + [Request(target, 0, n, next(next_block))] + others[at:]
        yield f"batch-{k}", [(reqs, at)]
    for chunk in (1, 7, 16, 33):
        block = next(next_block)
        yield f"chunks-{chunk}", [([Request(target, a, min(n, a + chunk), block)], 0) for a in range(0, n, chunk)]
    block = next(next_block)
    yield "decode", [([Request(target, 0, n - 1, block)], 0), ([Request(target, n - 1, n, block)], 0)]
    block = next(next_block)
    others = [other() for _ in range(9)]
    yield "decode-batch-10", [([Request(target, 0, n - 1, block)], 0),
                              (others[:4] + [Request(target, n - 1, n, block)] + others[4:], 4)]


def check_step(engine, step: int, threads: int, workdir: Path, seed: int) -> dict[str, float] | None:
    """Scenario -> max |difference| from the alone-prefill reference (0.0: bit-identical)."""
    made = prefix_executor(engine, step, 4096, workdir, num_threads=threads)
    if made is None:
        return None
    executor, width = made
    vocab = int(engine.header["plan"]["vocab_size"])
    rng = np.random.default_rng(seed)
    ref = None
    results = {}
    for name, steps in scenarios(rng, vocab):
        if ref is None:
            target = steps[0][0][steps[0][1]].tokens
            ref = run_step(executor, width, [Request(target, 0, PROMPT_TOKENS, 0)])[0]
        got = np.concatenate([run_step(executor, width, reqs)[at] for reqs, at in steps])
        if name.startswith("decode"):
            got, want = got[-1:], ref[-1:]
        else:
            want = ref
        same = np.array_equal(got.view(np.uint32), want.view(np.uint32))
        results[name] = 0.0 if same else float(np.abs(got.astype(np.float64) - want).max())
    return results


def layer_steps(plan: dict, layer: int) -> list[int]:
    """Plan steps of decoder layer `layer` (by node name), the steps before layer 0 when
    layer == 0, and the last step (the logits)."""
    steps = plan["steps"]
    mark = f".layers.{layer}."
    picked = [i for i, s in enumerate(steps) if mark in s["node"]]
    if layer == 0:
        picked = list(range(0, picked[0])) + picked
    return picked + [len(steps) - 1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("engines", nargs="+")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--layer", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    bad = 0
    for engine_dir in args.engines:
        engine = Engine.load(engine_dir)
        plan = engine.header["plan"]
        print(f"== {engine_dir} (isa auto, {args.threads} threads)")
        broken: set[str] = set()  # scenarios that already differed at an earlier step
        with tempfile.TemporaryDirectory(prefix="bessemer-invariance-") as workdir:
            for i in layer_steps(plan, args.layer):
                s = plan["steps"][i]
                res = check_step(engine, i, args.threads, Path(workdir), args.seed)
                if res is None:
                    print(f"  {i:4d} {s['op']}@{s['version']:<3} {s['node']}: output wider than the vocabulary, skipped")
                    continue
                differ = {k: v for k, v in res.items() if v}
                causes = [k for k in differ if k not in broken]
                verdict = "ok" if not differ else " ".join(
                    f"{k}:{v:.2g}{'(CAUSE)' if k in causes else ''}" for k, v in differ.items())
                bad += bool(causes)
                broken |= set(differ)
                print(f"  {i:4d} {s['op']}@{s['version']:<3} {s['node']}: {verdict}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
