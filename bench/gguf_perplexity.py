"""Perplexity of a GGUF model under llama.cpp, on token windows given as ids (run by
bench/quant.py in the anchors' venv, which has llama-cpp-python; see compare_setup.py).

    python bench/gguf_perplexity.py MODEL.gguf WINDOWS.json THREADS > result.json

WINDOWS.json: {"name": [[ids of window 0], [ids of window 1], ...], ...}. Every window is
decoded from an empty KV cache with logits for all its tokens, and scored as
bessemer/runtime/evaluate.py does (each token after the first given those before it, nll
summed in float64): the numbers are comparable with `bessemer eval` and bench/quant.py's
Bessemer rows token for token. Prints {"name": {"perplexity", "scored_tokens", "nll_sum"}}.
"""

from __future__ import annotations

import json
import sys

import numpy as np


def window_nll(logits: np.ndarray, window: list[int]) -> float:
    x = logits[:-1].astype(np.float64)
    top = x.max(axis=1)
    lse = np.log(np.exp(x - top[:, None]).sum(axis=1)) + top
    return float((lse - x[np.arange(len(window) - 1), window[1:]]).sum())


def main() -> None:
    import llama_cpp as L

    model_path, windows_path, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
    texts = json.loads(open(windows_path).read())
    n_ctx = max(len(w) for wins in texts.values() for w in wins)
    L.llama_backend_init()
    mp = L.llama_model_default_params()
    mp.n_gpu_layers = 0
    model = L.llama_model_load_from_file(model_path.encode(), mp)
    if not model:
        raise SystemExit(f"llama.cpp could not load {model_path}")
    cp = L.llama_context_default_params()
    cp.n_ctx = n_ctx
    cp.n_batch = n_ctx  # a window in one batch, logits for every token
    cp.n_ubatch = min(n_ctx, 512)
    cp.n_threads = cp.n_threads_batch = threads
    ctx = L.llama_init_from_model(model, cp)
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    batch = L.llama_batch_init(n_ctx, 0, 1)
    out = {}
    for name, wins in texts.items():
        nll, count = 0.0, 0
        for w in wins:
            L.llama_memory_clear(L.llama_get_memory(ctx), True)
            for i, t in enumerate(w):
                batch.token[i] = t
                batch.pos[i] = i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = 1
            batch.n_tokens = len(w)
            if L.llama_decode(ctx, batch) != 0:
                raise SystemExit("llama_decode failed")
            logits = np.ctypeslib.as_array(L.llama_get_logits(ctx), shape=(len(w), n_vocab)).copy()
            nll += window_nll(logits, w)
            count += len(w) - 1
        out[name] = {"perplexity": float(np.exp(nll / count)), "scored_tokens": count, "nll_sum": nll}
        print(f"{model_path}: {name} ppl {out[name]['perplexity']:.4f}", file=sys.stderr, flush=True)
    L.llama_batch_free(batch)
    L.llama_free(ctx)
    L.llama_model_free(model)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
