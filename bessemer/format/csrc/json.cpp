#include "json.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace bessemer {
namespace json {

const Value* Value::find(const std::string& key) const {
    if (kind != Kind::Object) return nullptr;
    for (const auto& m : members)
        if (m.first == key) return &m.second;
    return nullptr;
}

namespace {

constexpr int kMaxDepth = 64;

class Parser {
   public:
    Parser(const char* p, size_t n) : p_(p), n_(n) {}

    Value document() {
        Value v = value(0);
        skip_ws();
        if (i_ != n_) fail("trailing bytes after the JSON value");
        return v;
    }

   private:
    [[noreturn]] void fail(const std::string& what) const {
        throw std::invalid_argument("header JSON: " + what + " at byte " + std::to_string(i_));
    }
    void skip_ws() {
        while (i_ < n_ && (p_[i_] == ' ' || p_[i_] == '\n' || p_[i_] == '\r' || p_[i_] == '\t')) ++i_;
    }
    bool literal(const char* word) {
        const size_t len = std::strlen(word);
        if (n_ - i_ < len || std::memcmp(p_ + i_, word, len) != 0) return false;
        i_ += len;
        return true;
    }

    Value value(int depth) {
        if (depth > kMaxDepth) fail("nesting deeper than 64");
        skip_ws();
        if (i_ >= n_) fail("unexpected end");
        Value v;
        const char c = p_[i_];
        if (c == '{') {
            v.kind = Kind::Object;
            ++i_;
            skip_ws();
            if (i_ < n_ && p_[i_] == '}') {
                ++i_;
                return v;
            }
            for (;;) {
                skip_ws();
                if (i_ >= n_ || p_[i_] != '"') fail("expected a string key");
                std::string key = string();
                skip_ws();
                if (i_ >= n_ || p_[i_] != ':') fail("expected ':'");
                ++i_;
                v.members.emplace_back(std::move(key), value(depth + 1));
                skip_ws();
                if (i_ < n_ && p_[i_] == ',') {
                    ++i_;
                    continue;
                }
                if (i_ < n_ && p_[i_] == '}') {
                    ++i_;
                    return v;
                }
                fail("expected ',' or '}'");
            }
        }
        if (c == '[') {
            v.kind = Kind::Array;
            ++i_;
            skip_ws();
            if (i_ < n_ && p_[i_] == ']') {
                ++i_;
                return v;
            }
            for (;;) {
                v.items.push_back(value(depth + 1));
                skip_ws();
                if (i_ < n_ && p_[i_] == ',') {
                    ++i_;
                    continue;
                }
                if (i_ < n_ && p_[i_] == ']') {
                    ++i_;
                    return v;
                }
                fail("expected ',' or ']'");
            }
        }
        if (c == '"') {
            v.kind = Kind::String;
            v.str = string();
            return v;
        }
        if (literal("true")) {
            v.kind = Kind::Bool;
            v.boolean = true;
            return v;
        }
        if (literal("false")) {
            v.kind = Kind::Bool;
            return v;
        }
        if (literal("null")) return v;
        return number();
    }

    Value number() {
        const size_t start = i_;
        bool integral = true;
        if (i_ < n_ && p_[i_] == '-') ++i_;
        if (i_ >= n_ || p_[i_] < '0' || p_[i_] > '9') fail("invalid value");
        while (i_ < n_ && ((p_[i_] >= '0' && p_[i_] <= '9') || p_[i_] == '.' || p_[i_] == 'e' || p_[i_] == 'E' ||
                           p_[i_] == '+' || p_[i_] == '-')) {
            if (p_[i_] == '.' || p_[i_] == 'e' || p_[i_] == 'E') integral = false;
            ++i_;
        }
        const std::string text(p_ + start, i_ - start);
        Value v;
        char* end = nullptr;
        errno = 0;
        if (integral) {
            const long long x = std::strtoll(text.c_str(), &end, 10);
            if (*end == '\0' && errno == 0) {
                v.kind = Kind::Int;
                v.integer = x;
                return v;
            }
        }
        errno = 0;
        const double d = std::strtod(text.c_str(), &end);
        if (*end != '\0') fail("invalid number '" + text + "'");
        v.kind = Kind::Double;
        v.real = d;
        return v;
    }

