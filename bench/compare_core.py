"""The pure parts of bench/compare.py: workloads, prompts as token ids, rates, disturbed-run
detection, medians, target ratios and the memory-bandwidth ceiling. No I/O, no engines:
tests/test_bench_compare.py checks them directly.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class Workload:
    name: str
    num_prompts: int
    prompt_len: int  # 0: the chat prompt (its length is whatever the template gives)
    new_tokens: int
    metric: str  # "prefill" | "decode" | "throughput"
    doc: str


WORKLOADS = {
    "prefill": Workload("prefill", 1, 512, 1, "prefill", "one 512-token prompt: 512 / time to first token"),
    "decode": Workload("decode", 1, 0, 128, "decode", "chat prompt, 128 new tokens: tok/s after the first"),
    "batch": Workload("batch", 16, 64, 64, "throughput",
                      "16 prompts x 64 tokens, 64 new each, submitted together: generated tok/s"),
    "long": Workload("long", 1, 2048, 128, "decode", "2048-token prompt, 128 new tokens: tok/s after the first"),
}
QUICK = {"prefill": 128, "batch": 4, "long": 512, "new": 32}  # --quick: shapes that run in seconds
CHAT = [{"role": "user", "content": "Tell me a long story about a steel mill, and the people who work there."}]


def quick_workloads() -> dict[str, Workload]:
    w = WORKLOADS
    return {"prefill": Workload("prefill", 1, QUICK["prefill"], 1, "prefill", w["prefill"].doc + " (quick: 128)"),
            "decode": Workload("decode", 1, 0, QUICK["new"], "decode", w["decode"].doc + " (quick: 32 new)"),
            "batch": Workload("batch", QUICK["batch"], 64, QUICK["new"], "throughput", w["batch"].doc + " (quick: 4 x 32)"),
            "long": Workload("long", 1, QUICK["long"], QUICK["new"], "decode", w["long"].doc + " (quick: 512 + 32)")}


def make_prompts(text_ids: list[int], chat_ids: list[int], workloads: dict[str, Workload]) -> dict[str, list[list[int]]]:
    """Token-id prompts of every workload, cut from one tokenized text (same ids for every
    system). Each batch prompt starts at a different place, so no two share a prefix."""
    if not text_ids or not chat_ids:
        raise ValueError("need a non-empty tokenized text and chat prompt")
    out = {}
    for name, w in workloads.items():
        if w.prompt_len == 0:
            out[name] = [list(chat_ids) for _ in range(w.num_prompts)]
            continue
        need = w.prompt_len + (w.num_prompts - 1) * 997 + 1
        ids = list(text_ids) * (need // len(text_ids) + 1)  # a short text is repeated, never truncated
        out[name] = [ids[i * 997: i * 997 + w.prompt_len] for i in range(w.num_prompts)]
    return out


def rate(metric: str, m: dict, num_prompt_tokens: int) -> float:
    """tok/s of one run from a worker's measurement `m`:
    ttft_s (start -> first token of the first sequence), decode_s (first -> last token of
    batch-1 decoding), wall_s, generated (tokens per sequence)."""
    if metric == "prefill":
        return num_prompt_tokens / m["ttft_s"]
    if metric == "decode":
        return (m["generated"][0] - 1) / m["decode_s"]
    if metric == "throughput":
        return sum(m["generated"]) / m["wall_s"]
    raise ValueError(f"unknown metric {metric!r}")


@dataclass
class Run:
    tok_s: float
    util: float  # process CPU time / (wall time x threads): below its own best = we lost cores
    load: float = 0.0  # 1-minute load average when it ran (for the record)


def disturbed(runs: list[Run], spread_tol: float = 0.10, util_tol: float = 0.20, min_util: float = 0.4) -> list[int]:
    """Indices of runs to repeat. Load on a shared machine only ever slows a run down, so a
    run is disturbed when it is more than `spread_tol` slower than the best of its cell, when
    its process got `util_tol` less CPU per wall second than the best-served run, or when it
    got less than `min_util` of its threads' cores at all (then every run of the cell may be
    disturbed alike, which the relative tests cannot see)."""
    if not runs:
        return []
    best = max(r.tok_s for r in runs)
    best_util = max(r.util for r in runs)
    return [i for i, r in enumerate(runs)
            if r.tok_s < best * (1 - spread_tol) or r.util < best_util * (1 - util_tol) or r.util < min_util]


def spread(values: list[float]) -> float:
    """(max - min) / median: how much the repeats of one cell disagree."""
    med = statistics.median(values)
    return (max(values) - min(values)) / med if med else 0.0


def median(values: list[float]) -> float:
    return statistics.median(values)


# (name, numerator systems, denominator systems, workload, target). Several systems on a side:
# the best of them (e.g. "best Bessemer mode"); a missing side makes the ratio None. The goals
# are the CPU issue's (4-bit decode at 4.5 bpw: g32, as Q4_0; 4-bit prefill: w4a16 or w4a8).
W4 = ("bessemer-w4a16-g32", "bessemer-w4a16-g64", "bessemer-w4a16-g128")
TARGETS = [
    ("decode: w4a16 / ORT-genai int4", W4, ("ortgenai-int4",), "decode", 1.4),
    ("decode: w4a16 / llama.cpp Q4_0", W4, ("llamacpp-q4_0",), "decode", 1.5),
    ("decode: w8a16 / llama.cpp Q8_0", ("bessemer-w8a16",), ("llamacpp-q8_0",), "decode", 1.3),
    ("decode: fp32 / llama.cpp F32", ("bessemer-fp32",), ("llamacpp-f32",), "decode", 1.0),
    ("prefill: best Bessemer / best anchor", ("bessemer-*",), ("anchor-*",), "prefill", 1.3),
    ("prefill: 4-bit Bessemer / llama.cpp Q4_0", W4 + ("bessemer-w4a8-g32",), ("llamacpp-q4_0",), "prefill", 2.0),
    ("prefill: w8a8-sq / best anchor", ("bessemer-w8a8-sq",), ("anchor-*",), "prefill", 3.0),
    ("batch: best Bessemer / best anchor", ("bessemer-*",), ("anchor-*",), "batch", 2.0),
    ("batch: w8a8-sq / best anchor", ("bessemer-w8a8-sq",), ("anchor-*",), "batch", 3.0),
    ("long: fp32 / llama.cpp F32", ("bessemer-fp32",), ("llamacpp-f32",), "long", 1.0),
    ("long: w8a16 / llama.cpp Q8_0", ("bessemer-w8a16",), ("llamacpp-q8_0",), "long", 1.0),
    ("long: w4a16 / llama.cpp Q4_0", W4, ("llamacpp-q4_0",), "long", 1.0),
]


def _expand(patterns: tuple[str, ...], systems: list[str]) -> list[str]:
    out = []
    for p in patterns:
        if p == "bessemer-*":
            out += [s for s in systems if s.startswith("bessemer-")]
        elif p == "anchor-*":
            out += [s for s in systems if not s.startswith("bessemer-")]
        elif p in systems:
            out.append(p)
    return out


def target_ratios(medians: dict[str, dict[str, float]]) -> list[dict]:
    """The issue's targets from the medians {system: {workload: tok/s}}."""
    systems = list(medians)
    rows = []
    for name, num, den, workload, target in TARGETS:
        def best(side):
            have = [(medians[s][workload], s) for s in _expand(side, systems) if medians[s].get(workload)]
            return max(have) if have else (None, None)
        (a, sa), (b, sb) = best(num), best(den)
        ratio = round(a / b, 3) if a and b else None
        rows.append({"target": name, "workload": workload, "numerator": sa, "denominator": sb,
                     "ratio": ratio, "goal": target, "met": None if ratio is None else ratio >= target})
    return rows


def weight_bytes_per_token(tensors: list[tuple[str, int]], embed: str, head: str) -> int:
    """Bytes of weights one decode step reads: every tensor once, except that the input
    embedding is a gather of one row unless the output head is the same (tied) table."""
    names = {n for n, _ in tensors}
    total = 0
    for name, nbytes in tensors:
        if name == embed and head in names:
            continue  # untied: one row of it per token, negligible next to the head
        total += nbytes
    return total


def ceiling(copy_bytes_per_s: float, bytes_per_token: int) -> float:
    """Decode tok/s if each token cost exactly one read of the weights at copy bandwidth."""
    return copy_bytes_per_s / bytes_per_token


def agreement(tokens: list[int], reference: list[int]) -> int:
    """How many leading greedy tokens two systems share (same prompt ids: fp32 systems should
    agree for many tokens; quantized ones diverge sooner, a prompt fed wrongly at once)."""
    n = 0
    for a, b in zip(tokens, reference):
        if a != b:
            break
        n += 1
    return n
