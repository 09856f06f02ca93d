#include "common/crc32c.h"

#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#define FD_CRC32C_X86 1
#endif

namespace flashdraft {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // reflected Castagnoli polynomial

struct Tables {
  uint32_t slice[8][256];
  Tables() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
      slice[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i) {
      for (int t = 1; t < 8; ++t) {
        slice[t][i] = (slice[t - 1][i] >> 8) ^ slice[0][slice[t - 1][i] & 0xFF];
      }
    }
  }
};

const Tables& GetTables() {
  static const Tables tables;
  return tables;
}

// Raw register update (no pre/post inversion), portable slicing-by-8.
uint32_t RawPortable(uint32_t crc, const uint8_t* p, size_t n) {
  const Tables& t = GetTables();
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    crc = (crc >> 8) ^ t.slice[0][(crc ^ *p++) & 0xFF];
    --n;
  }
  while (n >= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    word ^= crc;
    crc = t.slice[7][word & 0xFF] ^ t.slice[6][(word >> 8) & 0xFF] ^
          t.slice[5][(word >> 16) & 0xFF] ^ t.slice[4][(word >> 24) & 0xFF] ^
          t.slice[3][(word >> 32) & 0xFF] ^ t.slice[2][(word >> 40) & 0xFF] ^
          t.slice[1][(word >> 48) & 0xFF] ^ t.slice[0][word >> 56];
    p += 8;
    n -= 8;
  }
  while (n-- > 0) crc = (crc >> 8) ^ t.slice[0][(crc ^ *p++) & 0xFF];
  return crc;
}

#if FD_CRC32C_X86

// Three streams of kLong bytes run in parallel to hide the crc32 instruction's 3-cycle latency;
// their registers are merged with "shift by kLong zero bytes" operators, tabulated per CRC byte.
constexpr size_t kLong = 8192;
constexpr size_t kShort = 256;

struct ShiftTable {
  uint32_t t[4][256];
};

__attribute__((target("sse4.2"))) uint32_t RawZeros(uint32_t crc, size_t n) {
  uint64_t c = crc;
  for (size_t i = 0; i < n / 8; ++i) c = _mm_crc32_u64(c, 0);
  return static_cast<uint32_t>(c);
}

// Table for x -> register after feeding `n` zero bytes from state x (linear over GF(2)).
ShiftTable MakeShiftTable(size_t n) {
  uint32_t basis[32];
  for (int b = 0; b < 32; ++b) basis[b] = RawZeros(1u << b, n);
  ShiftTable table;
  for (int k = 0; k < 4; ++k) {
    for (uint32_t v = 0; v < 256; ++v) {
      uint32_t r = 0;
      for (int b = 0; b < 8; ++b) {
        if (v & (1u << b)) r ^= basis[8 * k + b];
      }
      table.t[k][v] = r;
    }
  }
  return table;
}

inline uint32_t Shift(const ShiftTable& s, uint32_t crc) {
  return s.t[0][crc & 0xFF] ^ s.t[1][(crc >> 8) & 0xFF] ^ s.t[2][(crc >> 16) & 0xFF] ^
         s.t[3][crc >> 24];
}

const ShiftTable& LongShift() {
  static const ShiftTable table = MakeShiftTable(kLong);
  return table;
}
const ShiftTable& ShortShift() {
  static const ShiftTable table = MakeShiftTable(kShort);
  return table;
}

// Reads p[off..off+8) into the register `c`; when copying, also writes it to dst[off..off+8).
template <bool kCopy>
__attribute__((target("sse4.2"), always_inline)) inline void Step8(uint64_t& c, const uint8_t* p,
                                                                   uint8_t* dst, size_t off) {
  uint64_t w;
  std::memcpy(&w, p + off, 8);
  if constexpr (kCopy) std::memcpy(dst + off, &w, 8);
  c = _mm_crc32_u64(c, w);
}

// Runs three interleaved streams over blocks of 3*len bytes while they last.
template <bool kCopy>
__attribute__((target("sse4.2"), always_inline)) inline void Blocks(uint64_t& c0, const uint8_t*& p,
                                                                    uint8_t*& dst, size_t& n,
                                                                    size_t len,
                                                                    const ShiftTable& shift) {
  while (n >= 3 * len) {
    uint64_t c1 = 0, c2 = 0;
    for (size_t i = 0; i < len; i += 8) {
      Step8<kCopy>(c0, p, dst, i);
      Step8<kCopy>(c1, p, dst, len + i);
      Step8<kCopy>(c2, p, dst, 2 * len + i);
    }
    c0 = Shift(shift, Shift(shift, static_cast<uint32_t>(c0)) ^ static_cast<uint32_t>(c1)) ^
         static_cast<uint32_t>(c2);
    p += 3 * len;
    if constexpr (kCopy) dst += 3 * len;
    n -= 3 * len;
  }
}

// kCopy: also store every word read to `dst`, so copy and checksum share one pass over memory.
// dst is null (and never offset) when not copying.
template <bool kCopy>
__attribute__((target("sse4.2"))) uint32_t RawHardware(uint32_t crc, uint8_t* dst, const uint8_t* p,
                                                       size_t n) {
  uint64_t c0 = crc;
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    if constexpr (kCopy) *dst++ = *p;
    c0 = _mm_crc32_u8(static_cast<uint32_t>(c0), *p++);
    --n;
  }
  Blocks<kCopy>(c0, p, dst, n, kLong, LongShift());
  Blocks<kCopy>(c0, p, dst, n, kShort, ShortShift());
  while (n >= 8) {
    Step8<kCopy>(c0, p, dst, 0);
    p += 8;
    if constexpr (kCopy) dst += 8;
    n -= 8;
  }
  while (n-- > 0) {
    if constexpr (kCopy) *dst++ = *p;
    c0 = _mm_crc32_u8(static_cast<uint32_t>(c0), *p++);
  }
  return static_cast<uint32_t>(c0);
}

bool DetectHardware() { return __builtin_cpu_supports("sse4.2"); }
#else
bool DetectHardware() { return false; }
#endif

const bool kHardware = DetectHardware();

}  // namespace

uint32_t Crc32cExtendPortable(uint32_t crc, const void* data, size_t n) {
  return ~RawPortable(~crc, static_cast<const uint8_t*>(data), n);
}

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n) {
#if FD_CRC32C_X86
  if (kHardware) {
    return ~RawHardware<false>(~crc, nullptr, static_cast<const uint8_t*>(data), n);
  }
#endif
  return Crc32cExtendPortable(crc, data, n);
}

uint32_t Crc32cCopy(uint32_t crc, void* dst, const void* src, size_t n) {
#if FD_CRC32C_X86
  if (kHardware) {
    return ~RawHardware<true>(~crc, static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src),
                              n);
  }
#endif
  if (n > 0) std::memcpy(dst, src, n);
  return Crc32cExtendPortable(crc, dst, n);
}

bool Crc32cHardwareAccelerated() { return kHardware; }

}  // namespace flashdraft
