"""The pure parts of the comparison harness (bench/compare_core.py): prompt construction as
token ids, rates, disturbed-run detection, target ratios, bytes per token. The harness itself
(anchors, engines, timings) is a benchmark, run by `make bench`, not part of the suite."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import compare_core as core  # noqa: E402


def test_prompts_have_the_exact_lengths_and_distinct_starts():
    text = list(range(1000, 1000 + 3000))
    chat = [1, 2, 3, 4]
    p = core.make_prompts(text, chat, core.WORKLOADS)
    assert [len(x) for x in p["prefill"]] == [512]
    assert p["decode"] == [chat]
    assert len(p["batch"]) == 16 and all(len(x) == 64 for x in p["batch"])
    assert len({x[0] for x in p["batch"]}) == 16  # no shared prefix between batch prompts
    assert [len(x) for x in p["long"]] == [2048]
    assert p["long"][0] == text[:2048]  # cut from the text, in order


def test_a_short_text_is_repeated_not_truncated():
    p = core.make_prompts([5, 6, 7], [9], {"long": core.WORKLOADS["long"]})
    assert len(p["long"][0]) == 2048 and p["long"][0][:6] == [5, 6, 7, 5, 6, 7]
    with pytest.raises(ValueError):
        core.make_prompts([], [9], core.WORKLOADS)


def test_rates_follow_the_issue_definitions():
    m = {"ttft_s": 0.5, "decode_s": 2.54, "wall_s": 4.0, "generated": [128]}
    assert core.rate("prefill", m, 512) == pytest.approx(1024)
    assert core.rate("decode", m, 512) == pytest.approx(127 / 2.54)  # after the first token
    assert core.rate("throughput", {"wall_s": 8.0, "generated": [64] * 16}, 64) == pytest.approx(128)
    with pytest.raises(ValueError):
        core.rate("latency", m, 1)


def test_disturbed_runs_are_the_slow_or_core_starved_ones():
    runs = [core.Run(100, 0.95), core.Run(97, 0.94), core.Run(70, 0.93)]
    assert core.disturbed(runs) == [2]  # 30% slower than the best
    runs = [core.Run(100, 0.95), core.Run(99, 0.60), core.Run(98, 0.94)]
    assert core.disturbed(runs) == [1]  # as fast, but its process lost CPU time
    assert core.disturbed([core.Run(100, 0.9), core.Run(95, 0.9)]) == []
    assert core.disturbed([core.Run(10, 0.1)]) == [0]  # alone, but it got a tenth of its cores
    assert core.disturbed([core.Run(10, 0.9)]) == []
    assert core.disturbed([core.Run(100, 0.3), core.Run(99, 0.3)], min_util=0.25) == []
    assert core.spread([90, 100, 110]) == pytest.approx(0.2)


def test_target_ratios_take_the_best_of_each_side():
    med = {"bessemer-w4a16-g64": {"decode": 130, "prefill": 500}, "bessemer-w4a16-g128": {"decode": 150, "prefill": 900},
           "ortgenai-int4": {"decode": 100, "prefill": 600}, "llamacpp-q4_0": {"decode": 120, "prefill": 700},
           "bessemer-fp32": {"decode": 40}}
    rows = {r["target"]: r for r in core.target_ratios(med)}
    r = rows["decode: w4a16 / ORT-genai int4"]
    assert r["ratio"] == 1.5 and r["met"] and r["numerator"] == "bessemer-w4a16-g128"  # goal 1.4
    r = rows["decode: w4a16 / llama.cpp Q4_0"]
    assert r["ratio"] == 1.25 and r["met"] is False
    r = rows["prefill: best Bessemer / best anchor"]
    assert r["ratio"] == pytest.approx(900 / 700, abs=1e-3) and r["denominator"] == "llamacpp-q4_0"
    assert rows["decode: fp32 / llama.cpp F32"]["ratio"] is None  # no F32 anchor in this run
    assert rows["decode: fp32 / llama.cpp F32"]["met"] is None
    r = rows["prefill: 4-bit Bessemer / llama.cpp Q4_0"]  # goal 2x: 900 / 700 misses it
    assert r["numerator"] == "bessemer-w4a16-g128" and r["met"] is False
    assert rows["prefill: w8a8-sq / best anchor"]["ratio"] is None


def test_weight_bytes_count_a_tied_table_once_and_an_untied_embedding_not_at_all():
    layers = [("blk.0.w", 1000), ("blk.1.w", 1000)]
    assert core.weight_bytes_per_token(layers + [("token_embd.weight", 5000)], "token_embd.weight", "output.weight") == 7000
    untied = layers + [("token_embd.weight", 5000), ("output.weight", 4000)]
    assert core.weight_bytes_per_token(untied, "token_embd.weight", "output.weight") == 6000
    assert core.ceiling(40e9, 200e6) == pytest.approx(200)


def test_agreement_counts_the_common_greedy_prefix():
    assert core.agreement([1, 2, 3, 4], [1, 2, 9, 4]) == 2
    assert core.agreement([1, 2], [1, 2, 3]) == 2
    assert core.agreement([], [1]) == 0
