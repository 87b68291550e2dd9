"""One system of bench/compare.py in its own process (its own caches and thread pool).

    python bench/compare_worker.py KIND PATH THREADS PROMPTS_JSON

KIND: bessemer | llamacpp | ortgenai | hf. The worker loads the system, writes one JSON
line {"ready": ...} and then answers each request line {"workload": W, "new": N} with
{"ttft_s", "decode_s", "wall_s", "cpu_s", "peak_rss_bytes" (the process's so far), "generated":
[tokens per sequence], "tokens": the first sequence's first 16 new ids (the parent checks the
systems agree with HF)}; an empty line or EOF ends it. Every system gets the same token ids,
greedy decoding, EOS ignored, exactly N new tokens. Protocol lines go to the original stdout;
anything the libraries print (C code included) is sent to stderr, which the parent keeps in a
log file.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np


class Bessemer:
    def __init__(self, path: str, threads: int):
        from bessemer.runtime.llm import LLM, SamplingParams

        # prefix caching off: every run computes its whole prompt, as the anchors do
        self.llm = LLM(path, num_threads=threads, enable_prefix_caching=False,
                       kv_cache_gib=float(os.environ.get("BENCH_KV_CACHE_GIB", "1")))
        self.SamplingParams = SamplingParams

    def run(self, prompts, new):
        params = self.SamplingParams(max_tokens=new, temperature=0, ignore_eos=True)
        t0 = time.perf_counter()
        outs = self.llm.generate(prompts, params)
        wall = time.perf_counter() - t0
        first = min(o.metrics["first_token_time"] for o in outs)
        m = outs[0].metrics
        return {"ttft_s": first - t0, "decode_s": m["last_token_time"] - m["first_token_time"], "wall_s": wall,
                "generated": [len(o.token_ids) for o in outs], "tokens": list(outs[0].token_ids[:16])}


class LlamaCpp:
    """llama.cpp through llama-cpp-python's C API bindings (the high-level `Llama` class
    decodes one sequence at a time; its batching is llama_batch with several seq ids, what
    llama.cpp's own `batched` example and llama-server do). Greedy = argmax of the logits."""

    def __init__(self, path: str, threads: int):
        import llama_cpp as L

        self.L = L
        L.llama_backend_init()
        mp = L.llama_model_default_params()
        mp.n_gpu_layers = 0
        self.model = L.llama_model_load_from_file(path.encode(), mp)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        cp = L.llama_context_default_params()
        cp.n_ctx = 4096
        cp.n_batch = 2048  # llama.cpp's defaults (llama-cli): a 2048-token prompt in one batch,
        cp.n_ubatch = 512  # computed 512 tokens at a time
        cp.n_seq_max = 16
        cp.kv_unified = True  # one KV pool for all sequences (llama-server's default)
        cp.n_threads = threads
        cp.n_threads_batch = threads
        self.ctx = L.llama_init_from_model(self.model, cp)
        if not self.ctx:
            raise RuntimeError("llama.cpp could not create a context")
        self.n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model))
        self.batch = L.llama_batch_init(2048, 0, 16)

    def _decode(self, items):
        """items: (token, pos, seq, wants_logits); returns the batch rows that have logits."""
        b, L = self.batch, self.L
        rows = []
        for i, (tok, pos, seq, logits) in enumerate(items):
            b.token[i] = tok
            b.pos[i] = pos
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = seq
            b.logits[i] = 1 if logits else 0
            if logits:
                rows.append(i)
        b.n_tokens = len(items)
        if L.llama_decode(self.ctx, b) != 0:
            raise RuntimeError("llama_decode failed")
        return rows

    def _argmax(self, row: int) -> int:
        ptr = self.L.llama_get_logits_ith(self.ctx, row)
        return int(np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).argmax())

    def run(self, prompts, new):
        L = self.L
        L.llama_memory_clear(L.llama_get_memory(self.ctx), True)
        t0 = time.perf_counter()
        items = [(t, p, s, p == len(ids) - 1) for s, ids in enumerate(prompts) for p, t in enumerate(ids)]
        rows = []
        for start in range(0, len(items), 2048):  # prompts in n_batch-sized pieces
            rows += [start + r for r in self._decode(items[start:start + 2048])]
        # rows of the last piece are what llama_get_logits_ith indexes
        last_start = (len(items) - 1) // 2048 * 2048
        toks = [self._argmax(r - last_start) for r in rows]
        t_first = time.perf_counter()
        out = [[t] for t in toks]
        for step in range(1, new):
            rows = self._decode([(toks[s], len(prompts[s]) + step - 1, s, True) for s in range(len(prompts))])
            toks = [self._argmax(r) for r in rows]
            for s, t in enumerate(toks):
                out[s].append(t)
        t_last = time.perf_counter()
        return {"ttft_s": t_first - t0, "decode_s": t_last - t_first, "wall_s": t_last - t0,
                "generated": [len(o) for o in out], "tokens": out[0][:16]}


