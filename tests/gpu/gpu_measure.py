"""What the GPU check measures on a cuda engine, through the public API (LLM) and, for
step-level timings and the graph/eager comparison, the engine's executor.

Greedy comparisons between two runs that batch differently (batch vs alone, prefix-cache
hit vs miss) may legitimately differ where the model's top two logits are within rounding
of each other (random-weight models have many near-ties): a divergence counts as a tie when
the top-2 margin there is within `tie` (the HF bf16 error of the same model); the first
divergence and its margin are reported either way.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from bessemer.format.step import StepBatch
from bessemer.runtime.executor import SamplingRows
from bessemer.runtime.llm import LLM, SamplingParams

def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)


def prompts(count: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, length).tolist() for _ in range(count)]


def logits_error(llm: LLM, ids: list[list[int]], ref32: list, ref16: list, ratio: float = 2.0,
                 bound_mean: bool = False, decode_tokens: int | None = None) -> dict:
    """Teacher-forced logits: the engine's max |error| against the reference in fp32 (all
    prompts at once, and with their last `decode_tokens` (default: half; 0: none) through
    decode steps), and the same reference run in bf16's; the engine passes within `ratio`
    times the latter (and, with `bound_mean`, its mean |error| too)."""
    engine = llm.score(ids)
    decoded = len(ids[0]) // 2 if decode_tokens is None else decode_tokens
    half = llm.score(ids, num_prefill=len(ids[0]) - decoded) if decoded else None  # 0: no decode steps
    hf_err = max(float(np.abs(b - a).max()) for a, b in zip(ref32, ref16))
    err = max(float(np.abs(e - a).max()) for a, e in zip(ref32, engine))
    err_decode = None if half is None else max(float(np.abs(e - a).max()) for a, e in zip(ref32, half))
    mean = lambda pairs: float(np.mean([np.abs(x - a).mean() for a, x in pairs]))  # noqa: E731
    hf_mean = mean(zip(ref32, ref16))
    engine_mean = mean(zip(ref32, engine)) if half is None else max(mean(zip(ref32, engine)), mean(zip(ref32, half)))
    worst = err if err_decode is None else max(err, err_decode)
    ok = worst <= ratio * hf_err and (not bound_mean or engine_mean <= ratio * hf_mean)
    return {"engine_max_abs_err": err, "engine_decode_max_abs_err": err_decode, "hf_bf16_max_abs_err": hf_err,
            "engine_mean_abs_err": engine_mean, "hf_bf16_mean_abs_err": hf_mean,
            "ratio": worst / hf_err if hf_err else float("inf"),
            "mean_ratio": engine_mean / hf_mean if hf_mean else float("inf"),
            "bound": f"<= {ratio:g} x HF bf16's error" + (" in max and mean" if bound_mean else " in max"),
            "pass": ok}


def _margin(llm: LLM, context: list[int]) -> float:
    last = np.sort(llm.score([context])[0][-1])
    return float(last[-1] - last[-2])


def compare_greedy(llm: LLM, prompt: list[int], a: list[int], b: list[int], tie: float) -> dict:
    """Equal, or diverging first at a near-tie of the reference run `a`."""
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if first is None and len(a) == len(b):
        return {"equal": True, "pass": True}
    margin = _margin(llm, prompt + a[:first])
    return {"equal": False, "first_divergence": first, "top2_margin": margin, "tie_bound": tie,
            "pass": margin <= tie}


def batch_vs_alone(llm: LLM, vocab: int, tie: float, new_tokens: int = 24,
                   lengths: tuple = (5, 37, 128, 77)) -> dict:
    """Prompts of mixed lengths generated in one batch, then each alone: same tokens."""
    ids = [p for seed, n in enumerate(lengths, 1) for p in prompts(1, n, vocab, seed)]
    batch = [o.token_ids for o in llm.generate(ids, greedy(new_tokens))]
    alone = [llm.generate([p], greedy(new_tokens))[0].token_ids for p in ids]
    rows = [compare_greedy(llm, p, a, b, tie) for p, a, b in zip(ids, alone, batch)]
    return {"prompts": [len(p) for p in ids], "rows": rows, "identical": all(r["equal"] for r in rows),
            "pass": all(r["pass"] for r in rows)}


def prefix_cache(llm: LLM, vocab: int, tie: float, new_tokens: int = 24, length: int = 160,
                 shared: int = 96) -> dict:
    """A prompt and a sibling sharing its first `shared` tokens (whole KV blocks), each
    generated with prefix caching off (misses), then with it on: the prompt twice (the
    second run reuses the first's KV blocks) and the sibling (reuses `shared` tokens).
    Hits give the tokens misses give."""
    base = prompts(1, length, vocab, 7)[0]
    sibling = base[:shared] + prompts(1, length - shared, vocab, 8)[0]
    blocks = llm.blocks
    blocks.enable_prefix_caching = False
    miss, sib_miss = ([llm.generate([p], greedy(new_tokens))[0].token_ids for p in (base, sibling)])
    blocks.enable_prefix_caching = True
    llm.generate([base], greedy(new_tokens))  # computes and registers the prompt's blocks
    hits0 = blocks.num_hit_tokens
    hit = llm.generate([base], greedy(new_tokens))[0].token_ids
    sib_hit = llm.generate([sibling], greedy(new_tokens))[0].token_ids
    hit_tokens = blocks.num_hit_tokens - hits0
    rows = [compare_greedy(llm, base, miss, hit, tie), compare_greedy(llm, sibling, sib_miss, sib_hit, tie)]
    return {"hit_tokens": hit_tokens, "rows": rows, "identical": all(r["equal"] for r in rows),
            "pass": hit_tokens >= shared and all(r["pass"] for r in rows)}


def _rows(temperature, top_k, top_p, uniform) -> SamplingRows:
    return SamplingRows(np.asarray(temperature, np.float32), np.asarray(top_k, np.int32),
                        np.asarray(top_p, np.float32), np.asarray(uniform, np.float64))


def _tables(lengths: list[int], block: int, first_block: int = 0) -> np.ndarray:
    width = max(-(-(n + 1) // block) for n in lengths)
    tables = np.full((len(lengths), width), -1, np.int32)
    at = first_block
    for s, n in enumerate(lengths):
        k = -(-(n + 1) // block)
        tables[s, :k] = np.arange(at, at + k)
        at += k
    return tables


def graph_vs_eager(llm: LLM, vocab: int, recorder=None) -> dict:
    """One decode step of 4 sequences (the graph of 4 holds it exactly) and of 3 (padded to
    4), replayed from the CUDA graph and launched eagerly on the same state: logits and
    sampled tokens must be the same bits. Uses the executor directly on blocks of its own:
    run on an engine no request is using. With `recorder` (the CPU rehearsal: a context
    giving the driver's launch records), the launches themselves are compared too: for 4
    sequences the replayed graph must launch what the eager launcher launches."""
    from contextlib import nullcontext

    ex = llm.executor
    block = llm.block_size
    out = {}
    for n in (4, 3):
        lengths = [20, 33, 7, 50][:n]
        ids = prompts(n, max(lengths), vocab, 11)
        tables = _tables(lengths, block)
        cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        tokens = np.concatenate([p[:m] for p, m in zip(ids, lengths)]).astype(np.int32)
        positions = np.concatenate([np.arange(m) for m in lengths]).astype(np.int32)
        ex.step(StepBatch.of(tokens, positions, cu, lengths, tables, cu[1:] - 1))
        step = StepBatch.of([p[m] if m < len(p) else 1 for p, m in zip(ids, lengths)], lengths, np.arange(n + 1),
                            np.array(lengths) + 1, tables, np.arange(n))
        sampling = _rows([0.0, 0.9, 0.0, 1.2][:n], [0, 20, 0, 0][:n], [1.0, 0.8, 1.0, 0.95][:n], [0.0, 0.4, 0.0, 0.6][:n])
        before = ex.stats()["graph_steps"]
        ex.use_graphs = True
        with (recorder() if recorder else nullcontext([])) as graph_log:
            tok_g, log_g = ex.sampler.sample(step, sampling, want_logits=True)
        replayed = ex.stats()["graph_steps"] - before
        ex.use_graphs = False
        with (recorder() if recorder else nullcontext([])) as eager_log:
            tok_e, log_e = ex.sampler.sample(step, sampling, want_logits=True)
        ex.use_graphs = True
        row = {"graph_replayed": replayed == 1,
               "logits_bitwise_equal": bool(np.array_equal(log_g.view(np.uint32), log_e.view(np.uint32))),
               "tokens_equal": bool(np.array_equal(tok_g, tok_e)),
               "max_abs_diff": float(np.abs(log_g - log_e).max())}
        if recorder:
            row["launches"] = {"graph": len(graph_log), "eager": len(eager_log)}
            if n == 4:  # padded (n == 3), the graph's grids are those of 4 rows by design
                row["launches_equal"] = graph_log == eager_log and len(graph_log) > 0
        out[f"batch{n}"] = row
    rows = [v for v in out.values() if isinstance(v, dict)]
    if recorder:  # a driver that computes nothing: its logits and tokens are not judged
        out["pass"] = all(v["graph_replayed"] and v.get("launches_equal", True) for v in rows)
    else:
        out["pass"] = all(v["graph_replayed"] and v["logits_bitwise_equal"] and v["tokens_equal"] for v in rows)
    return out


def decode_speed(llm: LLM, vocab: int, prompt_len: int = 128, new_tokens: int = 256, steps: int = 200) -> dict:
    """Batch-1 greedy decode: tokens/s through LLM.generate (scheduler, sampling on the
    device, detokenization off), and the executor's own decode step (graph replay + input
    upload + token readback) timed alone."""
    ids = prompts(1, prompt_len, vocab, 21)
    llm.generate(ids, greedy(8))  # warm
    out = llm.generate(ids, greedy(new_tokens))[0]
    m = out.metrics
    tok_s = (len(out.token_ids) - 1) / (m["last_token_time"] - m["first_token_time"])
    # a valid decode step on the blocks of a finished request
    step_ms = 1e3 / decode_step_tok_s(llm, 1, prompt_len + new_tokens, steps=steps, warm=10)
    return {"generate_tok_s": tok_s, "generate_ms_per_token": 1e3 / tok_s, "executor_step_ms": step_ms,
            "new_tokens": len(out.token_ids)}


def decode_step_tok_s(llm: LLM, batch: int, context: int, steps: int = 50, warm: int = 5) -> float:
    """Tokens/s of decode steps of `batch` sequences at `context` positions each (the
    executor's sampled step alone: graph replay when one holds the batch, input upload,
    token readback), on KV blocks of the pool (their contents do not change the time)."""
    ex = llm.executor
    tables = _tables([context] * batch, llm.block_size, first_block=0)
    step = StepBatch.of(np.ones(batch, np.int32), np.full(batch, context - 1), np.arange(batch + 1),
                        np.full(batch, context), tables, np.arange(batch))
    sampling = _rows([0.0] * batch, [0] * batch, [1.0] * batch, [0.0] * batch)
    for _ in range(warm):
        ex.sampler.sample(step, sampling)
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        ex.sampler.sample(step, sampling)
        times.append(time.perf_counter() - t)
    return batch / statistics.median(times)


def weight_bytes_per_token(header: dict, hidden: int, context: int) -> dict:
    """Bytes a decode step reads: every weight but the embedding table (one row of it), and
    the KV cache of `context` positions."""
    from bessemer.format.kv import section_bytes_per_token

    kv = header["plan"]["kv_cache"]
    weights = sum(t["nbytes"] for t in header["tensors"] if not t["name"].startswith("cubin/"))
    embed = next(t for t in header["tensors"] if t["name"].endswith("embed_tokens.weight"))
    tied = not any(t["name"].startswith("lm_head") for t in header["tensors"])
    read = weights - (0 if tied else embed["nbytes"]) + (0 if tied else 2 * hidden)
    kv_bytes = section_bytes_per_token(kv) * context  # codes and their scales for a one-byte cache
    return {"weights": read, "kv": kv_bytes, "total": read + kv_bytes}


def linear_shapes(header: dict) -> list[tuple[int, int, str]]:
    """(N, K, rows) of every GEMM a step launches: rows "tokens" or "selected"."""
    kernels = header["kernels"]
    out = []
    for item in header["plan"]["forward"]:
        if "cases" in item:
            c = kernels[item["cases"][0]["kernel"]]["constexprs"]
            out.append((c["N"], c["K"], item["by"]))
    return out


def prefill_speed(llm: LLM, vocab: int, tokens: int, repeats: int = 3) -> dict:
    """One prefill step of `tokens` tokens (logits of the last row), timed on the executor,
    and the time to first token of the same prompt through LLM.generate."""
    ex = llm.executor
    ids = np.array(prompts(1, tokens, vocab, 31)[0], np.int32)
    step = StepBatch.of(ids, np.arange(tokens), [0, tokens], [tokens], _tables([tokens], llm.block_size), [tokens - 1])
    ex.step(step)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        ex.step(step)
        times.append(time.perf_counter() - t)
    t = time.perf_counter()
    out = llm.generate([ids.tolist()], greedy(1))[0]
    ttft = out.metrics["first_token_time"] - out.metrics["arrival_time"]
    return {"step_s": min(times), "ttft_s": ttft, "wall_s": time.perf_counter() - t}


def throughput(llm: LLM, vocab: int, requests: int, prompt_len: int, new_tokens: int) -> dict:
    ids = prompts(requests, prompt_len, vocab, 41)
    t = time.perf_counter()
    outs = llm.generate(ids, greedy(new_tokens))
    wall = time.perf_counter() - t
    produced = sum(len(o.token_ids) for o in outs)
    first = max(o.metrics["first_token_time"] for o in outs)
    last = max(o.metrics["last_token_time"] for o in outs)
    return {"requests": requests, "output_tokens": produced, "wall_s": wall, "output_tok_s": produced / wall,
            "decode_phase_tok_s": (produced - requests) / max(last - first, 1e-9),
            "preemptions": llm.num_preemptions}
