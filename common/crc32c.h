// CRC-32C (Castagnoli), as used by the wire codec and checkpoints. Uses the SSE4.2 crc32
// instruction with three interleaved streams when the CPU has it, a slicing-by-8 table otherwise.
#pragma once

#include <cstddef>
#include <cstdint>

namespace flashdraft {

// Extends `crc` (the CRC of the bytes before `data`; 0 for none) over `n` bytes.
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n);

inline uint32_t Crc32c(const void* data, size_t n) { return Crc32cExtend(0, data, n); }

// Copies `n` bytes from `src` to `dst` and returns the CRC extension over them, in one pass.
uint32_t Crc32cCopy(uint32_t crc, void* dst, const void* src, size_t n);

// The portable implementation, always available; exposed for tests.
uint32_t Crc32cExtendPortable(uint32_t crc, const void* data, size_t n);

// True when the hardware path is in use.
bool Crc32cHardwareAccelerated();

}  // namespace flashdraft