class OrtGenai:
    def __init__(self, path: str, threads: int):
        import onnxruntime_genai as og

        self.og = og
        # threads go into the model's genai_config.json (the documented place for ORT's
        # session options); rewritten on every load so a change of --threads takes effect
        cfg_path = Path(path) / "genai_config.json"
        cfg = json.loads(cfg_path.read_text())
        so = cfg["model"]["decoder"].setdefault("session_options", {})
        so.update(intra_op_num_threads=threads, inter_op_num_threads=1)
        cfg_path.write_text(json.dumps(cfg, indent=4))
        self.model = og.Model(og.Config(path))

    def run(self, prompts, new):
        og = self.og
        n = len(prompts[0])
        if any(len(p) != n for p in prompts):
            raise ValueError("ORT-genai batch prompts must have one length (no padding here)")
        params = og.GeneratorParams(self.model)
        params.set_search_options(max_length=n + new, min_length=n + new, do_sample=False, batch_size=len(prompts))
        t0 = time.perf_counter()
        gen = og.Generator(self.model, params)
        gen.append_tokens(np.array(prompts, dtype=np.int32))
        gen.generate_next_token()
        t_first = time.perf_counter()
        while not gen.is_done():
            gen.generate_next_token()
        t_last = time.perf_counter()
        generated = [len(gen.get_sequence(i)) - n for i in range(len(prompts))]
        first = [int(t) for t in gen.get_sequence(0)[n:n + 16]]
        return {"ttft_s": t_first - t0, "decode_s": t_last - t_first, "wall_s": t_last - t0, "generated": generated,
                "tokens": first}


class HF:
    def __init__(self, path: str, threads: int):
        import torch
        from transformers import AutoModelForCausalLM
        from transformers.generation.streamers import BaseStreamer

        torch.set_num_threads(threads)
        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()

        class Times(BaseStreamer):  # generate() calls put() once for the prompt, then per token
            def __init__(self):
                self.times = []

            def put(self, value):
                self.times.append(time.perf_counter())

            def end(self):
                pass

        self.Times = Times

    def run(self, prompts, new):
        torch = self.torch
        x = torch.tensor(prompts)  # equal lengths: no padding, no attention-mask games
        streamer = self.Times()
        t0 = time.perf_counter()
        with torch.no_grad():
            out = self.model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=new,
                                      min_new_tokens=new, do_sample=False, pad_token_id=0, streamer=streamer)
        t_last = time.perf_counter()
        t_first = streamer.times[1]
        return {"ttft_s": t_first - t0, "decode_s": t_last - t_first, "wall_s": t_last - t0,
                "generated": [out.shape[1] - x.shape[1]] * len(prompts), "tokens": out[0, x.shape[1]:x.shape[1] + 16].tolist()}


SYSTEMS = {"bessemer": Bessemer, "llamacpp": LlamaCpp, "ortgenai": OrtGenai, "hf": HF}


def main() -> None:
    kind, path, threads, prompts_file = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # everything else anyone prints, C libraries included, lands in the log
    sys.stdout = sys.stderr
    prompts = json.loads(Path(prompts_file).read_text())
    try:
        system = SYSTEMS[kind](path, threads)
    except Exception as e:  # the parent prints this line and goes on without the system
        proto.write(json.dumps({"error": f"{type(e).__name__}: {e}"}) + "\n")
        return
    proto.write(json.dumps({"ready": kind}) + "\n")
    for line in sys.stdin:
        if not line.strip():
            break
        req = json.loads(line)
        c0 = time.process_time()  # CPU time of every thread of this process
        try:
            m = system.run(prompts[req["workload"]], int(req["new"]))
        except Exception as e:
            proto.write(json.dumps({"error": f"{type(e).__name__}: {e}"}) + "\n")
            continue
        m["cpu_s"] = time.process_time() - c0
        m["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # so far; KiB on Linux
        proto.write(json.dumps(m) + "\n")


if __name__ == "__main__":
    main()
