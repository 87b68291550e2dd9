// A cuda rank file -> LaunchPlan. The file, its header JSON, its tensor table and its KV
// cache section are read by the engine contract's C++ (format/csrc: the same reader, dtype
// table and KV scale rule as every target); what is parsed here is the cuda plan schema
// (targets/cuda/plan.py) on top of those: launches, kernels, buffers, step inputs.
#pragma once

#include "launch_plan.h"
#include "rank_file.h"

namespace bessemer {
namespace cuda {

// Throws std::invalid_argument naming the first problem.
LaunchPlan read_launch_plan(const EngineFile& file);

}  // namespace cuda
}  // namespace bessemer