    static void put_utf8(std::string& out, uint32_t cp) {
        if (cp < 0x80) {
            out += char(cp);
        } else if (cp < 0x800) {
            out += char(0xC0 | (cp >> 6));
            out += char(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
            out += char(0xE0 | (cp >> 12));
            out += char(0x80 | ((cp >> 6) & 0x3F));
            out += char(0x80 | (cp & 0x3F));
        } else {
            out += char(0xF0 | (cp >> 18));
            out += char(0x80 | ((cp >> 12) & 0x3F));
            out += char(0x80 | ((cp >> 6) & 0x3F));
            out += char(0x80 | (cp & 0x3F));
        }
    }

    uint32_t hex4() {
        if (n_ - i_ < 4) fail("truncated \\u escape");
        uint32_t v = 0;
        for (int k = 0; k < 4; ++k) {
            const char c = p_[i_++];
            v <<= 4;
            if (c >= '0' && c <= '9') v |= uint32_t(c - '0');
            else if (c >= 'a' && c <= 'f') v |= uint32_t(c - 'a' + 10);
            else if (c >= 'A' && c <= 'F') v |= uint32_t(c - 'A' + 10);
            else fail("bad \\u escape");
        }
        return v;
    }

    std::string string() {
        ++i_;  // opening quote
        std::string out;
        for (;;) {
            if (i_ >= n_) fail("unterminated string");
            const char c = p_[i_++];
            if (c == '"') return out;
            if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string");
            if (c != '\\') {
                out += c;
                continue;
            }
            if (i_ >= n_) fail("unterminated escape");
            const char e = p_[i_++];
            switch (e) {
                case '"': out += '"'; break;
                case '\\': out += '\\'; break;
                case '/': out += '/'; break;
                case 'b': out += '\b'; break;
                case 'f': out += '\f'; break;
                case 'n': out += '\n'; break;
                case 'r': out += '\r'; break;
                case 't': out += '\t'; break;
                case 'u': {
                    uint32_t cp = hex4();
                    if (cp >= 0xD800 && cp < 0xDC00) {  // high surrogate: a low one must follow
                        if (n_ - i_ < 2 || p_[i_] != '\\' || p_[i_ + 1] != 'u') fail("lone surrogate");
                        i_ += 2;
                        const uint32_t lo = hex4();
                        if (lo < 0xDC00 || lo >= 0xE000) fail("bad surrogate pair");
                        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    }
                    put_utf8(out, cp);
                    break;
                }
                default: fail(std::string("bad escape \\") + e);
            }
        }
    }

    const char* p_;
    size_t n_;
    size_t i_ = 0;
};

}  // namespace

Value parse(const char* text, size_t size) { return Parser(text, size).document(); }

const Value& member(const Value& obj, const char* key, const std::string& where) {
    if (obj.kind != Kind::Object) throw std::invalid_argument(where + " must be an object");
    const Value* v = obj.find(key);
    if (!v) throw std::invalid_argument(where + ": missing '" + key + "'");
    return *v;
}

int64_t as_int(const Value& v, const std::string& what) {
    if (v.kind != Kind::Int) throw std::invalid_argument(what + " must be an integer");
    return v.integer;
}

double as_number(const Value& v, const std::string& what) {
    if (!v.is_number()) throw std::invalid_argument(what + " must be a number");
    return v.number();
}

bool as_bool(const Value& v, const std::string& what) {
    if (v.kind != Kind::Bool) throw std::invalid_argument(what + " must be true or false");
    return v.boolean;
}

const std::string& as_string(const Value& v, const std::string& what) {
    if (v.kind != Kind::String) throw std::invalid_argument(what + " must be a string");
    return v.str;
}

const std::vector<Value>& as_list(const Value& v, const std::string& what) {
    if (v.kind != Kind::Array) throw std::invalid_argument(what + " must be a list");
    return v.items;
}

namespace {
const Value* present(const Value& obj, const char* key, const std::string& where) {
    if (obj.kind != Kind::Object) throw std::invalid_argument(where + " must be an object");
    const Value* v = obj.find(key);
    return v && v->kind != Kind::Null ? v : nullptr;
}
}  // namespace

int64_t int_or(const Value& obj, const char* key, int64_t fallback, const std::string& where) {
    const Value* v = present(obj, key, where);
    return v ? as_int(*v, where + ": '" + key + "'") : fallback;
}

bool bool_or(const Value& obj, const char* key, bool fallback, const std::string& where) {
    const Value* v = present(obj, key, where);
    return v ? as_bool(*v, where + ": '" + key + "'") : fallback;
}

std::string string_or(const Value& obj, const char* key, const std::string& fallback, const std::string& where) {
    const Value* v = present(obj, key, where);
    return v ? as_string(*v, where + ": '" + key + "'") : fallback;
}

}  // namespace json
}  // namespace bessemer
