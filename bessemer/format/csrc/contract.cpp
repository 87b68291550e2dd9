#include "contract.h"

#include <limits>

namespace bessemer {

const DTypeInfo* dtype_info(int dtype) {
    for (const DTypeInfo& d : kDTypes)
        if (d.id == dtype) return &d;
    return nullptr;
}

const LayoutInfo* layout_info(int layout) {
    for (const LayoutInfo& l : kLayouts)
        if (l.id == layout) return &l;
    return nullptr;
}

const KvDTypeInfo* kv_dtype_info(int dtype) {
    for (const KvDTypeInfo& k : kKvDTypes)
        if (k.dtype == dtype) return &k;
    return nullptr;
}

const char* dtype_name(int dtype) {
    const DTypeInfo* d = dtype_info(dtype);
    return d ? d->name : "unknown";
}

const char* layout_name(int layout) {
    const LayoutInfo* l = layout_info(layout);
    return l ? l->name : "unknown";
}

int dtype_id(const std::string& name) {
    for (const DTypeInfo& d : kDTypes)
        if (name == d.name) return d.id;
    return -1;
}

int64_t stored_nbytes(int dtype, int layout, const std::vector<int64_t>& shape, std::string* why) {
    const DTypeInfo* d = dtype_info(dtype);
    const LayoutInfo* l = layout_info(layout);
    if (!d) {
        *why = "unknown dtype id " + std::to_string(dtype);
        return -1;
    }
    if (!l) {
        *why = "unknown layout id " + std::to_string(layout);
        return -1;
    }
    if (l->num_dtypes > 0) {
        bool ok = false;
        std::string names;
        for (int i = 0; i < l->num_dtypes; ++i) {
            ok = ok || l->dtypes[i] == dtype;
            names += std::string(i ? "/" : "") + dtype_name(l->dtypes[i]);
        }
        if (!ok) {
            *why = std::string(l->name) + " layout needs dtype " + names;
            return -1;
        }
    }
    if (l->ndim > 0 && int(shape.size()) != l->ndim) {
        *why = std::string(l->name) + " layout needs a " + std::to_string(l->ndim) + "-D shape";
        return -1;
    }
    for (int64_t s : shape)
        if (s < 0) {
            *why = "negative dimension in shape";
            return -1;
        }
    std::vector<int64_t> dims = shape;
    if (l->ndim == 2) {
        if (dims[1] % l->k_multiple != 0) {
            *why = std::string(l->name) + " layout needs K a multiple of " + std::to_string(l->k_multiple);
            return -1;
        }
        dims[0] = (dims[0] + l->row_align - 1) / l->row_align * l->row_align;
        dims[1] = (dims[1] + l->col_align - 1) / l->col_align * l->col_align;
    }
    int64_t n = 1;
    for (int64_t s : dims) {
        if (s != 0 && n > std::numeric_limits<int64_t>::max() / 8 / s) {
            *why = "shape too large";
            return -1;
        }
        n *= s;
    }
    return (n * d->bits + 7) / 8;
}

int64_t kv_bytes_per_token(int num_layers, int num_kv_heads, int head_dim, int dtype) {
    const KvDTypeInfo* k = kv_dtype_info(dtype);
    if (!k) return -1;
    return 2 * int64_t(num_layers) * num_kv_heads * (int64_t(head_dim) * dtype_info(dtype)->bits / 8 + k->scale_bytes);
}

}  // namespace bessemer
