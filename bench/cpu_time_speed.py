"""Prefill/decode speed of engines built by bench/quant.py, by CPU time of one thread (the machine is heavily shared: wall time
measures the queue, process CPU time of a 1-thread engine measures the work).

    OMP_NUM_THREADS=1 python bench/cpu_time_speed.py fp32,w8a8-sq [ENGINES_DIR]
"""
import statistics, sys, time
from pathlib import Path
from bessemer.runtime.llm import LLM, SamplingParams
from bessemer.runtime.evaluate import read_dataset

names = sys.argv[1].split(",")
root = Path(sys.argv[2]) if len(sys.argv) > 2 else Path("engines/quant")
llms = {n: LLM(root / n, num_threads=1, enable_prefix_caching=False) for n in names}
tok = llms[names[0]].tokenizer
text = read_dataset("wikitext2")
prompt = tok.encode(text[:20000], add_special_tokens=False)[:512]
runs = {n: {"prefill": [], "decode": []} for n in names}
for n in names:
    llms[n].generate([prompt[:64]], SamplingParams(max_tokens=4, temperature=0))
for rep in range(3):
    for n in names:
        c = time.process_time()
        llms[n].generate([prompt], SamplingParams(max_tokens=1, temperature=0))
        runs[n]["prefill"].append(len(prompt) / (time.process_time() - c))
        c = time.process_time()
        llms[n].generate([prompt[:16]], SamplingParams(max_tokens=65, temperature=0, ignore_eos=True))
        t = time.process_time() - c
        runs[n]["decode"].append(64 / t)  # includes a 16-token prefill (small)
    print("round", rep, flush=True)
base = names[0]
for n in names:
    p, d = statistics.median(runs[n]["prefill"]), statistics.median(runs[n]["decode"])
    print(f"{n}: prefill {p:.1f} tok/s-cpu ({p / statistics.median(runs[base]['prefill']):.2f}x), "
          f"decode {d:.1f} tok/s-cpu ({d / statistics.median(runs[base]['decode']):.2f}x)", flush=True)
