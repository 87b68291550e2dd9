"""`bessemer bench serve` against a real `bessemer serve` of the bf16 SmolLM2 engine (one
server for the module), through the CLI: its JSON's counts and timings must be consistent with
what was sent, the concurrency cap must hold, a sweep must draw a PNG, and a server that cannot
be benchmarked must be one error line and exit 1. The pure parts (arrivals, chunk rules, the
summary of failures, JSONL prompts) are tested without a server."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from click.testing import CliRunner

pytest.importorskip("httpx")
from bessemer.cli.main import main  # noqa: E402
from bessemer.serving_bench.client import RequestResult, carries_output  # noqa: E402
from bessemer.serving_bench.metrics import summarize  # noqa: E402
from bessemer.serving_bench.prompts import load  # noqa: E402
from bessemer.serving_bench.runner import Run, arrival_times  # noqa: E402
from test_serve import KEY, MODEL, Server  # noqa: E402  (skips this module where fastapi/uvicorn are absent)

METRICS = ("ttft", "tpot", "itl", "e2el")


@pytest.fixture(scope="module")
def server(smollm2_engine, tmp_path_factory):
    # with an API key, so that every call below also proves the key reaches /v1/models and /v1/*completions
    s = Server(smollm2_engine("bfloat16"), tmp_path_factory.mktemp("bench-serve") / "server.log", "--api-key", KEY)
    try:
        s.wait_ready()
        yield s
    finally:
        s.stop()


def bench(*args: str):
    return CliRunner().invoke(main, ["bench", "serve", "--quiet", *args])


def run_json(tmp_path, *args: str) -> dict:
    out = tmp_path / "result.json"
    result = bench(*args, "--api-key", KEY, "--result-json", str(out))
    assert result.exit_code == 0, result.output
    assert "Serving Benchmark Result" in result.stdout
    return json.loads(out.read_text())


def check_consistent(run: dict, num_prompts: int, output_len: int) -> None:
    assert run["completed"] == num_prompts and run["failed"] == 0
    assert run["total_output_tokens"] == num_prompts * output_len  # --ignore-eos: every request runs to the end
    assert run["output_lens"] == [output_len] * num_prompts
    assert run["request_throughput"] == pytest.approx(run["completed"] / run["duration"])
    assert run["output_throughput"] == pytest.approx(run["total_output_tokens"] / run["duration"])
    for m in METRICS:
        assert 0 < run[f"p50_{m}_ms"] <= run[f"p99_{m}_ms"]
        assert run[f"median_{m}_ms"] == pytest.approx(run[f"p50_{m}_ms"])
    for ttft, e2el, itls in zip(run["ttfts"], run["e2els"], run["itls"]):
        assert 0 < ttft <= e2el
        assert ttft + sum(itls) <= e2el + 1e-9  # the gaps lie between the first chunk and the end
    assert max(run["e2els"]) <= run["duration"]


def test_fixed_rate_counts_every_token_and_orders_the_percentiles(server, tmp_path):
    result = run_json(tmp_path, "--base-url", f"{server.url}/v1", "--num-prompts", "6", "--input-len", "32",
                      "--output-len", "8", "--ignore-eos", "--request-rate", "10", "--percentiles", "50,99")
    assert result["model_id"] == MODEL  # from GET /v1/models
    (run,) = result["runs"]
    assert run["request_rate"] == 10.0 and run["max_concurrency"] is None
    check_consistent(run, 6, 8)
    assert run["input_lens"] == [32] * 6  # synthetic prompts are token ids: exact lengths


def test_a_concurrency_cap_of_one_runs_the_requests_one_after_another(server, tmp_path):
    result = run_json(tmp_path, "--base-url", server.url, "--endpoint", "chat", "--dataset", "shipped",
                      "--num-prompts", "4", "--output-len", "6", "--ignore-eos", "--max-concurrency", "1",
                      "--percentiles", "50")
    (run,) = result["runs"]
    assert run["request_rate"] == "inf" and run["max_concurrency"] == 1
    check_consistent(run, 4, 6)
    assert run["duration"] >= sum(run["e2els"])  # no two requests overlapped
    assert all(n > 6 for n in run["input_lens"])  # the chat template's tokens, from the usage chunk


def test_a_sweep_draws_latency_against_throughput(server, tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "sweep.png"
    result = run_json(tmp_path, "--base-url", server.url, "--num-prompts", "4", "--input-len", "16",
                      "--output-len", "4", "--ignore-eos", "--sweep-rates", "20,inf", "--plot", str(png),
                      "--percentiles", "50")
    assert [r["request_rate"] for r in result["runs"]] == [20.0, "inf"]
    for run in result["runs"]:
        check_consistent(run, 4, 4)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


@pytest.mark.parametrize("args, message", [
    (["--base-url", "http://127.0.0.1:9"], "could not list the models at http://127.0.0.1:9/v1/models"),
    (["--base-url", "http://127.0.0.1:9", "--model", "m"], "the test request to http://127.0.0.1:9/v1/completions"),
])
def test_an_unreachable_server_is_one_error_line(args, message):
    result = bench(*args, "--num-prompts", "2")
    assert result.exit_code == 1
    assert result.stderr.startswith(f"error: {message}") and result.stderr.count("\n") == 1


def test_a_missing_api_key_is_one_error_line(server):
    result = bench("--base-url", server.url, "--num-prompts", "2")
    assert result.exit_code == 1 and "401" in result.stderr and result.stderr.count("\n") == 1


def test_a_wrong_model_is_refused_by_the_test_request(server):
    result = bench("--base-url", server.url, "--api-key", KEY, "--model", "no-such-model", "--num-prompts", "2")
    assert result.exit_code == 1
    assert result.stderr.startswith("error: the test request") and "HTTP 404" in result.stderr


def test_a_rate_whose_every_request_failed_exits_1(monkeypatch):
    import bessemer.serving_bench.benchmark as B

    failed = summarize(Run(math.inf, None, 1.0, [RequestResult(False, "HTTP 500: boom")] * 2), [99.0])
    monkeypatch.setattr(B, "benchmark", lambda opts, progress, show: {"runs": [failed], "model_id": "m",
                                                                     "base_url": opts.base_url})
    result = bench("--base-url", "http://127.0.0.1:9")
    assert result.exit_code == 1
    assert result.stderr == "error: all 2 requests failed at rate inf; the first: HTTP 500: boom\n"


def test_failed_requests_are_counted_not_timed():
    results = [RequestResult(True, "", 0.1, 0.5, (0.2, 0.2), 10, 3), RequestResult(False, "HTTP 500: boom")]
    s = summarize(Run(2.0, None, 1.0, results), [99.0])
    assert (s["completed"], s["failed"], s["total_output_tokens"]) == (1, 1, 3)
    assert s["mean_tpot_ms"] == pytest.approx(200) and s["errors"] == ["", "HTTP 500: boom"]
    none = summarize(Run(2.0, None, 1.0, [RequestResult(False, "x")]), [99.0])
    assert none["completed"] == 0 and none["p99_ttft_ms"] == 0  # vLLM's zeros when nothing succeeded


def test_arrivals_are_seeded_poisson_or_all_at_once():
    t = arrival_times(4000, 5.0, seed=1)
    assert t[0] == 0 and np.all(np.diff(t) >= 0)
    assert np.mean(np.diff(t)) == pytest.approx(0.2, rel=0.05)  # exponential gaps of mean 1/rate
    assert np.array_equal(t, arrival_times(4000, 5.0, seed=1)) and not np.array_equal(t, arrival_times(4000, 5.0, 2))
    assert not arrival_times(3, math.inf, 0).any()


def test_only_chunks_with_text_are_tokens():
    assert carries_output({"text": "a"}) and not carries_output({"text": ""})
    assert not carries_output({"delta": {"role": "assistant", "content": ""}})  # chat's opening chunk
    assert carries_output({"delta": {"content": "hi"}}) and not carries_output({"delta": {}})


def test_jsonl_prompts_take_sharegpt_turns_and_cycle(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "one two", "output_len": 5}\n\n'
                    '{"conversations": [{"from": "human", "value": "three"}, {"from": "gpt", "value": "x"}]}\n')
    prompts = load(str(path), 5, 0, None, seed=0, as_text=True)
    assert len(prompts) == 5 and {p.text for p in prompts} == {"one two", "three"}
    assert {(p.text, p.output_len) for p in prompts} == {("one two", 5), ("three", 128)}
    assert len(load("shipped", 3, 0, 7, 0, True)) == 3
