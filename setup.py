"""Packaging only: metadata, console scripts and the two C++ extensions: bessemer._C (the cpu
target) and bessemer._cuda (the cuda target's executor, built everywhere: it loads the CUDA
driver with dlopen at run time, so it needs no CUDA headers or libraries to build or import)."""

from glob import glob

from pybind11.setup_helpers import ParallelCompile, Pybind11Extension, build_ext
from setuptools import find_packages, setup

# Compile the extensions' sources in parallel (BESSEMER_BUILD_JOBS, default: every core).
ParallelCompile("BESSEMER_BUILD_JOBS", default=0).install()

# AVX2+FMA is the baseline ISA of the cpu target; AVX-512 kernels are compiled in files
# that enable it with `#pragma GCC target` and are chosen at run time (cpu_features()).
EXTRA_COMPILE_ARGS = ["-O3", "-std=c++17", "-mavx2", "-mfma", "-mf16c", "-fopenmp",
                      "-fno-math-errno", "-Wall", "-Wno-unknown-pragmas"]

# The engine contract's C++ (rank-file reader, header JSON, tensor table, plan, step checks):
# linked into every target's extension, so each reads an engine the same way.
CONTRACT_SOURCES = sorted(glob("bessemer/format/csrc/*.cpp"))
CONTRACT_INCLUDE = "bessemer/format/csrc"

ext = Pybind11Extension(
    "bessemer._C",
    # the contract and the cpu target: executor, bindings and communicator
    # (targets/cpu/csrc), kernels (targets/cpu/csrc/kernels)
    CONTRACT_SOURCES + sorted(glob("bessemer/targets/cpu/csrc/*.cpp")
                              + glob("bessemer/targets/cpu/csrc/kernels/*.cpp")),
    include_dirs=[CONTRACT_INCLUDE, "bessemer/targets/cpu/csrc", "bessemer/targets/cpu/csrc/kernels"],
    extra_compile_args=EXTRA_COMPILE_ARGS,
    extra_link_args=["-fopenmp"],
)

cuda_ext = Pybind11Extension(
    "bessemer._cuda",
    # the contract and the cuda target's executor (no CUDA headers or libraries: see above)
    CONTRACT_SOURCES + sorted(glob("bessemer/targets/cuda/csrc/*.cpp")),
    include_dirs=[CONTRACT_INCLUDE, "bessemer/targets/cuda/csrc"],
    extra_compile_args=["-O2", "-std=c++17", "-Wall"],
    libraries=["dl"],
)

setup(
    name="bessemer",
    version="0.1.0",
    description="Ahead-of-time LLM engine builder and runtime",
    packages=find_packages(include=["bessemer", "bessemer.*"]),
    # WikiText-2 validation text (CC BY-SA 3.0, see its README) for eval, gates and calibration
    package_data={"bessemer": ["py.typed"], "bessemer.datasets": ["wikitext-2/*", "hamlet/*", "python-code/*"],
                  "bessemer.serving_bench": ["prompts.jsonl"]},
    python_requires=">=3.10",
    install_requires=["numpy", "click", "pyyaml", "safetensors", "tokenizers", "jinja2", "psutil"],
    extras_require={
        # The builder reads checkpoints with torch; the runtime needs none of these.
        "build": ["torch==2.13.0", "transformers", "gguf", "accelerate"],
        # pytest < 9.2: pytest-xdist 3.8's --dist loadgroup renames each grouped test's item._nodeid,
        # which pytest 9.2 no longer reads (its node ids became structured), so the groups are
        # silently lost and every module fixture (servers, a Ray cluster) is set up on both
        # workers, some twice; tests/conftest.py fails a run whose groups are lost
        "test": ["pytest>=8,<9.2", "pytest-xdist", "torch==2.13.0", "transformers", "gguf", "accelerate", "openai", "fastapi",
                 "uvicorn", "httpx", "openmpi", "mpi4py", "llguidance==1.9.1", "jsonschema", "ray[serve]>=2.60"],
        "serve": ["fastapi", "uvicorn"],
        # `bessemer serve --replicas N`: replicas behind one endpoint (bessemer/serving/ray); its router
        # uses RequestRouter hooks (on_request_completed) that older Ray lacks: 2.60 is the one tested
        "ray": ["ray[serve]>=2.60", "fastapi", "uvicorn"],
        # `bessemer bench serve` (its client is httpx; --plot draws with matplotlib)
        "bench": ["httpx", "matplotlib"],
        # constrained decoding (json_schema / regex / grammar, response_format, tools); no torch
        "structured": ["llguidance==1.9.1"],
        # `mpirun -n N run-engine ...`: MPI rank discovery and collectives (targets/cpu/parallel/group.py)
        "mpi": ["openmpi", "mpi4py"],
        "tensorrt": ["tensorrt", "cuda-python", "onnx"],
        "quant": ["nvidia-modelopt", "requests"],
        # --target cuda: Triton compiles the kernels to cubins ahead of time (no GPU needed);
        # pinned so cubins built anywhere match what the GPU machine's tools expect
        "cuda": ["triton==3.6.0"],
    },
    ext_modules=[ext, cuda_ext],
    cmdclass={"build_ext": build_ext},
    entry_points={
        "console_scripts": [
            "build-engine=bessemer.cli.build:main",
            "run-engine=bessemer.cli.run:main",
            "bessemer=bessemer.cli.main:main",
        ]
    },
)
