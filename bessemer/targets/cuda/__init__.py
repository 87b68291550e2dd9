"""The cuda target: Triton kernels compiled ahead of time (on any machine, no GPU needed) to
cubins stored in the engine, with a launch list a C++ executor runs without Python.

    kernels/      Triton kernels, one file per op family
    kernel_table.py  the ops it runs and the kernel reading each stored quantized format
    lower.py      graph -> cuda plan (buffers, step inputs, launch list, kernel specs)
    plan.py       the cuda plan and kernel-section format (the contract with the launcher)
    compile.py    ahead-of-time compilation of kernel specs to cubins, in parallel, cached
    cubin.py      reading a cubin without a GPU: arch, parameter table, registers, SASS
    interpret.py  runs a cuda engine's launch list on CPU through the Triton interpreter
    csrc/         the C++ executor (bessemer._cuda): the driver through dlopen, the launch list
    device.py     opening a GPU through that executor, the device report
    executor.py   a cuda engine's executor: device memory, weights upload, steps

Triton is an optional dependency (`pip install 'bessemer[cuda]'`): nothing here is
imported by the cpu target, and triton itself is imported only where a kernel is needed.
Running a cuda engine needs neither Triton nor torch, only the NVIDIA driver.
"""

from bessemer.targets.cuda.target import TARGET  # noqa: E402,F401 - the registry's entry (targets/__init__.py)
