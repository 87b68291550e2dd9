// The rank header of a cuda engine (Python objects from its JSON) -> LaunchPlan.
#pragma once

#include <pybind11/pybind11.h>

#include "launch_plan.h"

namespace bessemer {
namespace cuda {

// header: {"target", "plan", "kernels", "tensors"}; data_size: bytes of the data section.
// Throws std::invalid_argument naming the first problem.
LaunchPlan parse_plan(const pybind11::dict& header, uint64_t data_size);

}  // namespace cuda
}  // namespace bessemer
