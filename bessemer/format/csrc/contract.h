// The contract's rules over the generated tables of format.h: names of ids, the size rule
// of every layout, the KV cache's bytes per token. One C++ implementation for every
// target's executor; tests/test_format_contract.py checks it against format/*.py.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "format.h"

namespace bessemer {

const DTypeInfo* dtype_info(int dtype);      // null for an unknown id
const LayoutInfo* layout_info(int layout);   // null for an unknown id
const KvDTypeInfo* kv_dtype_info(int dtype); // null when the KV cache cannot hold dtype
const char* dtype_name(int dtype);           // "unknown" for an unknown id
const char* layout_name(int layout);
int dtype_id(const std::string& name);       // -1 for an unknown name

// Bytes a (dtype, layout, shape) tensor takes in a rank file (format/layouts.py), or -1
// with *why set when the layout cannot hold it (or the size overflows).
int64_t stored_nbytes(int dtype, int layout, const std::vector<int64_t>& shape, std::string* why);

// KV cache bytes one token takes over all layers, K and V, scales included (format/kv.py).
int64_t kv_bytes_per_token(int num_layers, int num_kv_heads, int head_dim, int dtype);

}  // namespace bessemer
