// Read-only mmap of a rank file (see format/container.py for the layout).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "format.h"

namespace bessemer {

// Raised for operating-system failures (open/stat/mmap); carries errno and the path so the
// binding can raise the matching OSError subclass (FileNotFoundError, PermissionError, ...).
struct OsError : std::runtime_error {
    OsError(int err_, const std::string& path_, const std::string& what)
        : std::runtime_error(what), err(err_), path(path_) {}
    int err;
    std::string path;
};

// Opens any format version (so tools can read the header of a newer file); every target's
// executor calls check_format_version() first.

class EngineFile {
   public:
    explicit EngineFile(const std::string& path);  // throws std::invalid_argument / runtime_error
    ~EngineFile();
    EngineFile(const EngineFile&) = delete;
    EngineFile& operator=(const EngineFile&) = delete;

    const std::string& path() const { return path_; }
    int format_major() const { return major_; }
    int format_minor() const { return minor_; }
    uint64_t size() const { return size_; }
    uint64_t data_offset() const { return data_offset_; }
    const char* header_ptr() const { return base_ + 24; }
    uint64_t header_len() const { return header_len_; }
    const uint8_t* data() const { return reinterpret_cast<const uint8_t*>(base_); }

   private:
    std::string path_;
    const char* base_ = nullptr;
    uint64_t size_ = 0, header_len_ = 0, data_offset_ = 0;
    int major_ = 0, minor_ = 0;
};

// Throws std::invalid_argument naming both versions when the file's format major is not
// kFormatMajor (format.h): the one version rule of every executor.
void check_format_version(const EngineFile& file);

}  // namespace bessemer
