#!/usr/bin/env bash
# The GPU check of the cuda target, in one run of at most 8 minutes (CHECK_TOTAL_S):
# install, random bf16 checkpoints at SmolLM2-135M / Llama-3.2-1B / Llama-3.1-8B shapes,
# cuda engines, correctness then speed of each (tests/gpu/check.py). Writes under $OUT:
# check.log (everything), install.log, results.json (after every stage), and prints a
# summary table; checkpoints and engines (bf16 suite ~40 GiB; quant suite ~33 GiB at its
# peak, one engine at a time) go to $WORK, never under $OUT: `df -h` of it comes first.
# Kernels already compiled for these shapes (a carried .cache/kernels, filled on CPU by
# tests/gpu/prebuild_kernels.py, which lists the keys each suite needs) are taken from that
# cache: the same inputs give the same cubins; the count found is printed. Fails fast, with
# one line saying why, when a stage cannot run.
#
#   OUT=/some/dir tests/gpu/check.sh              # on the GPU machine (no network needed)
#   OUT=/some/dir tests/gpu/check.sh --rehearse   # on CPU: tiny shapes, the fake driver
#   OUT=/some/dir tests/gpu/check.sh --stage-limit hf-compiled=90   # a stage's limit (check.py)
#   OUT=/some/dir tests/gpu/check.sh --suite quant   # int4 / fp8 / fp8-KV engines of the 8B shape
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-check-out}
TOTAL_S=${CHECK_TOTAL_S:-480}
REHEARSE=""
[[ "${1:-}" == "--rehearse" ]] && REHEARSE=--rehearse && shift
SUITE=bf16
[[ " $* " == *" quant "* || " $* " == *"--suite=quant"* ]] && SUITE=quant
# any further arguments go to check.py (e.g. --stage-limit hf-compiled=90)
# on the GPU: the carried cache (prebuild_kernels.py); a rehearsal shares the user's cache
[[ -z $REHEARSE ]] && export BESSEMER_KERNEL_CACHE=${BESSEMER_KERNEL_CACHE:-$PWD/.cache/kernels}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/check.log") 2>&1
start=$(date +%s)
die() { echo "check.sh: FAILED: $*"; exit 1; }
echo "check.sh: $(date -u +%FT%TZ) in $PWD, out $OUT, suite $SUITE ${REHEARSE:+(rehearsal)}"

# where checkpoints and engines go, and its disk first: the 8B ones are 5-16 GB each
gib_free() { local v; v=$(df -Pk "$1" 2>/dev/null | awk 'NR==2 {print int($4 / 1048576)}'); echo "${v:-0}"; }
if [[ -n $REHEARSE ]]; then
  need=2
else  # the peak of the suite's checkpoints and engines (gpu_disk.py: from the shapes)
  need=${CHECK_DISK_GIB:-$(python tests/gpu/gpu_disk.py "$SUITE" 2>/dev/null || echo 40)}
fi
if [[ -z ${WORK:-} ]]; then  # on the GPU machine RAM (/dev/shm) when it holds them: no disk writes
  WORK=${TMPDIR:-/tmp}/bessemer-gpu-check
  [[ -z $REHEARSE ]] && (( $(gib_free /dev/shm) >= need + 16 )) && WORK=/dev/shm/bessemer-gpu-check
fi
mkdir -p "$WORK"
df -h "$WORK"
free_gib=$(gib_free "$WORK")
echo "check.sh: work $WORK ($free_gib GiB free; the $SUITE suite needs ~$need GiB at its peak)"
(( free_gib >= need )) || die "$free_gib GiB free under $WORK; checkpoints and engines need ~$need GiB (set WORK)"
python tests/gpu/kernel_cache_count.py "${BESSEMER_KERNEL_CACHE:-$HOME/.cache/bessemer/kernels}" "$SUITE"

# 0. what this machine has (the GPU image has no network: nothing can be fetched)
python -c "import sys; assert sys.version_info >= (3, 10)" || die "Python >= 3.10 is needed"
for mod in torch transformers numpy pybind11 setuptools safetensors; do  # what the check's path imports
  python -c "import $mod" 2>/dev/null || die "Python package '$mod' is missing; it must be in the image"
done
for mod in tokenizers click yaml jinja2; do  # the CLI and text paths only: noted, not needed here
  python -c "import $mod" 2>/dev/null || echo "check.sh: note: '$mod' is missing (the CLI/tokenizer need it, this check does not)"
done
command -v g++ >/dev/null || die "g++ is needed to compile the extensions"
if [[ -z $REHEARSE ]]; then
  python -c "import triton" 2>/dev/null || die "triton is missing: it compiles the engines' kernels"
  nvidia-smi -L || die "nvidia-smi failed: no NVIDIA driver or GPU here"
  python -c "import torch; assert torch.cuda.is_available()" || die "torch sees no GPU"
else
  if [[ -z ${BESSEMER_LIBCUDA:-} ]]; then  # the fake driver stands in for the GPU
    g++ -std=c++17 -O1 -shared -fPIC -Ibessemer/targets/cuda/csrc tests/cuda_executor/fake_libcuda.cpp \
      -o "$OUT/libcuda.so.1" || die "cannot compile the fake driver"
    export BESSEMER_LIBCUDA=$OUT/libcuda.so.1
  fi
  export TRITON_INTERPRET=1  # the interpreted launcher computes what the fake driver cannot
fi

# 1. install: compiles bessemer._C and bessemer._cuda against this Python. A rehearsal never
# reinstalls (that would repoint this machine's install): it builds the extensions in place.
t=$(date +%s)
in_place() {  # the extensions built in this tree, found through PYTHONPATH
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
  python -c "import bessemer._C, bessemer._cuda" 2>/dev/null && return 0
  python setup.py build_ext --inplace -q >> "$OUT/install.log" 2>&1 || die "build_ext failed (see $OUT/install.log)"
}
if [[ -z $REHEARSE ]]; then
  if ! python -m pip install --no-build-isolation --no-deps -e . > "$OUT/install.log" 2>&1; then
    tail -n 20 "$OUT/install.log"
    echo "check.sh: pip install failed (see $OUT/install.log); building the extensions in place instead"
    in_place
  fi
else
  in_place
fi
python -c "import bessemer._C, bessemer._cuda" || die "the installed package does not import"
echo "check.sh: install took $(( $(date +%s) - t ))s"

# 2. the stages, under what is left of the budget (results.json survives a cut)
left=$(( TOTAL_S - ($(date +%s) - start) ))
(( left > 60 )) || die "only ${left}s left after the install"
rc=0
timeout --kill-after=10 $(( left - 5 )) python tests/gpu/check.py --out "$OUT" --work "$WORK" --budget-s $(( left - 25 )) $REHEARSE "$@" || rc=$?
if (( rc == 124 || rc == 137 )); then
  echo "check.sh: stopped at the ${TOTAL_S}s mark; $OUT/results.json holds the stages that finished:"
  [[ -f $OUT/results.json ]] && python tests/gpu/report.py "$OUT/results.json"
fi
echo "check.sh: finished in $(( $(date +%s) - start ))s, exit $rc"
exit $rc
