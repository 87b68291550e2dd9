#include "rank_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace bessemer {

namespace {
constexpr uint64_t kPreamble = kPreambleBytes;

template <typename T>
T read_le(const char* p) {
    T v;
    std::memcpy(&v, p, sizeof(T));  // x86: little-endian
    return v;
}
}  // namespace

EngineFile::EngineFile(const std::string& path) : path_(path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        throw OsError(e, path, path + ": cannot open: " + std::strerror(e));
    }
    struct stat st;
    if (::fstat(fd, &st) != 0) {
        int e = errno;
        ::close(fd);
        throw OsError(e, path, path + ": cannot stat: " + std::strerror(e));
    }
    size_ = uint64_t(st.st_size);
    if (size_ < kPreamble) {
        ::close(fd);
        throw std::invalid_argument(path + ": file too short (" + std::to_string(size_) +
                                    " bytes) to be an engine");
    }
    void* m = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    int e = errno;
    ::close(fd);
    if (m == MAP_FAILED) throw OsError(e, path, path + ": mmap failed: " + std::strerror(e));
    base_ = static_cast<const char*>(m);
    try {
        if (std::memcmp(base_, kEngineMagic, 8) != 0)
            throw std::invalid_argument(path + ": not a Bessemer engine file (bad magic)");
        major_ = read_le<uint16_t>(base_ + 8);
        minor_ = read_le<uint16_t>(base_ + 10);
        header_len_ = read_le<uint64_t>(base_ + 16);
        if (header_len_ > size_ - kPreamble)
            throw std::invalid_argument(path + ": header length " + std::to_string(header_len_) +
                                        " runs past the end of the file (" + std::to_string(size_) +
                                        " bytes)");
        data_offset_ = (kPreamble + header_len_ + kDataAlign - 1) / kDataAlign * kDataAlign;
        if (data_offset_ > size_)
            throw std::invalid_argument(path + ": data offset " + std::to_string(data_offset_) +
                                        " is past the end of the file (" + std::to_string(size_) +
                                        " bytes)");
    } catch (...) {
        ::munmap(const_cast<char*>(base_), size_);
        base_ = nullptr;
        throw;
    }
}

EngineFile::~EngineFile() {
    if (base_) ::munmap(const_cast<char*>(base_), size_);
}

void check_format_version(const EngineFile& file) {
    if (file.format_major() != kFormatMajor)
        throw std::invalid_argument(file.path() + ": unsupported format version " +
                                    std::to_string(file.format_major()) + "." + std::to_string(file.format_minor()) +
                                    " (this runtime reads " + std::to_string(kFormatMajor) + ".x)");
}

}  // namespace bessemer
