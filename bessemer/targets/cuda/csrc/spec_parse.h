// Python (engine header JSON) -> C++ structs, with every field checked: a missing or
// ill-typed field is one std::invalid_argument naming it.
#pragma once

#include <pybind11/pybind11.h>

#include <stdexcept>
#include <string>

#include "kernel.h"

namespace bessemer {
namespace cuda {

namespace py = pybind11;

template <class T>
T field(const py::handle& obj, const char* key, const std::string& where) {
    py::dict d = py::reinterpret_borrow<py::dict>(obj);
    if (!d.contains(key)) throw std::invalid_argument(where + ": missing '" + key + "'");
    try {
        return d[key].cast<T>();
    } catch (const py::cast_error&) {
        throw std::invalid_argument(where + ": '" + key + "' has the wrong type");
    }
}

template <class T>
T field_or(const py::handle& obj, const char* key, T fallback, const std::string& where) {
    py::dict d = py::reinterpret_borrow<py::dict>(obj);
    return d.contains(key) ? field<T>(obj, key, where) : fallback;
}

// Kernel metadata as targets/cuda/compile.py stores it, plus its parameter table.
inline KernelSpec kernel_spec_from(const py::handle& md) {
    KernelSpec s;
    s.entry = field<std::string>(md, "entry", "kernel metadata");
    const std::string where = "kernel " + s.entry;
    s.num_warps = field<int>(md, "num_warps", where);
    s.num_ctas = field_or<int>(md, "num_ctas", 1, where);
    s.shared = field<uint32_t>(md, "shared", where);
    s.global_scratch_size = field_or<uint64_t>(md, "global_scratch_size", 0, where);
    s.global_scratch_align = field_or<uint64_t>(md, "global_scratch_align", 1, where);
    s.profile_scratch_size = field_or<uint64_t>(md, "profile_scratch_size", 0, where);
    s.profile_scratch_align = field_or<uint64_t>(md, "profile_scratch_align", 1, where);
    s.launch_pdl = field_or<bool>(md, "launch_pdl", false, where);
    s.launch_cooperative_grid = field_or<bool>(md, "launch_cooperative_grid", false, where);
    for (const auto& p : field<py::list>(md, "params", where)) {
        ParamSpec ps;
        ps.name = field<std::string>(p, "name", where + " parameter");
        const std::string pw = where + " parameter " + ps.name;
        ps.type = field<std::string>(p, "type", pw);
        ps.offset = field<uint32_t>(p, "offset", pw);
        ps.size = field<uint32_t>(p, "size", pw);
        ps.divisibility = field_or<uint32_t>(p, "divisibility", 1, pw);
        if (ps.size != 4 && ps.size != 8) throw std::invalid_argument(pw + ": size " + std::to_string(ps.size));
        if (ps.offset % ps.size) throw std::invalid_argument(pw + ": offset not aligned to its size");
        s.params.push_back(ps);
    }
    return s;
}

}  // namespace cuda
}  // namespace bessemer
