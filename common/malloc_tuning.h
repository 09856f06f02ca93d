// glibc malloc settings for processes that receive tensors at GB/s. gRPC allocates a fresh buffer
// for every socket read and frees it once the chunk is assembled; with glibc's defaults large
// blocks are mmap'ed and returned to the kernel, so every one is page-faulted and zeroed again
// (≈ 20% of the receive path's cycles, measured with perf in bench/stream_bench). Keeping blocks up
// to 64 MiB in the heap and trimming only past 512 MiB free lets them be reused.
#pragma once

#include <malloc.h>

namespace flashdraft {

inline void TuneMallocForStreaming() {
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
}

}  // namespace flashdraft
