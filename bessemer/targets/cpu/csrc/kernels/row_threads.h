// How the build-time searches (int4_scale_search, int4_superblock_search, int4_output_search)
// spread a weight's rows over the cores.
#pragma once

#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

namespace bessemer {

// rows(begin, end) over [0, n) in contiguous ranges, one per thread (threads 0: one per core),
// the calling thread taking the first. Threads made for this call, not OpenMP's pool: the
// build runs tensor-parallel ranks in forked children, and libgomp's pool hangs in a child
// forked after the parent used it (a Python process that ran an engine, then builds). The
// searches' results for a row depend only on that row, so the split does not change them.
template <class Rows>
void run_row_ranges(int64_t n, int64_t threads, const Rows& rows) {
    const int64_t cores = threads > 0 ? threads : std::max<int64_t>(1, std::thread::hardware_concurrency());
    const int64_t workers = std::max<int64_t>(1, std::min<int64_t>(n, cores));
    std::vector<std::thread> pool;
    for (int64_t t = 1; t < workers; ++t) pool.emplace_back(rows, n * t / workers, n * (t + 1) / workers);
    rows(0, n / workers);
    for (auto& th : pool) th.join();
}

}  // namespace bessemer
