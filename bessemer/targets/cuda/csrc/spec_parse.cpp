#include "spec_parse.h"

#include <limits>
#include <stdexcept>
#include <string>

namespace bessemer {
namespace cuda {

namespace {

// An integer field that must fit `T` (an unsigned size, offset or count).
template <class T>
T bounded(int64_t v, const std::string& what) {
    if (v < 0 || uint64_t(v) > uint64_t(std::numeric_limits<T>::max()))
        throw std::invalid_argument(what + " = " + std::to_string(v) + " is out of range");
    return T(v);
}

template <class T>
T field(const json::Value& md, const char* key, const std::string& where) {
    return bounded<T>(json::as_int(json::member(md, key, where), where + ": '" + key + "'"),
                      where + ": '" + key + "'");
}

template <class T>
T field_or(const json::Value& md, const char* key, T fallback, const std::string& where) {
    return bounded<T>(json::int_or(md, key, int64_t(fallback), where), where + ": '" + key + "'");
}

}  // namespace

KernelSpec kernel_spec_from(const json::Value& md) {
    KernelSpec s;
    s.entry = json::as_string(json::member(md, "entry", "kernel metadata"), "kernel metadata: 'entry'");
    const std::string where = "kernel " + s.entry;
    s.num_warps = field<int>(md, "num_warps", where);
    s.num_ctas = field_or<int>(md, "num_ctas", 1, where);
    s.shared = field<uint32_t>(md, "shared", where);
    s.global_scratch_size = field_or<uint64_t>(md, "global_scratch_size", 0, where);
    s.global_scratch_align = field_or<uint64_t>(md, "global_scratch_align", 1, where);
    s.profile_scratch_size = field_or<uint64_t>(md, "profile_scratch_size", 0, where);
    s.profile_scratch_align = field_or<uint64_t>(md, "profile_scratch_align", 1, where);
    s.launch_pdl = json::bool_or(md, "launch_pdl", false, where);
    s.launch_cooperative_grid = json::bool_or(md, "launch_cooperative_grid", false, where);
    for (const json::Value& p : json::as_list(json::member(md, "params", where), where + ": 'params'")) {
        ParamSpec ps;
        ps.name = json::as_string(json::member(p, "name", where + " parameter"), where + " parameter name");
        const std::string pw = where + " parameter " + ps.name;
        ps.type = json::as_string(json::member(p, "type", pw), pw + ": 'type'");
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
