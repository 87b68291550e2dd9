"""What a plain streaming read of memory reaches on this machine with a given thread count:
the ceiling for a memory-bound decode kernel (a GEMV reads each weight byte once and writes
almost nothing, so copy bandwidth, which also writes, is the wrong yardstick).

NumPy's reductions are not a plain read (their arithmetic, not the memory, bounds them, at
about half of it on an AVX-512 machine), so the loop is a few lines of C compiled here, once
per process, with the system C compiler (`cc`, which building bessemer._C already needs):
each OpenMP thread ORs its contiguous part of the buffer 64 bytes at a time.

    python bench/read_bandwidth.py [--threads 1,2] [--mib 1024]
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

_SOURCE = r"""
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <omp.h>
/* OR of every 32-byte word of p[0, n) (n a multiple of 128), nthreads threads each reading
   one contiguous part: the result only keeps the loads from being optimized away. */
uint64_t read_all(const char* p, size_t n, int nthreads) {
    uint64_t total = 0;
#pragma omp parallel num_threads(nthreads) reduction(| : total)
    {
        const size_t t = omp_get_thread_num(), nt = omp_get_num_threads(), lines = n / 128;
        const char* lo = p + lines * t / nt * 128;
        const char* hi = p + lines * (t + 1) / nt * 128;
        __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
        for (; lo < hi; lo += 128) {
            a = _mm256_or_si256(a, _mm256_load_si256((const __m256i*)lo));
            b = _mm256_or_si256(b, _mm256_load_si256((const __m256i*)(lo + 32)));
            c = _mm256_or_si256(c, _mm256_load_si256((const __m256i*)(lo + 64)));
            d = _mm256_or_si256(d, _mm256_load_si256((const __m256i*)(lo + 96)));
        }
        a = _mm256_or_si256(_mm256_or_si256(a, b), _mm256_or_si256(c, d));
        total |= (uint64_t)_mm256_extract_epi64(a, 0) | (uint64_t)_mm256_extract_epi64(a, 3);
    }
    return total;
}
"""


@functools.lru_cache(maxsize=1)
def _reader():
    with tempfile.TemporaryDirectory(prefix="read_bandwidth-") as d:  # loaded, the library outlives its file
        tmp = Path(d)
        (tmp / "read.c").write_text(_SOURCE)
        cmd = ["cc", "-O2", "-mavx2", "-fopenmp", "-shared", "-fPIC", str(tmp / "read.c"), "-o", str(tmp / "read.so")]
        try:
            subprocess.run(cmd, check=True, capture_output=True, text=True)
        except (OSError, subprocess.CalledProcessError) as e:
            raise RuntimeError(f"read_bandwidth: compiling its C loop failed ({' '.join(cmd)}): "
                               f"{getattr(e, 'stderr', '') or e}; install a C compiler with OpenMP (gcc)") from e
        lib = ctypes.CDLL(str(tmp / "read.so"))
    lib.read_all.restype = ctypes.c_uint64
    lib.read_all.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return lib


def read_bandwidth(threads: int, mib: int = 1024, trials: int = 5) -> dict:
    """Bytes read / s of a plain read of a `mib` MiB buffer (far beyond the caches) with
    `threads` threads, best of `trials` (load from elsewhere only lowers it)."""
    lib = _reader()
    raw = np.ones(mib * 2**20 + 64, dtype=np.uint8)
    off = -raw.ctypes.data % 64  # 32-byte aligned loads
    buf = raw[off:off + mib * 2**20]
    best = 0.0
    for _ in range(trials):
        t0 = time.perf_counter()
        lib.read_all(buf.ctypes.data, buf.nbytes, threads)
        best = max(best, buf.nbytes / (time.perf_counter() - t0))
    return {"read_GBps": round(best / 1e9, 2), "buffer_MiB": mib, "threads": threads, "trials": trials,
            "convention": "bytes read / s, best of trials"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--mib", type=int, default=1024)
    args = ap.parse_args()
    for t in (int(v) for v in args.threads.split(",")):
        print(f"threads {t}: {read_bandwidth(t, args.mib)['read_GBps']} GB/s read")


if __name__ == "__main__":
    main()
