"""Tensor parallelism of the cpu target: a `--tp N` engine run as N processes.

    group_executor.py  rank 0's executor: starts the ranks, broadcasts each step, watches them
    worker.py          a non-zero rank's process (`python -m bessemer.targets.cpu.parallel.worker`)
    group.py           the process group: shared memory (one machine) or MPI (`mpirun -n N`)

The collectives themselves (all_reduce / all_gather kernels) run inside the C++ core.
"""
