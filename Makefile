# Bessemer: the commands a newcomer runs.
#   make demo   set everything up, fetch SmolLM2, build an engine, generate text
#   make test   set everything up and run the whole test suite (what CI runs) on TEST_WORKERS
#               pytest-xdist processes
#   make check  the edit loop: the tests not marked slow (pyproject.toml), on what
#               `make install` set up
PYTHON ?= python3
# pytest-xdist workers: one per core of the 2-core machines CI runs on
TEST_WORKERS ?= 2
ENGINES ?= engines
MODEL_DIR = $(shell $(PYTHON) -m bessemer.fixtures.smollm2 2>/dev/null | tail -n 1)

.PHONY: install model demo test check bench engines clean

install:
	$(PYTHON) -m pip install -q torch==2.13.0
	$(PYTHON) -m pip install -q pybind11 setuptools wheel
	$(PYTHON) -m pip install -q --no-build-isolation -e ".[test,quant,cuda,bench]"

model: install
	$(PYTHON) -m bessemer.fixtures.smollm2

demo: model
	build-engine "$(MODEL_DIR)" --output $(ENGINES)/smollm2-bf16 --dtype bfloat16 --max-seq-len 2048
	run-engine $(ENGINES)/smollm2-bf16 --chat --max-new-tokens 64 \
		--prompt "What is the capital of France?" \
		--prompt "Write a haiku about a steel mill."

# --dist loadgroup: tests marked xdist_group share one worker (and the fixtures they build).
# Bytecode is cached (in the gitignored __pycache__ folders) even where the environment says
# PYTHONDONTWRITEBYTECODE: the suite starts many Python processes (test workers,
# interpreter children, servers, ranks, CLIs), and without the cache each one compiles the
# sources it imports, and each pytest process rewrites the test modules' asserts, again.
PYTEST = PYTHONDONTWRITEBYTECODE= $(PYTHON) -m pytest -q tests -n $(TEST_WORKERS) --dist loadgroup

test: install
	$(PYTEST) --durations=30

check:
	$(PYTEST) -m "not slow" --durations=10

# Build, validate against HF and publish the engines of engines.yaml (what the engines CI job runs).
engines: model
	bessemer ci-build engines.yaml --out $(ENGINES)/ci

# Bessemer vs llama.cpp, onnxruntime-genai and HF (installs the anchors in its own cached venv
# the first time: llama-cpp-python compiles for ~20 min). BENCH_ARGS: e.g. --quick --systems ...
bench: model
	$(PYTHON) bench/compare.py --model "$(MODEL_DIR)" --out bench/results $(BENCH_ARGS)

clean:
	rm -rf build *.egg-info bessemer/_C*.so $(ENGINES)
