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

// Typed reads for the readers built on this parser (every target's plan reader): each throws
// std::invalid_argument naming `where` and what is wrong, so a header error is one line.
const Value& member(const Value& obj, const char* key, const std::string& where);  // "missing 'key'"
int64_t as_int(const Value& v, const std::string& what);                  // an integer
double as_number(const Value& v, const std::string& what);                // an integer or a real
bool as_bool(const Value& v, const std::string& what);
const std::string& as_string(const Value& v, const std::string& what);
const std::vector<Value>& as_list(const Value& v, const std::string& what);
// An optional key: `fallback` when it is absent or null, else the value checked as above.
int64_t int_or(const Value& obj, const char* key, int64_t fallback, const std::string& where);
bool bool_or(const Value& obj, const char* key, bool fallback, const std::string& where);
std::string string_or(const Value& obj, const char* key, const std::string& fallback, const std::string& where);

}  // namespace json
}  // namespace bessemer
