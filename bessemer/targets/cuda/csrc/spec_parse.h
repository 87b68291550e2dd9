// A kernel's metadata (targets/cuda/compile.py writes it into the rank header's "kernels")
// -> KernelSpec, read with the contract's JSON reader and every field checked: a missing or
// ill-typed field is one std::invalid_argument naming it.
#pragma once

#include "json.h"
#include "kernel.h"

namespace bessemer {
namespace cuda {

KernelSpec kernel_spec_from(const json::Value& metadata);

}  // namespace cuda
}  // namespace bessemer
