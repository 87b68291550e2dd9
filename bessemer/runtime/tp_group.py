"""The process group of a tensor-parallel engine: how rank 0 broadcasts each step's inputs
and which Collectives the executors' all_reduce / all_gather kernels run over.

- ShmGroup: ranks on one machine, started by rank 0 itself (runtime/tp.py); broadcast
  and collectives go through one shared-memory segment in the C++ core.
- MpiGroup: ranks started by `mpirun -n N` (possibly on several machines); rank discovery,
  broadcast and collectives go through MPI (mpi4py, imported only here).

A step message is int32 words: [kind, T, S, L, B] then token_ids (T), positions (T),
cu_seqlens (S+1), context_lens (S), block_tables (S*B), logits_indices (L); kind 0 = stop.
"""

from __future__ import annotations

import os

import numpy as np

STEP, STOP = 1, 0
MPI_ENV = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE")  # set by mpirun / PMI launchers


def encode_step(tokens, positions, cu, context, tables, indices) -> np.ndarray:
    tables = np.asarray(tables, dtype=np.int32)
    head = np.array([STEP, len(tokens), len(context), len(indices), tables.shape[1]], dtype=np.int32)
    return np.concatenate([head] + [np.asarray(a, dtype=np.int32).ravel()
                                    for a in (tokens, positions, cu, context, tables, indices)])


def decode_step(words: np.ndarray) -> tuple[np.ndarray, ...]:
    _, t, s, l, b = (int(v) for v in words[:5])
    sizes = [t, t, s + 1, s, s * b, l]
    parts, at = [], 5
    for n in sizes:
        parts.append(words[at:at + n])
        at += n
    parts[4] = parts[4].reshape(s, b)
    return tuple(parts)


def max_step_words(max_num_tokens: int, max_batch_size: int, max_blocks: int) -> int:
    t, s = max_num_tokens, max_batch_size
    return 5 + 3 * t + 2 * s + 1 + s * max_blocks


def launched_by_mpi() -> bool:
    return any(int(os.environ.get(k, "1")) > 1 for k in MPI_ENV)


class MpiGroup:
    """Collectives and broadcast over MPI.COMM_WORLD (one rank per process)."""

    def __init__(self):
        try:
            from mpi4py import MPI
        except ImportError as e:
            from bessemer.errors import TensorParallelError

            raise TensorParallelError(f"running under mpirun needs mpi4py ({e}); pip install 'bessemer[mpi]'") from None
        self.MPI = MPI
        self.comm = MPI.COMM_WORLD
        self.rank, self.world = self.comm.Get_rank(), self.comm.Get_size()

    def collectives(self):
        from bessemer import _C

        return _C.PyCollectives(self, self.rank, self.world)

    def all_reduce(self, x: np.ndarray) -> None:
        # x: (rows, width) view of an executor buffer (row stride may exceed width)
        buf = np.ascontiguousarray(x)
        self.comm.Allreduce(self.MPI.IN_PLACE, buf, op=self.MPI.SUM)
        x[...] = buf

    def all_gather(self, x: np.ndarray, y: np.ndarray) -> None:
        # x: (rows, shard) -> y: (rows, full). Each rank's columns, zeros elsewhere, summed:
        # x + 0 is exact, so this equals a gather.
        from bessemer.plugins.ops import shard_range

        start, stop = shard_range(y.shape[1], self.world, self.rank)
        full = np.zeros(y.shape, dtype=np.float32)
        full[:, start:stop] = x
        self.comm.Allreduce(self.MPI.IN_PLACE, full, op=self.MPI.SUM)
        y[...] = full

    def send(self, words: np.ndarray) -> None:
        n = np.array([len(words)], dtype=np.int64)
        self.comm.Bcast(n, root=0)
        self.comm.Bcast(np.ascontiguousarray(words, dtype=np.int32), root=0)

    def recv(self) -> np.ndarray:
        n = np.zeros(1, dtype=np.int64)
        self.comm.Bcast(n, root=0)
        words = np.empty(int(n[0]), dtype=np.int32)
        self.comm.Bcast(words, root=0)
        return words

    def stop(self) -> None:
        self.send(np.array([STOP, 0, 0, 0, 0], dtype=np.int32))
