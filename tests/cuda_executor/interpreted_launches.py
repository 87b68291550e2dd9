"""The launches the interpreted launcher (bessemer/targets/cuda/interpret.py) makes for a list
of steps, in the symbolic form of launches.py, written as JSON. Run as a script in a process
started with TRITON_INTERPRET=1 (the interpreter's requirement):

    TRITON_INTERPRET=1 python interpreted_launches.py ENGINE_DIR NUM_KV_BLOCKS STEPS.json OUT.json
    TRITON_INTERPRET=1 python interpreted_launches.py --serve

--serve answers one request a line on stdin (the four arguments as a JSON list) with one line
on stdout, "ok" or "error" and the traceback as JSON, so that the tests pay the start-up
(torch, triton, the kernel modules) once and not once per engine; each request builds its own
executor, as a process of its own would.

STEPS.json: [{"inputs": [token_ids, positions, cu_seqlens, context_lens, block_tables,
logits_indices], "sample": null | [temperature, top_k, top_p, uniform]}, ...]. Kernel bodies
are not run (recorded instead): what is compared is what each launch is given.
"""

import contextlib
import json
import sys
import traceback

import numpy as np
import torch

from bessemer.format.step import StepBatch
from bessemer.targets.cuda.interpret import InterpretedExecutor


def main(engine_dir: str, num_kv_blocks: int, steps_path: str, out_path: str) -> None:
    ex = InterpretedExecutor(engine_dir, num_kv_blocks)
    regions = [("buffer", ex.buffers), ("workspace", ex.workspace), ("step", ex.step_arrays), ("kv", ex.cache)]
    weights_base = ex.weights.data_ptr()
    by_offset = sorted((off, name) for name, off in ex.tensor_offsets.items())
    recorded = []

    def symbol(t: torch.Tensor) -> list:
        if t.numel() == 0:
            return ["null"]
        ptr = t.data_ptr()
        if weights_base <= ptr < weights_base + ex.weights.numel():
            off = ptr - weights_base
            start, name = [x for x in by_offset if x[0] <= off][-1]
            return ["weight", name, off - start]
        for kind, region in regions:
            base = region.mem.data_ptr()
            if base <= ptr < base + region.mem.numel():
                off = ptr - base
                start, name = max((o, n) for n, o in region.offsets.items() if o <= off)
                if kind == "buffer":
                    return ["buffer", int(name[1:]), off - start]
                if kind == "kv":
                    return ["kv", name[0], int(name[1:]), off - start]
                return [kind, name, off - start]
        raise AssertionError(f"tensor at {ptr:#x} is in no region")

    class Recorder:
        def __init__(self, kernel_id: int):
            self.kernel_id, self.kernel = kernel_id, ex.kernels[kernel_id]

        def __getitem__(self, grid):
            def call(**kwargs):
                args = []
                for p in self.kernel["params"][:-2]:
                    v = kwargs[p["name"]]
                    if isinstance(v, torch.Tensor):
                        args.append(symbol(v))
                    elif p["type"] == "fp32":
                        args.append(["f32", float(np.float32(v))])
                    else:
                        args.append(["i32", int(v)])
                recorded.append({"kernel": self.kernel_id, "entry": self.kernel["entry"], "grid": list(grid) + [1] * (3 - len(grid)),
                                 "args": args})
            return call

    ex.functions = [Recorder(i) for i in range(len(ex.kernels))]
    per_step = []
    for step in json.loads(open(steps_path).read()):
        start = len(recorded)
        ex.step(StepBatch.of(*step["inputs"]))
        if step.get("sample"):
            temperature, top_k, top_p, uniform = step["sample"]
            ex.sample(np.asarray(temperature, np.float32), np.asarray(top_k, np.int32),
                      np.asarray(top_p, np.float32), np.asarray(uniform, np.float32))
        per_step.append(recorded[start:])
    with open(out_path, "w") as f:
        json.dump(per_step, f)


def serve() -> None:
    replies = sys.stdout
    for line in sys.stdin:
        engine_dir, num_kv_blocks, steps_path, out_path = json.loads(line)
        try:
            with contextlib.redirect_stdout(sys.stderr):  # stdout carries only the replies
                main(engine_dir, int(num_kv_blocks), steps_path, out_path)
            reply = "ok"
        except Exception:
            reply = "error " + json.dumps(traceback.format_exc())
        print(reply, file=replies, flush=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:
        serve()
    else:
        main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4])
