"""The cuda target: Triton kernels compiled ahead of time to cubins stored in the engine, run
by a C++ executor (bessemer._cuda) that loads the CUDA driver with dlopen at run time."""
