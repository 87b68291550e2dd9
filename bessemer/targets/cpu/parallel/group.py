"""The process group of a tensor-parallel engine: how rank 0 broadcasts each step's inputs
and which Collectives the executors' all_reduce / all_gather kernels run over.

- ShmGroup: ranks on one machine, started by rank 0 itself (group_executor.py); broadcast
  and collectives go through one shared-memory segment in the C++ core.
- MpiGroup: ranks started by `mpirun -n N` (possibly on several machines); rank discovery,
  broadcast and collectives go through MPI (mpi4py, imported only here).

A step message is a StepBatch's wire form (format/step.py: StepBatch.encode / decode).
"""

from __future__ import annotations

import os

import numpy as np

from bessemer.format.step import stop_words

MPI_ENV = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE")  # set by mpirun / PMI launchers


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
        self.send(stop_words())
