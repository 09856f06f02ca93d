// glibc malloc settings for processes that receive tensors at GB/s and train on them. gRPC
// allocates a fresh buffer for every socket read and frees it once the chunk is assembled, and a
// drafter step allocates and frees its loss's logit buffer (155 MB at Qwen3's vocabulary);
// with glibc's defaults such blocks are mmap'ed and returned to the kernel, so every one is
// page-faulted and zeroed again (≈ 20% of the receive path's cycles, measured with perf in
// bench/stream_bench; 14% of a real-shape drafter step in bench/drafter_step_bench). Keeping blocks
// up to 256 MiB in the heap and trimming only past 512 MiB free lets them be reused.
#pragma once

#include <malloc.h>

namespace flashdraft {

inline void TuneMallocForStreaming() {
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
}

}  // namespace flashdraft
