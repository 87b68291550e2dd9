// A small JSON reader for rank-file headers (format/container.py writes them with Python's
// json: UTF-8, \uXXXX escapes). Strict: one value, no trailing bytes, nesting <= 64;
// errors throw std::invalid_argument naming the byte offset.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace bessemer {
namespace json {

enum class Kind { Null, Bool, Int, Double, String, Array, Object };

struct Value {
    Kind kind = Kind::Null;
    bool boolean = false;
    int64_t integer = 0;  // Kind::Int: a number written without fraction or exponent
    double real = 0.0;    // Kind::Double
    std::string str;
    std::vector<Value> items;                            // Kind::Array
    std::vector<std::pair<std::string, Value>> members;  // Kind::Object, in file order

    const Value* find(const std::string& key) const;  // null if absent (or not an object)
    bool is_number() const { return kind == Kind::Int || kind == Kind::Double; }
    double number() const { return kind == Kind::Int ? double(integer) : real; }
};

Value parse(const char* text, size_t size);

}  // namespace json
}  // namespace bessemer
