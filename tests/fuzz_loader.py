"""A seeded mutation fuzzer of the cpu engine loader: the C++ rank-file parser, the plan
checks of the executor and one step over the loaded plan.

Each case takes a valid rank file and damages it one way: a value somewhere in its JSON
header replaced by a hostile one (negative, huge, wrong type, NaN text, empty, missing), a
list element duplicated or dropped, or raw bytes of the preamble / header flipped. The file
is written back with a valid preamble (as a re-signed engine would be: the checksum in
config.json does not protect against an attacker who rewrites it), then loaded and, if the
loader accepts it, stepped once. A clean refusal (ValueError / RuntimeError from the
loader, or EngineLoadError) is the expected outcome; a crash, a hang or any other
exception is a finding.

    python tests/fuzz_loader.py ENGINE_DIR --seconds 600 [--seed 1]    # a longer run
    python tests/fuzz_loader.py ENGINE_DIR --seconds 1e9 --executions 1000000

tests/test_fuzz_loader.py runs it for a bounded time in CI, in a child process, so that a
crash (a signal) fails the test instead of the test run. The last case is written to
`--last` before it runs, so a crash can be replayed.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import numpy as np

HOSTILE = [-1, 0, 1, 2**31 - 1, 2**31, 2**32 + 7, 2**63 - 1, -(2**63), 10**30, 1e308, -1e-300, 0.5,
           "", "x" * 300, "NaN", [], {}, None, True, [0] * 64, [-1, -1, -1], [2**40, 0, 1]]


def _paths(node, prefix=()):
    """Every (path, value) of a JSON tree."""
    yield prefix, node
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, prefix + (i,))


def _set(tree, path, value):
    for key in path[:-1]:
        tree = tree[key]
    tree[path[-1]] = value


def mutate_header(header_text: str, paths: list, rng: random.Random) -> tuple[dict, str]:
    """A fresh copy of the header (parsed from its text) with one mutation at one of `paths`
    (every path of the header, listed once by the caller)."""
    h = json.loads(header_text)
    path = rng.choice(paths)
    parent = h
    for key in path[:-1]:
        parent = parent[key]
    kind = rng.random()
    if kind < 0.7:
        value = rng.choice(HOSTILE)
        _set(h, path, json.loads(json.dumps(value)))
        return h, f"{'/'.join(map(str, path))} = {json.dumps(value)[:40]}"
    if kind < 0.85 and isinstance(parent, dict):
        del parent[path[-1]]
        return h, f"delete {'/'.join(map(str, path))}"
    if isinstance(parent, list):
        if rng.random() < 0.5 and parent:
            parent.append(parent[path[-1]])
            return h, f"duplicate {'/'.join(map(str, path))}"
        parent.pop(path[-1])
        return h, f"drop {'/'.join(map(str, path))}"
    value = rng.choice(HOSTILE)
    _set(h, path, value)
    return h, f"{'/'.join(map(str, path))} = {json.dumps(value)[:40]}"


class Source:
    """The valid rank file every case starts from, read once."""

    def __init__(self, path: Path):
        from bessemer.format import container

        self.major, self.minor, header, self.data_offset = container.read_rank_header(path)
        self.raw = path.read_bytes()
        self.header_text = json.dumps(header)
        self.paths = [p for p, _ in _paths(header) if p]


def write_case(src: Source, dst: Path, rng: random.Random) -> str:
    from bessemer.format import container

    major, minor, data_offset, raw = src.major, src.minor, src.data_offset, src.raw
    if rng.random() < 0.8:
        mutated, what = mutate_header(src.header_text, src.paths, rng)
        blob = container.header_bytes(mutated)
        pad = container.align_up(container.PREAMBLE.size + len(blob), container.DATA_ALIGN)
        out = bytearray(container.PREAMBLE.pack(container.MAGIC, major, minor, 0, len(blob)) + blob)
        out += b"\0" * (pad - len(out))
        out += raw[data_offset:]
        dst.write_bytes(bytes(out))
        return what
    out = bytearray(raw)
    n = rng.randint(1, 8)
    for _ in range(n):
        i = rng.randrange(0, data_offset)
        out[i] = rng.randrange(256)
    dst.write_bytes(bytes(out))
    return f"{n} bytes flipped in the first {data_offset}"


def run_case(path: Path, block_size: int) -> str:
    """'refused', 'ran' or raises what the loader should not have raised."""
    from bessemer import _C
    from bessemer.errors import BessemerError
    from bessemer.format.step import StepBatch

    try:
        file = _C.EngineFile(str(path))
        executor = _C.Executor(file, 1, block_size, 8, "auto")
    except (ValueError, RuntimeError, BessemerError):
        return "refused"
    try:
        logits = executor.step(StepBatch.of([1, 2, 3], [0, 1, 2], [0, 3], [3], [[0]], [2]))
    except (ValueError, RuntimeError, BessemerError):
        return "refused"
    np.asarray(logits).sum()  # the result is readable memory
    return "ran"


def fuzz(engine: Path, seconds: float, seed: int, work: Path, last: Path | None = None,
         executions: int | None = None) -> dict:
    config = json.loads((engine / "config.json").read_text())
    src = Source(engine / config["ranks"][0]["file"])
    block_size = int(config["build"]["kv_block_size"])
    rng = random.Random(seed)
    counts = {"refused": 0, "ran": 0}
    findings = []
    t0 = time.perf_counter()
    case = work / "case.engine"
    done = 0
    while time.perf_counter() - t0 < seconds and (executions is None or done < executions):
        done += 1
        what = write_case(src, case, rng)
        if last is not None:
            last.write_text(what + "\n")
        try:
            counts[run_case(case, block_size)] += 1
        except Exception as e:  # noqa: BLE001 - any other exception is a finding
            findings.append(f"{what}: {type(e).__name__}: {e}"[:300])
    total = counts["refused"] + counts["ran"] + len(findings)
    return {"executions": total, "seconds": round(time.perf_counter() - t0, 1), "seed": seed,
            "refused": counts["refused"], "ran": counts["ran"], "findings": findings,
            "per_second": round(total / max(time.perf_counter() - t0, 1e-9), 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("engine", type=Path)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--executions", type=int, default=None, help="stop after this many cases (or --seconds)")
    ap.add_argument("--work", type=Path, default=None, help="folder for the case file [default: a temp dir]")
    ap.add_argument("--last", type=Path, default=None, help="write each case's description here before it runs")
    args = ap.parse_args()
    import tempfile

    # the case file is rewritten for every execution: keep it in memory where there is a tmpfs
    shm = Path("/dev/shm")
    with tempfile.TemporaryDirectory(dir=shm if shm.is_dir() else None) as tmp:
        result = fuzz(args.engine, args.seconds, args.seed, args.work or Path(tmp), args.last, args.executions)
    print(json.dumps(result))
    sys.exit(1 if result["findings"] else 0)


if __name__ == "__main__":
    main()
